// Generation on the GPU (bf16, the decode kernels and the cache in bf16/fp32) against the CPU path
// (fp32) on the same bf16-rounded weights. The GPU decodes greedily with its own
// tokens; the CPU then runs a full forward over prompt + those tokens, and
//  - each logits row the GPU chose from matches the CPU's at that position to 5e-2 of the largest
//    logit (bf16 storage of every activation over 2 layers, as tests/model/cuda_model_test.cpp);
//  - each GPU token is the CPU's arg-max wherever the CPU's margin between its best and second-best
//    logits exceeds that tolerance (below it, bf16 may legitimately pick the other);
// and a batch of prompts of different lengths gives each prompt's first logits as that prompt alone
// does on the GPU (the slots of the batched kernels do not mix). These run generate's default, which
// replays the decode step as a CUDA graph on one GPU. The graph gives the bits of the same step run
// eagerly, step after step, so generate's default gives the tokens and logits of --cuda-graph off
// (the library and the command), and eval-niah's generated answers too; programmatic dependent
// launch (HYDRA_DECODE_PDL) and the L2 weight prefetch (HYDRA_DECODE_PREFETCH) keep the bits as
// well. SKIPPED without a GPU.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kernels/gemv/gemv.h"
#include "model/decode_engine.h"
#include "model/generate.h"
#include "model/params.h"
#include "parallel/self_communicator.h"
#include "runtime/hdf5_file.h"
#include "tests/common/test_util.h"

namespace hydra::test {
namespace {

std::vector<int32_t> prompt_of(int64_t n, int64_t vocab, uint64_t salt) {
  return strided_ids(n, vocab, 131, 7 + static_cast<int64_t>(salt) * 29);
}

void expect_gpu_decode_matches_cpu(const ModelConfig& c, const std::string& preset, const ops::KernelOptions& kernels = {});

// One engine of a lockstep run (expect_lockstep_bits): `graph` when it was made with cuda_graph,
// so it must replay its graph from the second step on (the first runs eagerly, its blocks allocated,
// the second is captured and launched) without allocating.
struct Lockstep {
  DecodeEngine* engine;
  std::string name;
  bool graph = false;
};

// Steps the engines together for `steps` steps on slots 0, 1, 2 from `ids`, each step's next ids
// the first engine's arg-max: every other engine's logits equal the first's bit for bit at every
// step. `what` names the case in a failure.
void expect_lockstep_bits(const std::vector<Lockstep>& engines, std::vector<int32_t> ids, int64_t steps, int64_t vocab,
                          const std::string& what) {
  const std::vector<int64_t> rows = {0, 1, 2};
  ASSERT_EQ(ids.size(), rows.size());
  for (int64_t step = 0; step < steps; ++step) {
    for (const Lockstep& e : engines) e.engine->step(rows, ids, StepResult::logits);
    const auto want = engines.front().engine->logits();
    for (const Lockstep& e : engines) {
      if (e.graph) {
        EXPECT_EQ(e.engine->graph_launched(), step >= 1) << what << ", " << e.name << ", step " << step;
        if (step >= 1) {
          EXPECT_EQ(e.engine->fresh_blocks(), 0u) << what << ", " << e.name << ", step " << step;
        }
      }
      const auto got = e.engine->logits();
      ASSERT_EQ(got.size(), want.size()) << what << ", " << e.name;
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_EQ(got[i], want[i]) << what << " step " << step << " logit " << i << ": " << e.name << " differs from "
                                   << engines.front().name;
      }
    }
    for (size_t r = 0; r < rows.size(); ++r) {
      const auto row = want.subspan(r * static_cast<size_t>(vocab), static_cast<size_t>(vocab));
      ids[r] = static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
    }
  }
}

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

void expect_gpu_decode_matches_cpu(const ModelConfig& c, const std::string& preset, const ops::KernelOptions& kernels) {
  const NamedTensors params = random_parameters(c, 8);
  NamedTensors rounded;
  for (const auto& [name, t] : params) rounded.emplace(name, rounded_to_bf16(t));
  const Model cpu(c, rounded);
  Model gpu(c, params, Device::cuda, DType::bf16);
  gpu.set_kernel_options(kernels);
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

// The engine with cuda_graph (eager first step, captured second, launched after) against an eager
// engine (whose attention, one rank on the GPU, chunks for the whole capacity too): the same kernels
// on the same inputs, so the same bits, step after step. Then generate: its default (the graph here)
// against DecodeGraph::off, the same tokens and logits bit for bit, every step but the first replayed.
TEST(CudaGenerate, GraphReplayedStepEqualsEagerStep) {
  HYDRA_REQUIRE_GPU();
  for (const std::string preset : {"hydrahead-tiny", "qwen3-tiny"}) {
    const ModelConfig c = preset_config(preset);
    const Model gpu(c, random_parameters(c, 9), Device::cuda, DType::bf16);
    SelfCommunicator self(Device::cuda);
    const int64_t slots = 3, steps = 8;
    KvCache eager_cache(gpu, slots, steps, 1, 0), graph_cache(gpu, slots, steps, 1, 0);
    DecodeEngine eager(self, gpu, eager_cache, {.host_logits = true});
    DecodeEngine graph(self, gpu, graph_cache, {.host_logits = true, .cuda_graph = true});
    expect_lockstep_bits({{&eager, "the eager step"}, {&graph, "the graph", true}}, {3, 17, 101}, steps, c.vocab_size,
                         preset);
    if (HasFatalFailure()) return;
    const std::vector<std::vector<int32_t>> prompts = {prompt_of(40, c.vocab_size, 4), prompt_of(7, c.vocab_size, 5)};
    const auto plain = generate(self, gpu, prompts, {.max_new_tokens = 10, .keep_logits = true, .cuda_graph = DecodeGraph::off});
    const auto by_default = generate(self, gpu, prompts, {.max_new_tokens = 10, .keep_logits = true});
    const auto ids_only = generate(self, gpu, prompts, {.max_new_tokens = 10});  // the device arg-max path
    for (size_t b = 0; b < prompts.size(); ++b) {
      EXPECT_EQ(by_default[b].tokens, plain[b].tokens) << preset << " prompt " << b;
      EXPECT_EQ(ids_only[b].tokens, plain[b].tokens) << preset << " prompt " << b;
      ASSERT_EQ(by_default[b].logits.size(), plain[b].logits.size());
      for (size_t i = 0; i < plain[b].logits.size(); ++i) {
        ASSERT_EQ(by_default[b].logits[i], plain[b].logits[i]) << preset << " prompt " << b << " logit " << i;
      }
      // One decode step per new token (the prompt's last token gives the first): 10 steps of batch
      // 2, the first eager, the others replayed; none with the graph off.
      EXPECT_EQ(plain[b].graph_steps, 0) << preset << " prompt " << b;
      EXPECT_EQ(by_default[b].graph_steps, 9) << preset << " prompt " << b;
      EXPECT_EQ(ids_only[b].graph_steps, 9) << preset << " prompt " << b;
    }
  }
}

// Programmatic dependent launch (HYDRA_DECODE_PDL, the kernel option decode_pdl) changes when the
// step's kernels are scheduled, not what they compute: engines of a model with it (eager, and the
// graph) give the bits of an eager engine without it, step after step, and generate the same tokens.
TEST(CudaGenerate, ProgrammaticLaunchKeepsTheBits) {
  HYDRA_REQUIRE_GPU();
  for (const std::string preset : {"hydrahead-tiny", "qwen3-tiny"}) {
    const ModelConfig c = preset_config(preset);
    const NamedTensors params = random_parameters(c, 10);
    const Model plain(c, params, Device::cuda, DType::bf16);
    Model with_pdl(c, params, Device::cuda, DType::bf16);
    with_pdl.set_kernel_options({.decode_pdl = true});
    SelfCommunicator self(Device::cuda);
    const int64_t slots = 3, steps = 8;
    KvCache plain_cache(plain, slots, steps, 1, 0), eager_cache(with_pdl, slots, steps, 1, 0),
        graph_cache(with_pdl, slots, steps, 1, 0);
    DecodeEngine reference(self, plain, plain_cache, {.host_logits = true, .cuda_graph = false});
    DecodeEngine eager(self, with_pdl, eager_cache, {.host_logits = true, .cuda_graph = false});
    DecodeEngine graph(self, with_pdl, graph_cache, {.host_logits = true, .cuda_graph = true});
    expect_lockstep_bits({{&reference, "eager without PDL"}, {&eager, "eager with PDL"}, {&graph, "the graph with PDL", true}},
                         {5, 29, 77}, steps, c.vocab_size, preset);
    if (HasFatalFailure()) return;
    const std::vector<std::vector<int32_t>> prompts = {prompt_of(33, c.vocab_size, 8), prompt_of(4, c.vocab_size, 9)};
    const auto want = generate(self, plain, prompts, {.max_new_tokens = 10, .cuda_graph = DecodeGraph::off});
    const auto got = generate(self, with_pdl, prompts, {.max_new_tokens = 10});
    for (size_t b = 0; b < prompts.size(); ++b) {
      EXPECT_EQ(got[b].tokens, want[b].tokens) << preset << " prompt " << b;
      EXPECT_EQ(got[b].graph_steps, 9) << preset << " prompt " << b;
    }
  }
}

// The decode step's L2 weight prefetch (HYDRA_DECODE_PREFETCH, the kernel option
// decode_prefetch_bytes, kernels/l2_prefetch/) reads nothing into any value and the FA decode's
// evict-first cache loads return the same words: engines of a model with it (eager; the graph with
// PDL) give an eager engine's bits without it, step after step, at a cap past every weight and at
// one that cuts o_proj; the captured step holds one more kernel a layer than without it (the
// prefetch, forked onto its side stream and joined, is inside the graph); generate gives the same
// tokens. A prefetch still running when the capture ended would fail the capture.
TEST(CudaGenerate, DecodePrefetchKeepsTheBits) {
  HYDRA_REQUIRE_GPU();
  for (const std::string preset : {"hydrahead-tiny", "qwen3-tiny"}) {
    const ModelConfig c = preset_config(preset);
    const NamedTensors params = random_parameters(c, 15);
    Model plain(c, params, Device::cuda, DType::bf16);
    plain.set_kernel_options({.decode_pdl = true});
    const int64_t o_proj_bytes = static_cast<int64_t>(plain.layer_weights(0).o_proj.nbytes());
    for (const int64_t cap : {int64_t{64} << 20, o_proj_bytes / 2 + 8}) {
      const std::string what = fmt::format("{} cap {} bytes", preset, cap);
      Model with(c, params, Device::cuda, DType::bf16), with_pdl(c, params, Device::cuda, DType::bf16);
      with.set_kernel_options({.decode_prefetch_bytes = cap});
      with_pdl.set_kernel_options({.decode_pdl = true, .decode_prefetch_bytes = cap});
      SelfCommunicator self(Device::cuda);
      const int64_t slots = 3, steps = 8;
      KvCache reference_cache(plain, slots, steps, 1, 0), plain_graph_cache(plain, slots, steps, 1, 0),
          eager_cache(with, slots, steps, 1, 0), graph_cache(with_pdl, slots, steps, 1, 0);
      DecodeEngine reference(self, plain, reference_cache, {.host_logits = true, .cuda_graph = false});
      DecodeEngine plain_graph(self, plain, plain_graph_cache, {.host_logits = true, .cuda_graph = true});
      DecodeEngine eager(self, with, eager_cache, {.host_logits = true, .cuda_graph = false});
      DecodeEngine graph(self, with_pdl, graph_cache, {.host_logits = true, .cuda_graph = true});
      expect_lockstep_bits({{&reference, "eager without the prefetch"},
                            {&plain_graph, "the graph without the prefetch", true},
                            {&eager, "eager with the prefetch"},
                            {&graph, "the graph with the prefetch", true}},
                           {6, 31, 88}, steps, c.vocab_size, what);
      if (HasFatalFailure()) return;
      EXPECT_GT(plain_graph.graph_kernel_nodes(), 0u) << what;
      EXPECT_EQ(graph.graph_kernel_nodes(), plain_graph.graph_kernel_nodes() + static_cast<size_t>(c.num_layers))
          << what << ": one prefetch kernel a layer in the captured step";
      const std::vector<std::vector<int32_t>> prompts = {prompt_of(33, c.vocab_size, 16), prompt_of(4, c.vocab_size, 17)};
      const auto want = generate(self, plain, prompts, {.max_new_tokens = 10, .cuda_graph = DecodeGraph::off});
      const auto got = generate(self, with_pdl, prompts, {.max_new_tokens = 10});
      const auto got_eager = generate(self, with, prompts, {.max_new_tokens = 10, .cuda_graph = DecodeGraph::off});
      for (size_t b = 0; b < prompts.size(); ++b) {
        EXPECT_EQ(got[b].tokens, want[b].tokens) << what << " prompt " << b << " (graph + PDL)";
        EXPECT_EQ(got_eager[b].tokens, want[b].tokens) << what << " prompt " << b << " (eager)";
        EXPECT_EQ(got[b].graph_steps, 9) << what << " prompt " << b;
      }
    }
  }
  // The bench times each cap on the same cell and records it (HYDRA_DECODE_PREFETCH is the default).
  const std::string bench = hydra_binary() + " bench --op decode --preset hydrahead-tiny --contexts 4K --batches 1 "
                                              "--warmup 1 --repeat 2";
  std::vector<nlohmann::json> cells;
  for (const std::string& command : {"HYDRA_DECODE_PREFETCH=2 " + bench, bench + " --decode-prefetch off,1"}) {
    const CommandResult r = run_command(command);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    std::stringstream lines(r.output);
    for (std::string line; std::getline(lines, line);) {
      if (!line.empty() && line.front() == '{') cells.push_back(nlohmann::json::parse(line));
    }
  }
  ASSERT_EQ(cells.size(), 3u);
  const std::vector<int64_t> mib = {2, 0, 1};
  for (size_t i = 0; i < cells.size(); ++i) {
    EXPECT_EQ(cells[i].at("decode_prefetch_mib").get<int64_t>(), mib[i]) << cells[i].dump();
    EXPECT_GT(cells[i].at("ms_per_step").get<double>(), 0.0) << cells[i].dump();
  }
}

// The fused GDN decode kernel (the kernel option gdn_decode, ops::gdn_decode_step) computes the
// branch with the separate kernels' arithmetic but the state's column sums in another order: with it
// (graph + PDL) generate gives the separate kernels' tokens (eager, no PDL), and logits within bf16
// noise of theirs.
TEST(CudaGenerate, FusedGdnDecodeKeepsTheTokens) {
  HYDRA_REQUIRE_GPU();
  const ModelConfig c = preset_config("hydrahead-tiny");
  const NamedTensors params = random_parameters(c, 11);
  const Model separate(c, params, Device::cuda, DType::bf16);
  Model fused(c, params, Device::cuda, DType::bf16);
  fused.set_kernel_options({.decode_pdl = true, .gdn_decode = ops::GdnDecodeKernel::fused});
  SelfCommunicator self(Device::cuda);
  const std::vector<std::vector<int32_t>> prompts = {prompt_of(37, c.vocab_size, 12), prompt_of(5, c.vocab_size, 13),
                                                     prompt_of(20, c.vocab_size, 14)};
  const auto want = generate(self, separate, prompts, {.max_new_tokens = 12, .keep_logits = true, .cuda_graph = DecodeGraph::off});
  const auto got = generate(self, fused, prompts, {.max_new_tokens = 12, .keep_logits = true});
  for (size_t b = 0; b < prompts.size(); ++b) {
    EXPECT_EQ(got[b].tokens, want[b].tokens) << "prompt " << b;
    EXPECT_EQ(got[b].graph_steps, 11) << "prompt " << b;
    ASSERT_EQ(got[b].logits.size(), want[b].logits.size());
    double err = 0, scale = 0;
    for (size_t i = 0; i < want[b].logits.size(); ++i) {
      err = std::max(err, static_cast<double>(std::abs(got[b].logits[i] - want[b].logits[i])));
      scale = std::max(scale, static_cast<double>(std::abs(want[b].logits[i])));
    }
    EXPECT_GT(scale, 0.0);
    EXPECT_LE(err, 2e-2 * scale) << "prompt " << b;
  }
}

// The decode step's projections through the GEMV (kernel option decode_gemv = hydra, kernels/gemv/):
//  - every projection of the tiny presets is one the GEMV takes at these batches, so the step
//    really runs it (Model::project falls back to cuBLAS otherwise);
//  - generation with it matches the CPU forward as cuBLAS's does (expect_gpu_decode_matches_cpu);
//  - the step is deterministic: an eager engine, and the graph with PDL, give an eager engine's bits
//    step after step;
//  - generate's tokens equal cuBLAS's. The two sum in different orders, so their logits differ by
//    bf16 roundings (checked to 2e-2 of the largest); a token may differ only where cuBLAS's own
//    top-two margin is below that (a near tie), and the comparison of that prompt stops there (the
//    continuations then differ by construction); the graph with PDL and the device arg-max give the
//    eager GEMV's tokens.
TEST(CudaGenerate, GemvDecodeKeepsTheTokens) {
  HYDRA_REQUIRE_GPU();
  for (const std::string preset : {"hydrahead-tiny", "qwen3-tiny"}) {
    const ModelConfig c = preset_config(preset);
    const NamedTensors params = random_parameters(c, 11);
    const Model by_cublas(c, params, Device::cuda, DType::bf16);
    Model by_gemv(c, params, Device::cuda, DType::bf16), by_gemv_pdl(c, params, Device::cuda, DType::bf16);
    by_gemv.set_kernel_options({.decode_gemv = ops::DecodeGemvKernel::hydra});
    by_gemv_pdl.set_kernel_options({.decode_pdl = true, .decode_gemv = ops::DecodeGemvKernel::hydra});
    for (int64_t l = 0; l < c.num_layers; ++l) {
      const LayerWeights& w = by_gemv.layer_weights(l);
      for (const int64_t rows : {1, 3}) {
        const auto takes = [&](const Tensor& weight) {
          const Tensor x = Tensor::empty({rows, weight.size(1)}, DType::bf16, Device::cuda);
          const Tensor out = Tensor::empty({rows, weight.size(0)}, DType::bf16, Device::cuda);
          return ops::gemv_supported(out, x, weight);
        };
        EXPECT_TRUE(takes(w.in_proj) && takes(w.o_proj) && takes(w.mlp_in) && takes(w.mlp_down))
            << preset << " layer " << l << ": a projection the GEMV does not take";
      }
    }
    expect_gpu_decode_matches_cpu(c, preset + " (GEMV)", {.decode_gemv = ops::DecodeGemvKernel::hydra});

    SelfCommunicator self(Device::cuda);
    const int64_t slots = 3, steps = 8;
    KvCache eager_cache(by_gemv, slots, steps, 1, 0), again_cache(by_gemv, slots, steps, 1, 0),
        graph_cache(by_gemv_pdl, slots, steps, 1, 0);
    DecodeEngine eager(self, by_gemv, eager_cache, {.host_logits = true, .cuda_graph = false});
    DecodeEngine again(self, by_gemv, again_cache, {.host_logits = true, .cuda_graph = false});
    DecodeEngine graph(self, by_gemv_pdl, graph_cache, {.host_logits = true, .cuda_graph = true});
    expect_lockstep_bits({{&eager, "an eager GEMV engine"}, {&again, "a second eager engine"},
                          {&graph, "the graph with PDL", true}},
                         {7, 41, 99}, steps, c.vocab_size, preset);
    if (HasFatalFailure()) return;

    const std::vector<std::vector<int32_t>> prompts = {prompt_of(33, c.vocab_size, 12), prompt_of(4, c.vocab_size, 13),
                                                       prompt_of(90, c.vocab_size, 14)};
    const auto want = generate(self, by_cublas, prompts, {.max_new_tokens = 12, .keep_logits = true});
    const auto got = generate(self, by_gemv, prompts, {.max_new_tokens = 12, .keep_logits = true});
    const auto got_ids = generate(self, by_gemv_pdl, prompts, {.max_new_tokens = 12});  // graph + PDL, device arg-max
    const size_t vocab = static_cast<size_t>(c.vocab_size);
    int compared = 0;
    for (size_t b = 0; b < prompts.size(); ++b) {
      EXPECT_EQ(got_ids[b].tokens, got[b].tokens) << preset << " prompt " << b << ": graph + PDL vs eager, both GEMV";
      ASSERT_EQ(got[b].tokens.size(), want[b].tokens.size());
      for (size_t i = 0; i < want[b].tokens.size(); ++i) {
        const float* r = want[b].logits.data() + i * vocab;
        Tensor expected = Tensor::empty({c.vocab_size}, DType::f32), actual = Tensor::empty({c.vocab_size}, DType::f32);
        std::copy_n(r, vocab, expected.data_as<float>());
        std::copy_n(got[b].logits.data() + i * vocab, vocab, actual.data_as<float>());
        expect_close(actual, expected, 2e-2, fmt::format("{} prompt {} token {}: GEMV vs cuBLAS logits", preset, b, i));
        ++compared;
        if (got[b].tokens[i] == want[b].tokens[i]) continue;
        std::vector<float> sorted(r, r + vocab);
        std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
        const double top = *std::max_element(r, r + vocab, [](float x, float y) { return std::abs(x) < std::abs(y); });
        EXPECT_LE(sorted[0] - sorted[1], 2e-2 * std::abs(top))
            << preset << " prompt " << b << " token " << i << ": the GEMV chose " << got[b].tokens[i] << ", cuBLAS "
            << want[b].tokens[i] << " with a clear margin";
        std::printf("%s prompt %zu: a near tie at token %zu, compared no further\n", preset.c_str(), b, i);
        break;
      }
    }
    std::printf("%s: %d tokens compared with cuBLAS's\n", preset.c_str(), compared);
  }
}

// Kernel choices that repeat the arithmetic of the kernels they replace, so the decode step keeps
// its bits: the GEMV with the input and MLP norms fused (decode_gemv = hydra-norm) against the GEMV
// after the norm kernels (hydra), and that fused GEMV 8 slices ahead with the tile prefetch
// (ops::GemvTuning: neither changes the order of a sum) against the same base. For each, on both tiny presets: the fused path really runs (every
// layer's norm + projection pair is one gemv_rms_norm takes); an eager engine with it, and the graph
// with PDL, give the eager base's logits bit for bit, step after step, on caches of 600 rows (the
// engine's attention chunks the whole capacity, so it splits the keys and merges partials); and
// generate writes the same tokens with the same logits.
TEST(CudaGenerate, FusedDecodeKernelsKeepTheBits) {
  HYDRA_REQUIRE_GPU();
  struct Choice {
    std::string what;
    ops::KernelOptions base, fused;
  };
  const std::vector<Choice> choices = {
      {"norms fused into the GEMV", {.decode_gemv = ops::DecodeGemvKernel::hydra}, {.decode_gemv = ops::DecodeGemvKernel::hydra_norm}},
      // The GEMV's launch shapes that keep the order of its sums (ops::GemvTuning: ahead, prefetch).
      {"the GEMV 8 slices ahead with the tile prefetch",
       {.decode_gemv = ops::DecodeGemvKernel::hydra},
       {.decode_gemv = ops::DecodeGemvKernel::hydra_norm, .gemv_tuning = {.warps = 0, .ahead = 8, .prefetch = ops::GemvPrefetch::tile}}}};
  for (const std::string preset : {"hydrahead-tiny", "qwen3-tiny"}) {
    const ModelConfig c = preset_config(preset);
    const NamedTensors params = random_parameters(c, 17);
    for (const Choice& choice : choices) {
      const std::string what = preset + ", " + choice.what;
      Model base(c, params, Device::cuda, DType::bf16), fused(c, params, Device::cuda, DType::bf16),
          fused_pdl(c, params, Device::cuda, DType::bf16);
      base.set_kernel_options(choice.base);
      fused.set_kernel_options(choice.fused);
      ops::KernelOptions with_pdl = choice.fused;
      with_pdl.decode_pdl = true;
      fused_pdl.set_kernel_options(with_pdl);
      if (choice.fused.decode_gemv == ops::DecodeGemvKernel::hydra_norm) {
        for (int64_t l = 0; l < c.num_layers; ++l) {
          const LayerWeights& w = fused.layer_weights(l);
          const Tensor x = Tensor::empty({3, c.hidden_size}, DType::bf16, Device::cuda);
          EXPECT_TRUE(ops::gemv_rms_norm_supported(x, w.input_norm, w.in_proj) &&
                      ops::gemv_rms_norm_supported(x, w.post_norm, w.mlp_in))
              << what << " layer " << l << ": a norm the GEMV does not fuse";
        }
      }
      SelfCommunicator self(Device::cuda);
      const int64_t slots = 3, steps = 8, capacity = 600;
      KvCache base_cache(base, slots, capacity, 1, 0), fused_cache(fused, slots, capacity, 1, 0),
          graph_cache(fused_pdl, slots, capacity, 1, 0);
      DecodeEngine by_base(self, base, base_cache, {.host_logits = true, .cuda_graph = false});
      DecodeEngine by_fused(self, fused, fused_cache, {.host_logits = true, .cuda_graph = false});
      DecodeEngine by_graph(self, fused_pdl, graph_cache, {.host_logits = true, .cuda_graph = true});
      expect_lockstep_bits({{&by_base, "the base, eager"}, {&by_fused, "the fused kernels, eager"},
                            {&by_graph, "the fused kernels, graph with PDL", true}},
                           {7, 41, 99}, steps, c.vocab_size, what);
      if (HasFatalFailure()) return;
      const std::vector<std::vector<int32_t>> prompts = {prompt_of(300, c.vocab_size, 21), prompt_of(9, c.vocab_size, 22)};
      const auto want = generate(self, base, prompts, {.max_new_tokens = 10, .keep_logits = true});
      const auto got = generate(self, fused, prompts, {.max_new_tokens = 10, .keep_logits = true});
      for (size_t b = 0; b < prompts.size(); ++b) {
        EXPECT_EQ(got[b].tokens, want[b].tokens) << what << " prompt " << b;
        EXPECT_TRUE(got[b].logits == want[b].logits) << what << " prompt " << b << ": generate's logits differ";
      }
    }
  }
}

// hydra generate on the GPU as a user runs it: the default (the graph) and --cuda-graph off write
// the same tokens, and the summary says which ran; --cuda-graph on is the default made explicit.
TEST(CudaGenerate, CommandDefaultReplaysTheGraphWithTheEagerTokens) {
  HYDRA_REQUIRE_GPU();
  const TempDir dir;
  const std::string h = hydra_binary();
  ASSERT_EQ(run_command(h + " init --preset hydrahead-tiny --weight-seed 3 --out " + dir.file("m.h5")).exit_code, 0);
  {
    const std::vector<int32_t> a = prompt_of(50, 256, 6), b = prompt_of(9, 256, 7);
    std::vector<int32_t> ids = a;
    ids.insert(ids.end(), b.begin(), b.end());
    H5File file = H5File::create(dir.file("p.h5"));
    Tensor t = Tensor::empty({static_cast<int64_t>(ids.size())}, DType::i32);
    std::copy(ids.begin(), ids.end(), t.data_as<int32_t>());
    file.write("input_ids", t);
    Tensor o = Tensor::empty({3}, DType::i64);
    o.data_as<int64_t>()[0] = 0;
    o.data_as<int64_t>()[1] = static_cast<int64_t>(a.size());
    o.data_as<int64_t>()[2] = static_cast<int64_t>(ids.size());
    file.write("prompt_offsets", o);
    file.close();
  }
  const auto run = [&](const std::string& flag, const std::string& name) {
    const CommandResult r = run_command(h + " generate --model " + dir.file("m.h5") + " --prompt " + dir.file("p.h5") +
                                        " --max-new-tokens 12 --device cuda --out " + dir.file(name) + flag);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    std::vector<nlohmann::json> lines;
    std::ifstream in(dir.file(name));
    for (std::string line; std::getline(in, line);) {
      if (!line.empty()) lines.push_back(nlohmann::json::parse(line));
    }
    return lines;
  };
  const auto by_default = run("", "default.jsonl"), off = run(" --cuda-graph off", "off.jsonl");
  const auto on = run(" --cuda-graph on", "on.jsonl");
  ASSERT_EQ(by_default.size(), 3u);
  ASSERT_EQ(off.size(), 3u);
  ASSERT_EQ(on.size(), 3u);
  for (size_t b = 0; b < 2; ++b) {
    EXPECT_EQ(by_default[b].at("tokens"), off[b].at("tokens")) << "prompt " << b;
    EXPECT_EQ(on[b].at("tokens"), off[b].at("tokens")) << "prompt " << b;
    EXPECT_EQ(by_default[b].at("tokens").size(), 12u);
  }
  EXPECT_TRUE(by_default[2].at("cuda_graph").get<bool>());
  EXPECT_TRUE(on[2].at("cuda_graph").get<bool>());
  EXPECT_FALSE(off[2].at("cuda_graph").get<bool>());
}

// eval-niah --score generate on the GPU: its default (the graph, one rank per sample) predicts the
// tokens --cuda-graph off predicts, sample for sample.
TEST(CudaGenerate, EvalNiahGenerateScoringReplaysTheGraphWithTheEagerTokens) {
  HYDRA_REQUIRE_GPU();
  const TempDir dir;
  const std::string base = hydra_binary() + " eval-niah --preset hydrahead-tiny --weight-seed 4 --task single,multivalue "
                           "--lengths 256 --depths 0,50 --samples 2 --score generate --device cuda --out ";
  const auto predictions = [&](const std::string& name, const std::string& flag) {
    const CommandResult r = run_command(base + dir.file(name) + flag);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    std::vector<nlohmann::json> predicted;
    std::ifstream in(dir.file(name));
    for (std::string line; std::getline(in, line);) {
      if (line.empty()) continue;
      const nlohmann::json j = nlohmann::json::parse(line);
      if (j.contains("predicted")) predicted.push_back(j.at("predicted"));
    }
    return predicted;
  };
  const auto by_default = predictions("default.jsonl", ""), off = predictions("off.jsonl", " --cuda-graph off");
  EXPECT_EQ(by_default.size(), 8u);  // 2 tasks × 2 depths × 2 samples
  EXPECT_EQ(by_default, off);
}

// hydra bench --op decode as the decode benchmark job runs it, at toy size: its correctness gate
// passes, a cell that fits is measured (ms per step, tokens/s, bytes, peak memory), and one that
// cannot fit (10⁹ cached tokens) is skipped with its reason instead of failing; the default is the
// graph, --cuda-graph off the eager step, HYDRA_DECODE_PDL=1 the graph with PDL;
// --decode-ctas-per-sm times each decode attention chunking on the same cell.
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
  // The default replays the step as a CUDA graph; the line names the card and, for a card with a
  // datasheet figure, the fraction of it.
  for (const auto& c : cells) {
    if (c.contains("skipped")) continue;
    EXPECT_TRUE(c.at("cuda_graph").get<bool>()) << c.dump();
    EXPECT_FALSE(c.at("gpu").get<std::string>().empty());
    const std::string gpu = c.at("gpu").get<std::string>();
    if (gpu.find("H100") != std::string::npos || gpu.find("H200") != std::string::npos) {
      EXPECT_NEAR(c.at("fraction_of_peak").get<double>(),
                  c.at("gb_per_s").get<double>() / c.at("peak_gb_per_s").get<double>(), 1e-12) << c.dump();
    }
  }
  // The same step launched eagerly.
  const CommandResult g = run_command(hydra_binary() + " bench --op decode --preset hydrahead-tiny --contexts 4K "
                                      "--batches 2 --warmup 2 --repeat 3 --cuda-graph off");
  ASSERT_EQ(g.exit_code, 0) << g.output;
  const auto at = g.output.find("{\"");
  ASSERT_NE(at, std::string::npos) << g.output;
  const nlohmann::json cell = nlohmann::json::parse(g.output.substr(at, g.output.find('\n', at) - at));
  EXPECT_FALSE(cell.at("cuda_graph").get<bool>());
  EXPECT_FALSE(cell.at("pdl").get<bool>());
  EXPECT_GT(cell.at("ms_per_step").get<double>(), 0.0);
  // The graph with programmatic dependent launch.
  const CommandResult p = run_command("HYDRA_DECODE_PDL=1 " + hydra_binary() + " bench --op decode --preset hydrahead-tiny "
                                      "--contexts 4K --batches 2 --warmup 2 --repeat 3");
  ASSERT_EQ(p.exit_code, 0) << p.output;
  const auto at_p = p.output.find("{\"");
  ASSERT_NE(at_p, std::string::npos) << p.output;
  const nlohmann::json pdl_cell = nlohmann::json::parse(p.output.substr(at_p, p.output.find('\n', at_p) - at_p));
  EXPECT_TRUE(pdl_cell.at("cuda_graph").get<bool>());
  EXPECT_TRUE(pdl_cell.at("pdl").get<bool>());
  EXPECT_GT(pdl_cell.at("ms_per_step").get<double>(), 0.0);
  EXPECT_EQ(pdl_cell.at("decode_ctas_per_sm").get<int>(), 0) << "as many split CTAs as fit by default";
  // The decode attention's split CTAs per SM, each on the same cell in the order asked; each checked
  // against the CPU and named in its line.
  const CommandResult v = run_command(hydra_binary() + " bench --op decode --preset hydrahead-tiny --contexts 4K "
                                      "--batches 1 --warmup 1 --repeat 2 --decode-ctas-per-sm 1,0,2");
  ASSERT_EQ(v.exit_code, 0) << v.output;
  std::vector<nlohmann::json> variants;
  std::stringstream lines(v.output);
  for (std::string line; std::getline(lines, line);) {
    if (!line.empty() && line.front() == '{') variants.push_back(nlohmann::json::parse(line));
  }
  ASSERT_EQ(variants.size(), 3u) << v.output;
  EXPECT_EQ(variants[0].at("decode_ctas_per_sm").get<int>(), 1);
  EXPECT_EQ(variants[1].at("decode_ctas_per_sm").get<int>(), 0);
  EXPECT_EQ(variants[2].at("decode_ctas_per_sm").get<int>(), 2);
  for (const auto& c : variants) EXPECT_GT(c.at("attention_layer_ms").get<double>(), 0.0) << c.dump();
  size_t checks = 0;
  for (size_t at_check = v.output.find("decode attention check"); at_check != std::string::npos;
       at_check = v.output.find("decode attention check", at_check + 1)) {
    ++checks;
  }
  EXPECT_EQ(checks, 3u) << "every variant is checked against the CPU at the first cell";
  // The projections' kernels on the same cell: cuBLAS, then the GEMV (checked on one layer's four
  // projections against the CPU first); at batch 9 the GEMV is not in the step (at most 8 rows).
  const CommandResult gv = run_command(hydra_binary() + " bench --op decode --preset hydrahead-tiny --contexts 4K "
                                       "--batches 2,9 --warmup 1 --repeat 2 --decode-gemv cublas,hydra");
  ASSERT_EQ(gv.exit_code, 0) << gv.output;
  std::vector<nlohmann::json> gemv_cells;
  std::stringstream gemv_lines(gv.output);
  for (std::string line; std::getline(gemv_lines, line);) {
    if (!line.empty() && line.front() == '{') gemv_cells.push_back(nlohmann::json::parse(line));
  }
  ASSERT_EQ(gemv_cells.size(), 4u) << gv.output;
  const std::vector<std::pair<std::string, bool>> expected = {{"cublas", false}, {"hydra", true}, {"cublas", false}, {"hydra", false}};
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(gemv_cells[i].at("decode_gemv").get<std::string>(), expected[i].first) << gemv_cells[i].dump();
    EXPECT_EQ(gemv_cells[i].at("gemv_in_step").get<bool>(), expected[i].second) << gemv_cells[i].dump();
    EXPECT_GT(gemv_cells[i].at("ms_per_step").get<double>(), 0.0) << gemv_cells[i].dump();
  }
  size_t gemv_checks = 0;
  for (size_t at_check = gv.output.find("GEMV check"); at_check != std::string::npos;
       at_check = gv.output.find("GEMV check", at_check + 1)) {
    ++gemv_checks;
  }
  EXPECT_EQ(gemv_checks, 4u) << "the GEMV variant of the first cell is checked on layer 0's four projections";
}

}  // namespace
}  // namespace hydra::test
