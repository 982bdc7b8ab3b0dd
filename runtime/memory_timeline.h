// Live bytes over a pass, and the shape-only run that records them: how the memory plans
// (model/memory_plan.h) are derived from the passes themselves rather than from a description kept
// beside them (after llm.c, whose activation table is both the allocation and the memory count).
//
// MemoryTimeline: hold() what is allocated, release() what is freed; the peak, where it was reached
// ("stage: buffer") and each part's bytes then (MemoryPart; they add up to the peak). Bytes are
// rounded as the device's allocator rounds them (allocated_bytes).
//
// ShapeOnlyRun: while one is active on a thread, every tensor allocated on that thread
// (runtime/tensor.h allocate_storage) is a meta tensor — a shape and element type over no elements
// (TensorView::is_meta) — whose bytes are held on the run's timeline from its allocation until its
// last handle goes, when it lives on the timeline's device (a host copy made during a GPU plan holds
// no GPU memory and counts nothing). Ops given a meta view compute nothing (kernels/common.h
// shapes_only; an op whose GPU launcher allocates workspaces holds them from the launcher's own
// spec), copies and fills do nothing, collectives are a PlanWorld's (parallel/plan_world.h), no fault
// is injected and the GPU branches run one after the other. So a pass runs its own code — its own
// buffers, in its own order, each freed where its last handle goes — and the timeline is what it
// holds; a buffer added to a pass is in the plan by being allocated. The few places that read a
// tensor's elements on the host check is_meta() first (document bounds, positions, the loss head's
// sums). Runs do not nest, and a step arena (runtime/step_arena.h) is not used inside one.
#pragma once

#include <array>
#include <cstddef>
#include <memory>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "runtime/dtype.h"
#include "runtime/memory_label.h"

namespace hydra {

using MemoryParts = std::array<double, kMemoryPartCount>;  // bytes, indexed by MemoryPart

// A buffer of `bytes` as the device's allocator holds it: host, 64-byte blocks and at least one
// (runtime/tensor.cpp allocate_storage); cuda, 256-byte blocks (runtime/cuda_memory.cu). Negative: no buffer.
double allocated_bytes(Device device, double bytes);

class MemoryTimeline {
 public:
  using Id = size_t;
  explicit MemoryTimeline(Device device);
  Id hold(double bytes, MemoryLabel label);  // rounded by allocated_bytes
  void release(Id id);
  void set_stage(std::string stage);         // what the holds after it belong to ("layer 3 backward")
  Device device() const;
  double live() const;
  double peak() const;
  double held_total() const;  // every hold's bytes added up, released or not: what a step arena would hold
  const MemoryParts& peak_parts() const;  // each part's bytes at the peak; they sum to peak()
  const std::string& peak_at() const;     // "layer 27 backward: d_conv"
  int64_t unnamed() const;                // holds whose label had no name (every buffer of a pass is named)
  // Storage for a meta tensor of `bytes` on `device` (a ShapeOnlyRun's allocation): held from now
  // until its last handle goes, if `device` is the timeline's; the timeline may go first.
  std::shared_ptr<void> meta_storage(size_t bytes, Device device, MemoryLabel label);

 private:
  struct State;
  std::shared_ptr<State> state_;
};

class ShapeOnlyRun {
 public:
  explicit ShapeOnlyRun(MemoryTimeline& timeline);
  ~ShapeOnlyRun();
  ShapeOnlyRun(const ShapeOnlyRun&) = delete;
  ShapeOnlyRun& operator=(const ShapeOnlyRun&) = delete;
  static MemoryTimeline* active();  // this thread's, or null
};

// Names the stage of a pass that the allocations after it belong to, when a shape-only run records
// it (what a plan's peak reports); nothing otherwise (the text is not even formatted).
template <class... Args>
void memory_stage(fmt::format_string<Args...> format, Args&&... args) {
  if (MemoryTimeline* timeline = ShapeOnlyRun::active()) {
    timeline->set_stage(fmt::format(format, std::forward<Args>(args)...));
  }
}

}  // namespace hydra
