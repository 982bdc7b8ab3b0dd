// The decode engine (model/decode_engine.h) on the CPU: after the first step of a batch size a step
// allocates no tensor (the host tensor counter of runtime/host_memory.h and the arena's own count),
// a smaller batch reuses the blocks too, and the engine's steps give the logits of a full forward
// over the same tokens (decode equals recompute). The step arena's rules on their own: the n-th
// allocation of a step takes the n-th block when it fits, a larger one gets a fresh block.
#include <numeric>

#include "model/decode_engine.h"
#include "model/params.h"
#include "parallel/self_communicator.h"
#include "runtime/cuda_graph.h"
#include "runtime/host_memory.h"
#include "runtime/step_arena.h"
#include "tests/common/test_util.h"

namespace hydra::test {
namespace {

TEST(StepArena, ReusesBlocksInAllocationOrderAndReplacesWhatDoesNotFit) {
  StepArena arena;
  std::vector<void*> first;
  {
    StepArenaScope scope(arena);
    first.push_back(Tensor::empty({16}, DType::f32).data());
    first.push_back(Tensor::empty({4}, DType::i32).data());
  }
  EXPECT_EQ(arena.fresh_blocks(), 2u);
  EXPECT_NE(first[0], first[1]) << "blocks are never shared within a step";
  const size_t allocations = host_tensor_stats().allocations;
  {
    StepArenaScope scope(arena);
    EXPECT_EQ(Tensor::empty({8}, DType::f32).data(), first[0]) << "a smaller tensor fits the first block";
    EXPECT_EQ(Tensor::empty({4}, DType::i32).data(), first[1]);
  }
  EXPECT_EQ(arena.fresh_blocks(), 0u);
  EXPECT_EQ(host_tensor_stats().allocations, allocations);
  {
    StepArenaScope scope(arena);
    EXPECT_EQ(Tensor::empty({16}, DType::f32).data(), first[0]);
    (void)Tensor::empty({64}, DType::i32);  // larger than the second block
    (void)Tensor::empty({1}, DType::f32);   // a third allocation
  }
  EXPECT_EQ(arena.fresh_blocks(), 2u);
  EXPECT_EQ(arena.blocks(), 3u);
  EXPECT_EQ(host_tensor_stats().allocations, allocations + 2);
  // Outside a step, allocation is ordinary again.
  EXPECT_NE(Tensor::empty({16}, DType::f32).data(), first[0]);
}

// Host work between the segments of a step (CudaGraph::outside: run inline by an eager step, deferred
// to every launch by a captured one) takes no arena block, or the eager step's n-th allocation would
// not be the captured step's (the P-rank decode graph's capture freed replaced blocks inside the
// capture, which CUDA refuses: cluster/results/h100-2026-12-07-session5). Its allocations are
// ordinary, and the step's own allocations keep their order around it.
TEST(StepArena, HostWorkBetweenSegmentsTakesNoBlock) {
  StepArena arena;
  void* inside = nullptr;
  {
    StepArenaScope scope(arena);
    (void)Tensor::empty({16}, DType::f32);
    CudaGraph::outside([&] {
      EXPECT_EQ(StepArena::active(), nullptr);
      inside = Tensor::empty({32}, DType::f32).data();
    });
    EXPECT_EQ(StepArena::active(), &arena) << "the arena is back after the host work";
    (void)Tensor::empty({4}, DType::i32);
  }
  EXPECT_EQ(arena.blocks(), 2u) << "only the step's own two allocations";
  EXPECT_NE(inside, nullptr);
  {  // the step without the host work (a captured step defers it): the same blocks, none fresh
    StepArenaScope scope(arena);
    (void)Tensor::empty({16}, DType::f32);
    (void)Tensor::empty({4}, DType::i32);
  }
  EXPECT_EQ(arena.fresh_blocks(), 0u);
}

// Logits [V] at the last position of a full forward over `ids` (no cache).
std::vector<float> recompute_last_logits(const Model& model, const std::vector<int32_t>& ids) {
  const Tensor logits = full_logits(model, ids);
  const int64_t t = logits.size(0), vocab = logits.size(1);
  return {logits.data_as<float>() + (t - 1) * vocab, logits.data_as<float>() + t * vocab};
}

TEST(DecodeEngine, StepsAfterTheFirstAllocateNothingAndEqualRecompute) {
  for (const std::string preset : {"hydrahead-tiny", "qwen3-tiny"}) {
    const ModelConfig config = preset_config(preset);
    const Model model(config, random_parameters(config, 5));
    SelfCommunicator self;
    const int64_t slots = 3, steps = 6, vocab = config.vocab_size;
    KvCache cache(model, slots, steps, 1, 0);
    DecodeEngine engine(self, model, cache, {.host_logits = true});
    std::vector<std::vector<int32_t>> fed(static_cast<size_t>(slots));
    std::vector<int64_t> rows(static_cast<size_t>(slots));
    std::iota(rows.begin(), rows.end(), int64_t{0});
    size_t allocations = 0;
    for (int64_t step = 0; step < steps; ++step) {
      if (step == 4) rows.pop_back();  // a finished sequence: a smaller batch
      std::vector<int32_t> ids;
      for (const int64_t b : rows) ids.push_back(static_cast<int32_t>((step * 37 + b * 11 + 3) % vocab));
      engine.step(rows, ids, step % 2 == 0 ? StepResult::logits : StepResult::argmax);
      const size_t now = host_tensor_stats().allocations;
      if (step == 0) {
        EXPECT_GT(engine.fresh_blocks(), 0u) << preset << ": the first step allocates the arena";
      } else {
        EXPECT_EQ(engine.fresh_blocks(), 0u) << preset << " step " << step;
        EXPECT_EQ(now, allocations) << preset << " step " << step << ": host tensors allocated inside a step";
      }
      allocations = now;
      for (size_t i = 0; i < rows.size(); ++i) {
        auto& seq = fed[static_cast<size_t>(rows[i])];
        seq.push_back(ids[i]);
        const std::vector<float> want = recompute_last_logits(model, seq);
        if (step % 2 == 0) {
          const std::span<const float> got = engine.logits().subspan(i * static_cast<size_t>(vocab), static_cast<size_t>(vocab));
          for (int64_t v = 0; v < vocab; ++v) {
            ASSERT_NEAR(got[static_cast<size_t>(v)], want[static_cast<size_t>(v)], 1e-4 * (1 + std::abs(want[static_cast<size_t>(v)])))
                << preset << " step " << step << " row " << i << " logit " << v;
          }
        } else {
          EXPECT_EQ(engine.argmax()[i], std::max_element(want.begin(), want.end()) - want.begin())
              << preset << " step " << step << " row " << i;
        }
      }
      allocations = host_tensor_stats().allocations;  // the recompute above allocates; not the step's
    }
  }
}

// The decode step's L2 weight prefetch (the kernel option decode_prefetch_bytes) is a GPU matter:
// on the host a model with it set decodes the bits of one without it, step after step.
TEST(DecodeEngine, TheGpuWeightPrefetchChangesNothingOnTheHost) {
  for (const std::string preset : {"hydrahead-tiny", "qwen3-tiny"}) {
    const ModelConfig config = preset_config(preset);
    const NamedTensors params = random_parameters(config, 6);
    const Model plain(config, params);
    Model with(config, params);
    with.set_kernel_options({.decode_prefetch_bytes = int64_t{32} << 20});
    SelfCommunicator self;
    const int64_t slots = 2, steps = 4;
    KvCache plain_cache(plain, slots, steps, 1, 0), with_cache(with, slots, steps, 1, 0);
    DecodeEngine a(self, plain, plain_cache, {.host_logits = true}), b(self, with, with_cache, {.host_logits = true});
    const std::vector<int64_t> rows = {0, 1};
    std::vector<int32_t> ids = {3, 17};
    for (int64_t step = 0; step < steps; ++step) {
      a.step(rows, ids, StepResult::logits);
      b.step(rows, ids, StepResult::logits);
      ASSERT_EQ(a.logits().size(), b.logits().size());
      for (size_t i = 0; i < a.logits().size(); ++i) ASSERT_EQ(a.logits()[i], b.logits()[i]) << preset << " step " << step;
      for (size_t r = 0; r < rows.size(); ++r) ids[r] = static_cast<int32_t>((ids[r] * 7 + 5) % config.vocab_size);
    }
  }
}

}  // namespace
}  // namespace hydra::test
