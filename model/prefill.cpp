#include "model/prefill.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "model/nonfinite.h"
#include "runtime/log.h"
#include "runtime/memory_timeline.h"
#include "runtime/random.h"

namespace hydra {

double PrefillResult::best() const { return seconds.empty() ? 0.0 : *std::min_element(seconds.begin(), seconds.end()); }

std::vector<int32_t> random_token_sequence(int64_t length, int64_t vocab, uint64_t seed) {
  const RandomStream rng{seed, hash_name("tokens")};
  std::vector<int32_t> ids(static_cast<size_t>(length));
  for (int64_t i = 0; i < length; ++i) ids[static_cast<size_t>(i)] = static_cast<int32_t>(rng.bits(static_cast<uint64_t>(i)) % vocab);
  return ids;
}

Tensor prefill_last_logits(ForwardContext& context, const Model& model, const TensorView& ids) {
  const Tensor hidden = model.forward(context, ids);
  // The last position (global T−1) lives in rank 0's last local row (its second segment).
  if (context.comm.rank() != 0) return Tensor();
  memory_stage("last logits");
  Tensor logits = Tensor::empty({1, model.config().vocab_size}, DType::f32, model.device(),
                                {MemoryPart::workspaces, "last position's logits"});
  model.lm_head(logits, hidden.view().narrow(0, hidden.size(0) - 1, 1));
  return to(logits, Device::host, DType::f32, {MemoryPart::workspaces, "logits read back"});
}

PrefillResult timed_prefill(Communicator& comm, const SequenceLayout& layout, const Model& model,
                            std::span<const int32_t> sequence, const PrefillRun& run) {
  const ModelConfig& config = model.config();
  const Tensor ids = layout.token_rows(sequence).ids;
  PrefillResult result;
  for (int i = 0; i < run.warmup + run.repeat; ++i) {
    const bool timed = i >= run.warmup;
    PhaseTimer timer(model.device());
    ForwardContext context{.comm = comm, .layout = layout, .timer = timed ? &timer : nullptr};
    comm.barrier();
    const auto start = std::chrono::steady_clock::now();
    context.after_layer = [&](int64_t layer) {
      if (run.check_progress) run.check_progress();
      if (run.progress && timed) {
        log::info("  layer {:>3}/{}: {:.2f} s", layer + 1, config.num_layers,
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      }
    };
    const Tensor h = prefill_last_logits(context, model, ids);
    if (comm.rank() == 0) {
      const float* row = h.data_as<float>();
      result.last_token = static_cast<int32_t>(std::max_element(row, row + config.vocab_size) - row);
      result.last_logit = row[result.last_token];
      if (!std::all_of(row, row + config.vocab_size, [](float v) { return std::isfinite(v); })) result.last_logit = NAN;
    }
    // Rank 0's verdict to every rank, so that all of them take the same branch (the search is collective).
    Tensor nonfinite = Tensor::zeros({1}, DType::f32);
    if (comm.rank() == 0) nonfinite.data_as<float>()[0] = std::isfinite(result.last_logit) ? 0.0f : 1.0f;
    all_reduce_sum_host(comm, nonfinite);
    if (nonfinite.data_as<float>()[0] > 0) fail_nonfinite(model, comm, sequence, "prefill: the logits at the last position are");
    if (run.check_progress) run.check_progress();
    comm.barrier();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (timed) {
      result.seconds.push_back(seconds);
      result.phases = timer.finish();
      log::info("prefill {}/{}: {:.3f} s ({:.0f} tokens/s)", i - run.warmup + 1, run.repeat, seconds,
                static_cast<double>(layout.total_length()) / seconds);
    }
  }
  return result;
}

}  // namespace hydra
