// A timed long-context prefill (what `hydra prefill` measures, callable from tests): the model runs
// forward over one sequence spread over the ranks of `comm` in the zigzag layout, `warmup` untimed
// and `repeat` timed times, with per-phase times of the last timed run (GEMMs, FA, GDN, exposed
// communication, other), and only the last position's logits are formed (never [T, vocab]).
// Collective over `comm`; every rank returns the same times (a barrier closes each run). Non-finite
// logits at the last position end the run on every rank with a UserError naming the first stage of
// the forward that turned non-finite (model/nonfinite.h).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "model/model.h"
#include "runtime/phase_timer.h"

namespace hydra {

struct PrefillRun {
  int warmup = 0;
  int repeat = 1;
  bool progress = false;                  // a log line per layer of each timed run (rank 0)
  std::function<void()> check_progress;   // called after every layer (the NCCL watchdog), optional
};

struct PrefillResult {
  std::vector<double> seconds;                                  // each timed run, wall clock
  std::array<double, static_cast<size_t>(Phase::count)> phases{};  // rank 0's last timed run
  int32_t last_token = -1;  // arg-max at the last position (rank 0; −1 elsewhere)
  float last_logit = 0;
  double best() const;
};

// The pass a prefill runs (timed_prefill; the memory plan runs it shape-only, model/memory_plan.h):
// the forward over this rank's rows `ids` [T_loc] int32 and, on rank 0 (whose last local row is the
// sequence's last position), that position's logits read back to the host: [1, V] f32 (undefined on
// the other ranks).
Tensor prefill_last_logits(ForwardContext& context, const Model& model, const TensorView& ids);

// `sequence`: the whole token sequence (identical on every rank); each rank runs its own rows of it.
PrefillResult timed_prefill(Communicator& comm, const SequenceLayout& layout, const Model& model,
                            std::span<const int32_t> sequence, const PrefillRun& run);

// Random token ids of a sequence: position i gets bits(seed, "tokens", i) mod vocab, so every rank
// draws its own rows of the same sequence without communication.
std::vector<int32_t> random_token_sequence(int64_t length, int64_t vocab, uint64_t seed);

}  // namespace hydra
