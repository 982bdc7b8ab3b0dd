// Device-to-host reads that do not wait when they are queued: a training step's results (its loss
// sums and its update's gradient norm) read one step late, so the host queues the next step while
// the GPU still runs this one (model/train/fixed_step.h, DESIGN.md §1.5 "The step as a CUDA graph").
//
// `slots` pinned host buffers of `bytes` each. queue(slot, src) queues a copy of the device tensor
// into the slot on this thread's current stream, behind everything queued there before, and records
// an event after it; wait(slot) blocks until that event and returns the slot's bytes. A slot must be
// waited for before it is queued again (the caller's double buffering: slot = step % 2). Host
// tensors (the CPU) are copied at once and wait() returns at once. Nothing here may run inside a
// CUDA graph capture (the copy would be recorded, the event would not be this one).
#pragma once

#include <cstddef>
#include <vector>

#include "runtime/tensor.h"

namespace hydra {

class HostReadback {
 public:
  HostReadback(size_t bytes, int slots);
  ~HostReadback();
  HostReadback(const HostReadback&) = delete;
  HostReadback& operator=(const HostReadback&) = delete;

  // src: contiguous, `bytes` long, on the host or the GPU.
  void queue(int slot, const TensorView& src);
  // Waits for the slot's last queued copy; its bytes stay valid until the slot is queued again.
  const void* wait(int slot);
  // Whether the slot holds a copy that wait() has not returned yet.
  bool pending(int slot) const { return pending_[static_cast<size_t>(slot)]; }

 private:
  size_t bytes_;
  std::vector<void*> host_;     // pinned on a CUDA build (ordinary memory otherwise)
  std::vector<void*> events_;   // cudaEvent_t per slot (CUDA builds)
  std::vector<bool> pending_;
  std::vector<bool> pinned_;    // whether host_[i] came from cudaHostAlloc
};

}  // namespace hydra
