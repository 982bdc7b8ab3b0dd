// Per-phase timing of a forward pass (prefill's report): GEMMs, FA, GDN, communication wait, other.
//
// Scopes are exclusive by construction (callers never nest them). On the GPU a scope records two
// events on the current stream; the phases' times are the sums of event intervals, read once at the
// end (finish), so timing adds no host synchronisation inside the pass. On the CPU a scope reads the
// steady clock. The communication phase is the time the compute stream was blocked waiting for a
// transfer or a collective (exposed communication), not the transfer's duration.
#pragma once

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "runtime/dtype.h"

namespace hydra {

enum class Phase { gemm, fa, gdn, comm, other, count };
const char* phase_name(Phase phase);

class PhaseTimer {
 public:
  explicit PhaseTimer(Device device);
  ~PhaseTimer();
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;

  void begin(Phase phase);
  void end(Phase phase);
  // Waits for the recorded work and returns seconds per phase (index = Phase); resets the timer.
  std::array<double, static_cast<size_t>(Phase::count)> finish();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// RAII scope; a null timer makes it free.
class ScopedPhase {
 public:
  ScopedPhase(PhaseTimer* timer, Phase phase) : timer_(timer), phase_(phase) {
    if (timer_) timer_->begin(phase_);
  }
  ~ScopedPhase() {
    if (timer_) timer_->end(phase_);
  }
  ScopedPhase(const ScopedPhase&) = delete;
  ScopedPhase& operator=(const ScopedPhase&) = delete;

 private:
  PhaseTimer* timer_;
  Phase phase_;
};

}  // namespace hydra
