// Tensor storage for a step that repeats (a decode step, DESIGN.md §1.6): between begin() and end()
// of a StepArena, every tensor this thread allocates (runtime/tensor.h allocate_storage) takes the
// arena's next block in allocation order instead of a new one. The first step allocates the blocks
// (and keeps them); a later step whose n-th allocation fits the n-th block (same device, no more
// bytes) reuses it, so a steady step allocates nothing, and the same code asks for the same
// addresses every step, which is what a CUDA graph captured from that step replays (PyTorch's graph
// capture keeps a private memory pool for the same reason). An allocation that does not fit (a
// larger batch, a new code path) gets a fresh block that replaces the old one and is counted.
//
// The contract of a caller: a tensor allocated inside a step is dead (or copied out) before the
// next step begins, because its block is handed out again. Blocks are never shared within a step.
// One arena is active per thread at a time; arenas do not nest.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "runtime/tensor.h"

namespace hydra {

class StepArena {
 public:
  StepArena() = default;
  StepArena(const StepArena&) = delete;
  StepArena& operator=(const StepArena&) = delete;
  ~StepArena();

  void begin();  // this thread's allocations come from the arena until end()
  void end();
  // Fresh blocks the last (or current) step allocated: 0 for a step that reused every block.
  size_t fresh_blocks() const { return fresh_; }
  size_t blocks() const { return blocks_.size(); }
  double bytes() const;  // held by the arena's blocks

  // The arena active on this thread (nullptr when none): allocate_storage asks it first.
  static StepArena* active();
  std::shared_ptr<void> take(size_t bytes, Device device);

 private:
  struct Block {
    std::shared_ptr<void> storage;
    size_t bytes = 0;
    Device device = Device::host;
  };
  std::vector<Block> blocks_;
  size_t next_ = 0, fresh_ = 0;
  bool open_ = false;
};

// Sets this thread's active arena aside for a scope (restored after): for host work inside a step
// that is not part of what a graph of the step replays (runtime/cuda_graph.h CudaGraph::outside: the
// eager step runs it inline, the captured step defers it to every launch). Its allocations must not
// take arena blocks, or the eager step's n-th allocation is not the captured step's n-th, and the
// capture replaces blocks (a free inside the capture, which CUDA refuses).
class StepArenaPause {
 public:
  StepArenaPause();
  ~StepArenaPause();
  StepArenaPause(const StepArenaPause&) = delete;
  StepArenaPause& operator=(const StepArenaPause&) = delete;

 private:
  StepArena* paused_;
};

// begin() … end() of `arena` for a scope (end() also when the step throws).
class StepArenaScope {
 public:
  explicit StepArenaScope(StepArena& arena) : arena_(arena) { arena_.begin(); }
  ~StepArenaScope() { arena_.end(); }
  StepArenaScope(const StepArenaScope&) = delete;
  StepArenaScope& operator=(const StepArenaScope&) = delete;

 private:
  StepArena& arena_;
};

}  // namespace hydra
