// Generation on the GPU (bf16, the decode kernels and the cache in bf16/fp32) against the CPU path
// (fp32) on the same bf16-rounded weights. The GPU decodes greedily with its own
// tokens; the CPU then runs a full forward over prompt + those tokens, and
//  - each logits row the GPU chose from matches the CPU's at that position to 5e-2 of the largest
//    logit (bf16 storage of every activation over 2 layers, as tests/model/cuda_model_test.cpp);
//  - each GPU token is the CPU's arg-max wherever the CPU's margin between its best and second-best
//    logits exceeds that tolerance (below it, bf16 may legitimately pick the other);
// and a batch of prompts of different lengths gives each prompt's first logits as that prompt alone
// does on the GPU (the slots of the batched kernels do not mix); the decode step replayed as a CUDA
// graph gives the bits of the same step run eagerly, and generate --cuda-graph the eager tokens.
// SKIPPED without a GPU.
#include <algorithm>
#include <cstdio>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "model/decode_engine.h"
#include "model/generate.h"
#include "model/params.h"
#include "parallel/self_communicator.h"
#include "tests/common/test_util.h"

namespace hydra::test {
namespace {

std::vector<int32_t> prompt_of(int64_t n, int64_t vocab, uint64_t salt) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = static_cast<int32_t>((i * 131 + 7 + salt * 29) % vocab);
  return ids;
}

void expect_gpu_decode_matches_cpu(const ModelConfig& c, const std::string& preset);

TEST(CudaGenerate, GreedyDecodeMatchesCpuWithinBf16) {
  HYDRA_REQUIRE_GPU();
  for (const std::string preset : {"hydrahead-tiny", "qwen3-tiny"}) expect_gpu_decode_matches_cpu(preset_config(preset), preset);
}

// Every fusion variant: the decode step's fusion (the gate from the decoded row's own x̂).
TEST(CudaFusion, GreedyDecodeMatchesCpuForEveryVariant) {
  HYDRA_REQUIRE_GPU();
  for (const ops::Fusion fusion : ops::kFusions) {
    ModelConfig c = preset_config("hydrahead-tiny");
    c.fusion = fusion;
    expect_gpu_decode_matches_cpu(c, std::string("hydrahead-tiny fusion ") + ops::fusion_name(fusion));
  }
}

void expect_gpu_decode_matches_cpu(const ModelConfig& c, const std::string& preset) {
  const NamedTensors params = random_parameters(c, 8);
  NamedTensors rounded;
  for (const auto& [name, t] : params) rounded.emplace(name, rounded_to_bf16(t));
  const Model cpu(c, rounded), gpu(c, params, Device::cuda, DType::bf16);
  SelfCommunicator self(Device::cuda);
  const std::vector<std::vector<int32_t>> prompts = {prompt_of(300, c.vocab_size, 1), prompt_of(5, c.vocab_size, 2),
                                                     prompt_of(77, c.vocab_size, 3)};
  const GenerateOptions options{.max_new_tokens = 12, .keep_logits = true};
  const auto out = generate(self, gpu, prompts, options);
  const int64_t vocab = c.vocab_size;
  double worst = 0;
  for (size_t b = 0; b < prompts.size(); ++b) {
    ASSERT_EQ(out[b].tokens.size(), 12u);
    std::vector<int32_t> seq = prompts[b];
    seq.insert(seq.end(), out[b].tokens.begin(), out[b].tokens.end() - 1);
    const Tensor ref = full_logits(cpu, seq);
    const int64_t t0 = static_cast<int64_t>(prompts[b].size()) - 1;
    for (size_t i = 0; i < out[b].tokens.size(); ++i) {
      const float* r = ref.data_as<float>() + (t0 + static_cast<int64_t>(i)) * vocab;
      Tensor want = Tensor::empty({vocab}, DType::f32), got = Tensor::empty({vocab}, DType::f32);
      std::copy_n(r, vocab, want.data_as<float>());
      std::copy_n(out[b].logits.data() + i * vocab, vocab, got.data_as<float>());
      const double err = max_rel_error(got, want);
      worst = std::max(worst, err);
      expect_close(got, want, 5e-2, fmt::format("{} prompt {} token {}", preset, b, i));
      std::vector<float> sorted(r, r + vocab);
      std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
      const double top = *std::max_element(r, r + vocab, [](float x, float y) { return std::abs(x) < std::abs(y); });
      if (sorted[0] - sorted[1] > 5e-2 * std::abs(top)) {
        EXPECT_EQ(out[b].tokens[i], std::max_element(r, r + vocab) - r) << preset << " prompt " << b << " token " << i;
      }
    }
  }
  std::printf("%s: GPU decode vs CPU forward logits, max rel error %.3g\n", preset.c_str(), worst);
  // Batched slots do not mix: each prompt alone gives the batch's first logits row (the same
  // prompt; GEMMs of another row count may round differently, so to bf16 tolerance, not bits).
  for (size_t b = 0; b < prompts.size(); ++b) {
    const auto alone = generate(self, gpu, {prompts[b]}, {.max_new_tokens = 1, .keep_logits = true});
    Tensor a = Tensor::empty({vocab}, DType::f32), t = Tensor::empty({vocab}, DType::f32);
    std::copy_n(alone[0].logits.data(), vocab, a.data_as<float>());
    std::copy_n(out[b].logits.data(), vocab, t.data_as<float>());
    expect_close(a, t, 2e-2, fmt::format("{} prompt {} alone vs in the batch", preset, b));
  }
}

// hydra bench --op decode as the decode benchmark job runs it, at toy size: its correctness gate
// passes, a cell that fits is measured (ms per step, tokens/s, bytes, peak memory), and one that
// cannot fit (10⁹ cached tokens) is skipped with its reason instead of failing.
// The engine with cuda_graph (eager first step, captured second, launched after) against an eager
// engine whose attention also chunks for the whole capacity: the same kernels on the same inputs,
// so the same bits, step after step; and generate with the option gives generate's greedy tokens.
TEST(CudaGenerate, GraphReplayedStepEqualsEagerStep) {
  HYDRA_REQUIRE_GPU();
  for (const std::string preset : {"hydrahead-tiny", "qwen3-tiny"}) {
    const ModelConfig c = preset_config(preset);
    const Model gpu(c, random_parameters(c, 9), Device::cuda, DType::bf16);
    SelfCommunicator self(Device::cuda);
    const int64_t slots = 3, steps = 8;
    KvCache eager_cache(gpu, slots, steps, 1, 0), graph_cache(gpu, slots, steps, 1, 0);
    DecodeEngine eager(self, gpu, eager_cache, {.host_logits = true});
    eager_cache.set_whole_capacity(true);
    DecodeEngine graph(self, gpu, graph_cache, {.host_logits = true, .cuda_graph = true});
    const std::vector<int64_t> rows = {0, 1, 2};
    std::vector<int32_t> ids = {3, 17, 101};
    for (int64_t step = 0; step < steps; ++step) {
      eager.step(rows, ids, StepResult::logits);
      graph.step(rows, ids, StepResult::logits);
      EXPECT_EQ(graph.graph_launched(), step >= 1) << preset << " step " << step;
      if (step >= 1) {
        EXPECT_EQ(graph.fresh_blocks(), 0u) << preset << " step " << step;
      }
      const auto a = eager.logits(), b = graph.logits();
      ASSERT_EQ(a.size(), b.size());
      for (size_t i = 0; i < a.size(); ++i) {
        ASSERT_EQ(a[i], b[i]) << preset << " step " << step << " logit " << i << ": the graph differs from the eager step";
      }
      for (size_t r = 0; r < rows.size(); ++r) {
        const auto row = a.subspan(r * static_cast<size_t>(c.vocab_size), static_cast<size_t>(c.vocab_size));
        ids[r] = static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
      }
    }
    const std::vector<std::vector<int32_t>> prompts = {prompt_of(40, c.vocab_size, 4), prompt_of(7, c.vocab_size, 5)};
    const auto plain = generate(self, gpu, prompts, {.max_new_tokens = 10});
    const auto graphed = generate(self, gpu, prompts, {.max_new_tokens = 10, .cuda_graph = true});
    for (size_t b = 0; b < prompts.size(); ++b) {
      // Greedy on bf16: the whole-capacity chunking sums the keys in other chunks, which may move a
      // later near tie; the first token must agree.
      size_t same = 0;
      while (same < plain[b].tokens.size() && plain[b].tokens[same] == graphed[b].tokens[same]) ++same;
      EXPECT_GE(same, 1u) << preset << " prompt " << b << ": the first token differs";
    }
  }
}

TEST(CudaGenerate, DecodeBenchMeasuresAndSkipsWhatCannotFit) {
  HYDRA_REQUIRE_GPU();
  const CommandResult r = run_command(hydra_binary() + " bench --op decode --preset hydrahead-tiny --contexts 4K,1000000000 "
                                      "--batches 1,3 --warmup 1 --repeat 3");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<nlohmann::json> cells;
  std::stringstream in(r.output);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.front() == '{') cells.push_back(nlohmann::json::parse(line));
  }
  ASSERT_EQ(cells.size(), 4u) << r.output;
  for (const auto& c : cells) {
    if (c.at("context").get<int64_t>() == 4096) {
      EXPECT_GT(c.at("ms_per_step").get<double>(), 0.0);
      EXPECT_GT(c.at("tokens_per_s").get<double>(), 0.0);
      // From the preset's shape, not the benchmark's formula: K and V of one KV head of 64 in each
      // of the 2 layers, bf16.
      EXPECT_EQ(c.at("cache_bytes_per_token").get<double>(), 2.0 * 2 * 64 * 2);
      // The measured peak holds at least the cache itself (4096 tokens a sequence, batch sequences).
      EXPECT_GE(c.at("peak_memory_gib").get<double>() * 1073741824.0, 4096.0 * c.at("batch").get<double>() * 2 * 2 * 64 * 2);
    } else {
      EXPECT_TRUE(c.contains("skipped")) << c.dump();
    }
  }
  EXPECT_NE(r.output.find("decode attention check"), std::string::npos) << "the correctness gate ran";
  // The same step replayed as a CUDA graph.
  const CommandResult g = run_command(hydra_binary() + " bench --op decode --preset hydrahead-tiny --contexts 4K "
                                      "--batches 2 --warmup 2 --repeat 3 --cuda-graph");
  ASSERT_EQ(g.exit_code, 0) << g.output;
  const auto at = g.output.find("{\"");
  ASSERT_NE(at, std::string::npos) << g.output;
  const nlohmann::json cell = nlohmann::json::parse(g.output.substr(at, g.output.find('\n', at) - at));
  EXPECT_TRUE(cell.at("cuda_graph").get<bool>());
  EXPECT_GT(cell.at("ms_per_step").get<double>(), 0.0);
}

}  // namespace
}  // namespace hydra::test
