// A world of P ranks as one of them sees it in a shape-only run (runtime/memory_timeline.h): the
// memory plans (model/memory_plan.h) run a pass of rank `rank` of `size` in one process, and every
// buffer a collective touches is a meta tensor, so a collective has nothing to move and returns at
// once. Only the collectives a pass makes are here; the rest (text messages, splits, point-to-point
// helpers) are no part of a pass and are refused.
#pragma once

#include <memory>
#include <string>

#include "parallel/communicator.h"

namespace hydra {

class PlanWorld final : public Communicator {
 public:
  PlanWorld(int size, int rank, Device device) : size_(size), rank_(rank), device_(device) {
    HYDRA_ASSERT(size >= 1 && rank >= 0 && rank < size, "a plan's world: rank {} of {}", rank, size);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Device device() const override { return device_; }
  std::string name() const override { return "plan"; }
  std::unique_ptr<Transfer> start_send_recv(const TensorView& send, int, const TensorView& recv, int) override {
    expect_meta(send, recv);
    return std::make_unique<Done>();
  }
  void all_gather(const TensorView& send, const TensorView& recv) override { expect_meta(send, recv); }
  void all_reduce_sum(const TensorView& buffer) override { expect_meta(buffer, buffer); }
  void reduce_scatter_sum(const TensorView& send, const TensorView& recv) override { expect_meta(send, recv); }
  void broadcast(const TensorView& buffer, int) override { expect_meta(buffer, buffer); }
  void barrier() override {}
  std::unique_ptr<Communicator> split(int, int) override { refuse("split"); }
  std::vector<std::string> gather_text(const std::string&, double, const std::string&) override { refuse("gather_text"); }
  std::string broadcast_text(const std::string&, double, const std::string&) override { refuse("broadcast_text"); }
  [[noreturn]] void abort(int) override { refuse("abort"); }
  void send(const TensorView&, int) override { refuse("send"); }
  void recv(const TensorView&, int) override { refuse("recv"); }

 private:
  struct Done final : Transfer {
    void wait() override {}
  };
  static void expect_meta(const TensorView& a, const TensorView& b) {
    HYDRA_ASSERT(a.is_meta() && b.is_meta(), "a plan's collective on a tensor with elements (outside a shape-only run?)");
  }
  [[noreturn]] static void refuse(const char* what) {
    detail::fail_statement("PlanWorld", __FILE__, __LINE__, fmt::format("{} is no part of a pass: not in a plan's world", what));
  }
  int size_, rank_;
  Device device_;
};

}  // namespace hydra
