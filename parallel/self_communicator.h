// The communicator of a world of one process, without MPI: sends to oneself are copies and
// collectives are identities. For library use and unit tests that run the model in one process
// without initialising MPI; `hydra` itself always goes through MpiCommunicator (a singleton MPI
// world when started without mpirun), so the code path is the same either way.
#pragma once

#include <cstdio>
#include <cstdlib>

#include "parallel/communicator.h"

namespace hydra {

class SelfCommunicator final : public Communicator {
 public:
  explicit SelfCommunicator(Device device = Device::host) : device_(device) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  Device device() const override { return device_; }
  std::string name() const override { return "self"; }
  std::unique_ptr<Transfer> start_send_recv(const TensorView& send, int dst, const TensorView& recv,
                                            int src) override {
    HYDRA_ASSERT(dst == 0 && src == 0, "send/recv with rank {}/{} in a world of one", dst, src);
    copy_into(recv, send);
    return std::make_unique<Done>();
  }
  void all_gather(const TensorView& send, const TensorView& recv) override {
    copy_into(recv.reshape({-1}), send.reshape({-1}));
  }
  void all_reduce_sum(const TensorView&) override {}
  void reduce_scatter_sum(const TensorView& send, const TensorView& recv) override {
    copy_into(recv.reshape({-1}), send.reshape({-1}));
  }
  void broadcast(const TensorView&, int root) override { HYDRA_ASSERT(root == 0, "broadcast from rank {}", root); }
  void barrier() override {}
  std::unique_ptr<Communicator> split(int, int) override { return std::make_unique<SelfCommunicator>(device_); }
  std::vector<std::string> gather_text(const std::string& text, double, const std::string&) override { return {text}; }
  std::string broadcast_text(const std::string& text, double, const std::string&) override { return text; }
  [[noreturn]] void abort(int exit_code) override {
    std::fflush(nullptr);
    std::_Exit(exit_code);
  }
  void send(const TensorView&, int dst) override { HYDRA_ASSERT(false, "send to rank {} in a world of one", dst); }
  void recv(const TensorView&, int src) override { HYDRA_ASSERT(false, "recv from rank {} in a world of one", src); }

 private:
  struct Done final : Transfer {
    void wait() override {}
  };
  Device device_;
};

}  // namespace hydra
