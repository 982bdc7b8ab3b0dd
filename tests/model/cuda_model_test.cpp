// The whole model on the GPU against the CPU path: the same random hydrahead-tiny (and qwen3-tiny)
// weights, placed once in fp32 on the host and once in bf16 on the GPU. Tolerance 5e-2 of the
// largest logit: bf16 storage of every activation over 2 layers (DESIGN.md §2) — measured values are
// printed; plus the arg-max of at least 95% of positions must agree.
#include "model/model.h"
#include "model/params.h"
#include "model/train/objective.h"
#include "parallel/self_communicator.h"
#include "tests/common/test_util.h"

namespace hydra::test {
namespace {

Tensor logits_on(const Model& model, const std::vector<int32_t>& ids) {
  SelfCommunicator self(model.device());
  const int64_t t = static_cast<int64_t>(ids.size());
  ForwardContext context{self, SequenceLayout::zigzag(t, 1, 0)};
  const Tensor hidden = model.forward(context, TensorView(const_cast<int32_t*>(ids.data()), DType::i32, Device::host, {t}));
  Tensor logits = Tensor::empty({t, model.config().vocab_size}, DType::f32, model.device());
  model.lm_head(logits, hidden);
  return to(logits, Device::host, DType::f32);
}

double argmax_agreement(const Tensor& a, const Tensor& b) {
  const int64_t t = a.size(0), v = a.size(1);
  int64_t same = 0;
  for (int64_t i = 0; i < t; ++i) {
    const float* x = a.data_as<float>() + i * v;
    const float* y = b.data_as<float>() + i * v;
    same += std::max_element(x, x + v) - x == std::max_element(y, y + v) - y;
  }
  return static_cast<double>(same) / static_cast<double>(t);
}

// The weights the GPU holds, for the CPU reference: every tensor rounded to bf16.
NamedTensors bf16_rounded(const NamedTensors& params) {
  NamedTensors rounded;
  for (const auto& [n, t] : params) rounded.emplace(n, rounded_to_bf16(t));
  return rounded;
}

void expect_gpu_logits_match_cpu(const ModelConfig& c, const std::string& name) {
  const NamedTensors params = random_parameters(c, 5);
  const Model cpu(c, bf16_rounded(params)), gpu(c, params, Device::cuda, DType::bf16);
  std::vector<int32_t> ids(333);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 131 + 7) % c.vocab_size);
  const Tensor a = logits_on(gpu, ids), b = logits_on(cpu, ids);
  const double err = max_rel_error(a, b), agree = argmax_agreement(a, b);
  std::printf("%s: GPU vs CPU logits max rel error %.3g, arg-max agreement %.3f\n", name.c_str(), err, agree);
  expect_close(a, b, 5e-2, name);
  EXPECT_GE(agree, 0.95) << name;
}

TEST(CudaModel, GpuLogitsMatchCpuPath) {
  HYDRA_REQUIRE_GPU();
  for (const std::string preset : {"hydrahead-tiny", "qwen3-tiny"}) expect_gpu_logits_match_cpu(preset_config(preset), preset);
}

// Every fusion variant (kernels/fusion/fusion.cu) in the whole model, at the tolerances above.
TEST(CudaFusion, GpuLogitsMatchCpuPathForEveryVariant) {
  HYDRA_REQUIRE_GPU();
  for (const ops::Fusion fusion : ops::kFusions) {
    ModelConfig c = preset_config("hydrahead-tiny");
    c.fusion = fusion;
    expect_gpu_logits_match_cpu(c, std::string("hydrahead-tiny fusion ") + ops::fusion_name(fusion));
  }
}

// The whole model's backward on the GPU (bf16 weights and activations, fp32 gradients and
// accumulators) against the CPU path (fp32) on the same bf16-rounded weights: the mean next-token
// loss to 1e-3 relative (measured 3e-5), every parameter's gradient to an RMS ratio
// ‖g_gpu − g_cpu‖ / ‖g_cpu‖ of 5e-2 (measured at most 3.5e-2 on an H200): each op's GPU backward
// stays within 1e-2 of its reference (cuda_backward_test), and the chain of two layers stores ~20
// activations in bf16 (2^-8 relative each) on the way. The per-head gate scalars A_log and
// dt_bias get 1e-1 (measured 5.6e-2): their gradient is a sum over every token of terms of both
// signs, so its relative error is that of the terms times ‖terms‖ / |sum|. A wrong kernel, a
// missed accumulation or a stale buffer gives O(1). hydrahead-tiny (FA and GDN heads in every
// layer, head dim 64), a layer-wise hybrid with d = 128 (the wgmma kernels) and qwen3-tiny.
void expect_gpu_gradients_match_cpu(const ModelConfig& c, const std::string& name) {
  const NamedTensors params = random_parameters(c, 17);
  const Model cpu(c, bf16_rounded(params)), gpu(c, params, Device::cuda, DType::bf16);
  std::vector<int32_t> ids(300);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 211 + 5) % c.vocab_size);
  SelfCommunicator host_comm, device_comm(Device::cuda);
  const train::NamedGradients a = train::next_token_gradients(device_comm, gpu, ids);
  const train::NamedGradients b = train::next_token_gradients(host_comm, cpu, ids);
  ASSERT_EQ(a.sums.tokens, b.sums.tokens);
  EXPECT_NEAR(a.sums.loss, b.sums.loss, 1e-3 * std::abs(b.sums.loss)) << name;
  ASSERT_EQ(a.grads.size(), b.grads.size()) << name;
  double worst = 0;
  std::string worst_name;
  for (const auto& [n, g] : b.grads) {
    ASSERT_TRUE(a.grads.count(n)) << name << ": " << n;
    ASSERT_EQ(count_non_finite(a.grads.at(n)), 0) << name << ": " << n;
    const double err = norm_rel_error(a.grads.at(n), g);
    // Per-head scalars summed over every token (A_log, dt_bias, the fusion gate's bias): terms of
    // both signs, so the sum's relative error is larger than its terms'. Measured on an H200
    // (cluster/results/h200-2026-12-05-ablation): 0.101 for A_log/dt_bias with the `scale` and
    // `concat` fusions (head outputs not renormalised), ≤ 0.05 with the others; hence 0.15.
    const bool gate_scalar = n.find("gdn_A_log") != std::string::npos || n.find("gdn_dt_bias") != std::string::npos ||
                             n.find("fuse_gate.bias") != std::string::npos;
    EXPECT_LT(err, gate_scalar ? 0.15 : 5e-2) << name << ": gradient of " << n;
    if (err > worst) worst = err, worst_name = n;
  }
  std::printf("%s: GPU vs CPU loss %.6f vs %.6f, worst gradient RMS ratio %.3g (%s) over %zu tensors\n", name.c_str(),
              a.sums.loss / static_cast<double>(a.sums.tokens), b.sums.loss / static_cast<double>(b.sums.tokens), worst,
              worst_name.c_str(), b.grads.size());
}

TEST(CudaModel, GpuGradientsMatchCpuPath) {
  HYDRA_REQUIRE_GPU();
  ModelConfig wide = preset_config("qwen3-tiny");
  wide.arch = Arch::hydrahead;
  wide.head_dim = 128;
  wide.num_layers = 2;
  wide.fa_heads = {{0, 1, 2, 3}, {}};
  for (const auto& [name, c] : std::vector<std::pair<std::string, ModelConfig>>{
           {"hydrahead-tiny", preset_config("hydrahead-tiny")}, {"layer-wise d128", wide}, {"qwen3-tiny", preset_config("qwen3-tiny")}}) {
    expect_gpu_gradients_match_cpu(c, name);
  }
}

// Every fusion variant but the default (above): the variants' row kernels and reductions, and the
// gate's logit gradient through the projection's backward.
TEST(CudaFusion, GpuGradientsMatchCpuPathForEveryVariant) {
  HYDRA_REQUIRE_GPU();
  for (const ops::Fusion fusion : {ops::Fusion::norm, ops::Fusion::scale, ops::Fusion::concat, ops::Fusion::gate}) {
    ModelConfig c = preset_config("hydrahead-tiny");
    c.fusion = fusion;
    expect_gpu_gradients_match_cpu(c, std::string("hydrahead-tiny fusion ") + ops::fusion_name(fusion));
  }
}

// hydra train keeps the GDN outputs, the projection and (here in layer 0) the MLP's gate/up for the
// backward when they fit (ForwardContext::keep); the gradients must be those of the recomputing
// backward on the GPU too. Two GPU backward passes are not bit-identical (the FA backward adds dQ
// with bulk fp32 reductions, in whatever order the CTAs finish), so the bound is 1e-4 of each
// gradient's norm, not 0 (seen on an H200: up to 1.2e-6, layer 0's dt_bias, which layer 1's FA dQ
// reaches through the residual).
TEST(CudaModel, KeptActivationsGiveTheRecomputedGradients) {
  HYDRA_REQUIRE_GPU();
  const ModelConfig c = preset_config("hydrahead-tiny");
  const Model gpu(c, random_parameters(c, 21), Device::cuda, DType::bf16);
  const int64_t t = 300;
  Tensor ids = Tensor::empty({t}, DType::i32), targets = Tensor::empty({t}, DType::i32);
  for (int64_t i = 0; i < t; ++i) {
    ids.data_as<int32_t>()[i] = static_cast<int32_t>((i * 211 + 5) % c.vocab_size);
    targets.data_as<int32_t>()[i] = static_cast<int32_t>((i * 97 + 3) % c.vocab_size);
  }
  SelfCommunicator comm(Device::cuda);
  NamedTensors grads[2];
  for (const bool keep : {false, true}) {
    ForwardContext context{
        .comm = comm, .layout = SequenceLayout::zigzag(t, 1, 0), .keep = {.gdn_outputs = keep, .projection = keep, .mlp_layers = keep ? 1 : 0}};
    ModelTensors g = gpu.zeros_like_weights(gpu.acc_dtype());
    train::sequence_gradients(context, gpu, TokenRows{ids, targets, {}}, train::Objective::cross_entropy, 1.0 / t, &g);
    grads[keep ? 1 : 0] = gpu.unpack(g);
  }
  for (const auto& [n, g] : grads[0]) {
    ASSERT_TRUE(grads[1].count(n)) << n;
    EXPECT_LT(norm_rel_error(grads[1].at(n), g), 1e-4) << "gradient of " << n;
  }
}

TEST(CudaModel, GpuWeightInitEqualsHostInit) {
  HYDRA_REQUIRE_GPU();
  const ModelConfig c = preset_config("hydrahead-tiny");
  const NamedTensors h = random_parameters(c, 9), g = random_parameters(c, 9, Device::cuda, DType::f32);
  for (const auto& [name, t] : h) expect_close(to(g.at(name), Device::host, DType::f32), t, 1e-6, name);
}

// Packed documents on the GPU (mma.sync attention with document masks, GDN runs from zero, conv
// without history at a start) against the CPU path on the same packed sequence, loss and gradients
// with the same tolerances as the unpacked test above; documents of 1 token and starts inside GDN
// chunks included. A layer-wise d = 128 hybrid routes d = 128 attention to the mma.sync kernels.
TEST(CudaModel, PackedDocumentsGradientsMatchCpuPath) {
  HYDRA_REQUIRE_GPU();
  ModelConfig wide = preset_config("qwen3-tiny");
  wide.arch = Arch::hydrahead;
  wide.head_dim = 128;
  wide.num_layers = 2;
  wide.fa_heads = {{0, 1, 2, 3}, {}};
  const std::vector<int64_t> starts = {0, 1, 40, 64, 65, 130, 250, 299};
  for (const auto& [name, c] : std::vector<std::pair<std::string, ModelConfig>>{
           {"hydrahead-tiny", preset_config("hydrahead-tiny")}, {"layer-wise d128", wide}, {"qwen3-tiny", preset_config("qwen3-tiny")}}) {
    const NamedTensors params = random_parameters(c, 19);
    const Model cpu(c, bf16_rounded(params)), gpu(c, params, Device::cuda, DType::bf16);
    std::vector<int32_t> ids(300);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 211 + 5) % c.vocab_size);
    SelfCommunicator host_comm, device_comm(Device::cuda);
    const train::NamedGradients a = train::next_token_gradients(device_comm, gpu, ids, {}, starts);
    const train::NamedGradients b = train::next_token_gradients(host_comm, cpu, ids, {}, starts);
    ASSERT_EQ(a.sums.tokens, b.sums.tokens);
    EXPECT_NEAR(a.sums.loss, b.sums.loss, 1e-3 * std::abs(b.sums.loss)) << name;
    double worst = 0;
    for (const auto& [n, g] : b.grads) {
      ASSERT_TRUE(a.grads.count(n)) << name << ": " << n;
      ASSERT_EQ(count_non_finite(a.grads.at(n)), 0) << name << ": " << n;
      const double err = norm_rel_error(a.grads.at(n), g);
      const bool gate_scalar = n.find("gdn_A_log") != std::string::npos || n.find("gdn_dt_bias") != std::string::npos;
      EXPECT_LT(err, gate_scalar ? 0.15 : 5e-2) << name << ": gradient of " << n;
      worst = std::max(worst, err);
    }
    std::printf("%s packed: GPU vs CPU loss %.6f vs %.6f, worst gradient RMS ratio %.3g\n", name.c_str(),
                a.sums.loss / static_cast<double>(a.sums.tokens), b.sums.loss / static_cast<double>(b.sums.tokens), worst);
  }
}

}  // namespace
}  // namespace hydra::test
