#include "runtime/step_arena.h"

#include "runtime/error.h"

namespace hydra {
namespace {
thread_local StepArena* t_active = nullptr;
}  // namespace

StepArena::~StepArena() {
  if (t_active == this) t_active = nullptr;
}

StepArena* StepArena::active() { return t_active; }

StepArenaPause::StepArenaPause() : paused_(t_active) { t_active = nullptr; }
StepArenaPause::~StepArenaPause() { t_active = paused_; }

void StepArena::begin() {
  HYDRA_ASSERT(t_active == nullptr && !open_, "a step arena begins while another is active on this thread");
  t_active = this;
  open_ = true;
  next_ = 0;
  fresh_ = 0;
}

void StepArena::end() {
  HYDRA_ASSERT(t_active == this && open_, "a step arena ends without having begun");
  t_active = nullptr;
  open_ = false;
}

double StepArena::bytes() const {
  double total = 0;
  for (const Block& b : blocks_) total += static_cast<double>(b.bytes);
  return total;
}

std::shared_ptr<void> StepArena::take(size_t bytes, Device device) {
  const size_t n = next_++;
  if (n < blocks_.size() && blocks_[n].device == device && blocks_[n].bytes >= bytes) return blocks_[n].storage;
  // A fresh block, allocated with the arena set aside (the allocator must not come back here).
  Block block;
  {
    const StepArenaPause set_aside;
    block = Block{allocate_storage(bytes, device), bytes, device};
  }
  ++fresh_;
  if (n < blocks_.size()) {
    blocks_[n] = std::move(block);
  } else {
    blocks_.push_back(std::move(block));
  }
  return blocks_[n].storage;
}

}  // namespace hydra
