// NCCL implementation of the communicator: one GPU per rank, bootstrapped over MPI (rank 0 makes
// the unique id and broadcasts it).
//
// Streams and ordering: every NCCL operation runs on the communicator's own stream. Before it
// starts, that stream waits (event) for the caller's current stream, so buffers written by earlier
// kernels are complete; collectives then make the current stream wait for the NCCL stream, and a
// send/recv returns a Transfer whose wait() does so later — the host never blocks, and compute
// queued between start and wait overlaps the transfer.
// Failures: NCCL errors become exceptions (HYDRA_NCCL_CHECK). A hang (a dead peer) is caught by
// check_progress(), called at host synchronisation points: it polls the pending work and the
// communicator's async error, and after `timeout_seconds` aborts the communicator and throws,
// which ends the job through MPI_Abort.
#pragma once

#include <memory>

#include "parallel/communicator.h"
#include "parallel/mpi_communicator.h"
#include "runtime/cuda_memory.h"

namespace hydra {

class NcclCommunicator final : public Communicator {
 public:
  // Collective over `bootstrap` (same ranks); the caller has selected this rank's GPU.
  NcclCommunicator(Communicator& bootstrap, double timeout_seconds);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Device device() const override { return Device::cuda; }
  std::string name() const override { return "nccl"; }
  std::unique_ptr<Transfer> start_send_recv(const TensorView& send, int dst, const TensorView& recv,
                                            int src) override;
  void all_gather(const TensorView& send, const TensorView& recv) override;
  void all_reduce_sum(const TensorView& buffer) override;
  void reduce_scatter_sum(const TensorView& send, const TensorView& recv) override;
  void broadcast(const TensorView& buffer, int root) override;
  void barrier() override;
  // A new NCCL communicator bootstrapped over the split of this one's bootstrap (which it owns).
  std::unique_ptr<Communicator> split(int color, int key) override;
  // Host messages go over the bootstrap (MPI), outside NCCL's watchdog.
  std::vector<std::string> gather_text(const std::string& text, double timeout_s, const std::string& what) override {
    return bootstrap_.gather_text(text, timeout_s, what);
  }
  std::string broadcast_text(const std::string& text, double timeout_s, const std::string& what) override {
    return bootstrap_.broadcast_text(text, timeout_s, what);
  }
  [[noreturn]] void abort(int exit_code) override;
  void send(const TensorView& buffer, int dst) override;
  void recv(const TensorView& buffer, int src) override;

  // Blocks until all queued device work (compute and NCCL) has finished, surfacing NCCL errors and
  // timeouts as exceptions.
  void check_progress() override;
  cudaStream_t stream() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::unique_ptr<Communicator> owned_bootstrap_;  // the split bootstrap of a split() communicator
  Communicator& bootstrap_;
  int rank_ = 0, size_ = 1;
};

}  // namespace hydra
