#include "runtime/phase_timer.h"

#include <chrono>

#include "runtime/error.h"
#if HYDRA_CUDA
#include "runtime/cuda_memory.h"
#endif

namespace hydra {

const char* phase_name(Phase phase) {
  switch (phase) {
    case Phase::gemm: return "gemm";
    case Phase::fa: return "fa";
    case Phase::gdn: return "gdn";
    case Phase::comm: return "comm";
    case Phase::other: return "other";
    case Phase::count: break;
  }
  return "?";
}

struct PhaseTimer::Impl {
  Device device;
  std::array<double, static_cast<size_t>(Phase::count)> host_seconds{};
  std::chrono::steady_clock::time_point host_start;
#if HYDRA_CUDA
  struct Interval {
    Phase phase;
    std::unique_ptr<CudaEvent> start, stop;
  };
  std::vector<Interval> intervals;
#endif
};

PhaseTimer::PhaseTimer(Device device) : impl_(std::make_unique<Impl>()) { impl_->device = device; }
PhaseTimer::~PhaseTimer() = default;

void PhaseTimer::begin(Phase phase) {
  if (impl_->device == Device::host) {
    impl_->host_start = std::chrono::steady_clock::now();
    return;
  }
#if HYDRA_CUDA
  Impl::Interval interval{phase, std::make_unique<CudaEvent>(true), std::make_unique<CudaEvent>(true)};
  interval.start->record(current_stream());
  impl_->intervals.push_back(std::move(interval));
#endif
}

void PhaseTimer::end(Phase phase) {
  if (impl_->device == Device::host) {
    impl_->host_seconds[static_cast<size_t>(phase)] +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - impl_->host_start).count();
    return;
  }
#if HYDRA_CUDA
  HYDRA_ASSERT(!impl_->intervals.empty() && impl_->intervals.back().phase == phase, "unbalanced phase scopes");
  impl_->intervals.back().stop->record(current_stream());
#endif
}

std::array<double, static_cast<size_t>(Phase::count)> PhaseTimer::finish() {
  std::array<double, static_cast<size_t>(Phase::count)> out = impl_->host_seconds;
#if HYDRA_CUDA
  for (Impl::Interval& i : impl_->intervals) {
    i.stop->synchronize();
    out[static_cast<size_t>(i.phase)] += i.stop->elapsed_ms_since(*i.start) / 1000.0;
  }
  impl_->intervals.clear();
#endif
  impl_->host_seconds = {};
  return out;
}

}  // namespace hydra
