#include "launch/bench/decode.h"

#include <algorithm>
#include <chrono>
#include <numeric>
#include <tuple>

#include "runtime/error.h"
#if HYDRA_CUDA
#include "kernels/attention/attention_decode.h"
#include "kernels/delta_rule/delta_rule_step.h"
#include "kernels/gdn_decode/gdn_decode.h"
#include "kernels/gdn_gates/gdn_gates.h"
#include "kernels/gdn_qk/gdn_qk_step.h"
#include "kernels/gemv/gemv.h"
#include "kernels/l2norm/l2norm.h"
#include "kernels/rmsnorm/rmsnorm.h"
#include "launch/bench/util.h"
#include "model/decode_engine.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "model/params.h"
#include "parallel/self_communicator.h"
#include "runtime/log.h"
#endif

namespace hydra {

double datasheet_bandwidth_gb_per_s(const std::string& device_name) {
  const auto has = [&](const char* word) { return device_name.find(word) != std::string::npos; };
  if (has("H200")) return 4800;  // SXM and NVL alike
  if (has("H100")) return has("PCIe") ? 2000 : has("NVL") ? 3900 : 3350;
  return 0;
}

#if HYDRA_CUDA
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kStepReserveBytes = 0.5 * kGiB;  // a decode step's own tensors, with room to spare

// Random K/V (N(0, 1)) in every row of every slot, random small GDN states and conv tails.
void fill_random(KvCache& cache, const ModelConfig& config, uint64_t seed) {
  for (int64_t l = 0; l < config.num_layers; ++l) {
    KvCacheLayer& c = cache.mutable_layer(l);
    const std::string at = std::to_string(l);
    const auto draw = [&](const Tensor& t, const std::string& name, Init init) {
      if (!t.defined()) return;
      init_parameter(ParamSpec{name + at, std::vector<int64_t>(t.shape().begin(), t.shape().end()), init}, seed, t);
    };
    draw(c.k, "bench.cache.k.", Init::unit_normal);
    draw(c.v, "bench.cache.v.", Init::unit_normal);
    draw(c.state, "bench.cache.state.", Init::small_normal);
    draw(c.conv_tail, "bench.cache.tail.", Init::unit_normal);
  }
}

// One layer's decode attention and GDN step against the CPU references, on the cache's first
// `keys` rows of slot 0 (bf16 inputs on both sides). Ends the run on a mismatch.
void check_kernels(const Model& model, KvCache& cache, int64_t keys) {
  const ModelConfig& config = model.config();
  const int64_t d = config.head_dim;
  for (int64_t l = 0; l < config.num_layers; ++l) {
    const KvCacheLayer& c = cache.layer(l);
    const LayerWeights& w = model.layer_weights(l);
    if (c.k.defined()) {
      const int64_t hq = w.h_fa;
      Tensor q = bench::random_device({1, hq, d}, "bench.check.q", 5);
      Tensor host_len = Tensor::empty({1}, DType::i32);
      host_len.data_as<int32_t>()[0] = static_cast<int32_t>(keys);
      const Tensor lengths = to_device(host_len, Device::cuda);
      Tensor pos_host = Tensor::empty({1}, DType::i64);
      pos_host.data_as<int64_t>()[0] = keys - 1;
      const Tensor pos = to_device(pos_host, Device::cuda);
      const ops::AttentionParams p = model.attention_params(l);
      Tensor out = Tensor::empty({1, hq, d}, DType::f32, Device::cuda), lse = Tensor::empty({hq, 1}, DType::f32, Device::cuda);
      ops::attention_decode(out, lse, q, c.k, c.v, TensorView(), lengths, keys, pos, p);
      const auto host = [](const TensorView& t) { return to(t, Device::host, DType::f32); };
      Tensor ref = Tensor::empty({1, hq, d}, DType::f32), ref_lse = Tensor::empty({hq, 1}, DType::f32);
      ops::attention_decode(ref, ref_lse, host(q), host(c.k.view().narrow(0, 0, 1).narrow(1, 0, keys)),
                            host(c.v.view().narrow(0, 0, 1).narrow(1, 0, keys)), TensorView(), host_len, keys, pos_host, p);
      const double err = rms_ratio(out, ref), err_lse = rms_ratio(lse, ref_lse);
      log::info("decode attention check, layer {} ({} keys): rms error {:.2g} (out), {:.2g} (lse)", l, keys, err, err_lse);
      HYDRA_ASSERT(err < 1e-3 && err_lse < 1e-4, "decode attention check failed: rms error {} / {}", err, err_lse);
      break;
    }
  }
  for (int64_t l = 0; l < config.num_layers; ++l) {
    const KvCacheLayer& c = cache.layer(l);
    if (!c.state.defined()) continue;
    const int64_t h = c.state.size(1);
    Tensor q = bench::random_device({1, h, d}, "bench.check.gq", 6), k = bench::random_device({1, h, d}, "bench.check.gk", 7);
    Tensor v = bench::random_device({1, h, d}, "bench.check.gv", 8);
    ops::l2_norm(q, 1e-6f);
    ops::l2_norm(k, 1e-6f);
    Tensor g_host = Tensor::empty({1, h}, DType::f32), b_host = Tensor::empty({1, h}, DType::f32);
    for (int64_t i = 0; i < h; ++i) {
      g_host.data_as<float>()[i] = -0.05f * static_cast<float>(i % 7);
      b_host.data_as<float>()[i] = 0.1f + 0.05f * static_cast<float>(i % 11);
    }
    Tensor state = clone(c.state.view().narrow(0, 0, 1));
    Tensor ref_state = to(state, Device::host, DType::f32);
    Tensor out = Tensor::empty({1, h, d}, DType::bf16, Device::cuda), ref = Tensor::empty({1, h, d}, DType::f32);
    ops::delta_rule_step(out, state, TensorView(), q, k, v, to_device(g_host, Device::cuda), to_device(b_host, Device::cuda), {});
    const auto host = [](const TensorView& t) { return to(t, Device::host, DType::f32); };
    ops::delta_rule_step(ref, ref_state, TensorView(), host(q), host(k), host(v), g_host, b_host, {});
    const double err = rms_ratio(out, ref), err_state = rms_ratio(state, ref_state);
    log::info("GDN step check, layer {}: rms error {:.2g} (out, bf16), {:.2g} (state)", l, err, err_state);
    HYDRA_ASSERT(err < 1e-2 && err_state < 1e-5, "GDN step check failed: rms error {} / {}", err, err_state);
    break;
  }
}

// One layer's GDN branch (ops::gdn_decode_step with `kernel`) on random inputs against a cache's
// first `batch` slots: the tensors of a call, the cache's own state and tail in.
struct GdnBranchCall {
  Tensor out, conv_out, inv_norm, beta, g, positions, x, b_logits, a_logits;
  ops::GdnDecodeTensors tensors(const LayerWeights& w, const TensorView& state, const TensorView& tail) const {
    return {.out = out, .conv_out = conv_out, .inv_norm = inv_norm, .beta = beta, .g = g, .state = state, .tail = tail,
            .positions = positions, .x = x, .conv_w = w.conv, .b_logits = b_logits, .a_logits = a_logits,
            .a_log = w.a_log, .dt_bias = w.dt_bias};
  }
};
GdnBranchCall gdn_branch_call(int64_t batch, int64_t heads, int64_t d, int64_t position) {
  GdnBranchCall a;
  a.out = Tensor::empty({batch, heads, d}, DType::bf16, Device::cuda);
  a.conv_out = Tensor::empty({batch, 3 * heads * d}, DType::bf16, Device::cuda);
  a.inv_norm = Tensor::empty({batch, 2 * heads}, DType::f32, Device::cuda);
  a.beta = Tensor::empty({batch, heads}, DType::f32, Device::cuda);
  a.g = Tensor::empty({batch, heads}, DType::f32, Device::cuda);
  Tensor pos_host = Tensor::empty({batch}, DType::i64);
  for (int64_t b = 0; b < batch; ++b) pos_host.data_as<int64_t>()[b] = position + b;
  a.positions = to_device(pos_host, Device::cuda);
  a.x = bench::random_device({batch, 3 * heads * d}, "bench.gdn.x", 13);
  a.b_logits = bench::random_device({batch, heads}, "bench.gdn.b", 14);
  a.a_logits = bench::random_device({batch, heads}, "bench.gdn.a", 15);
  return a;
}

// The GDN branch with `kernel` against the CPU reference (the three ops, the conv output rounded to
// bf16 between the conv and the step as the GPU holds it), on copies of slot 0's state and tail.
void check_gdn_branch(const Model& model, const KvCache& cache, ops::GdnDecodeKernel kernel) {
  const ModelConfig& config = model.config();
  for (int64_t l = 0; l < config.num_layers; ++l) {
    const KvCacheLayer& c = cache.layer(l);
    if (!c.state.defined()) continue;
    const LayerWeights& w = model.layer_weights(l);
    const int64_t h = c.state.size(1), d = config.head_dim;
    const GdnBranchCall call = gdn_branch_call(1, h, d, 4095);
    Tensor state = clone(c.state.view().narrow(0, 0, 1));
    Tensor tail = c.conv_tail.defined() ? clone(c.conv_tail.view().narrow(0, 0, 1)) : Tensor();
    const auto host = [](const TensorView& t) { return to(t, Device::host, DType::f32); };
    Tensor ref_state = host(state), ref_tail = tail.defined() ? host(tail) : Tensor();
    ops::DeltaRuleParams rule = model.delta_rule_params();
    rule.decode_kernel = kernel;
    const ops::GdnQkParams qk = model.gdn_qk_params(h);
    ops::gdn_decode_step(call.tensors(w, state, tail), qk, rule);
    Tensor ref_conv = Tensor::empty({1, 3 * h * d}, DType::f32), ref_inv = Tensor::empty({1, 2 * h}, DType::f32);
    ops::gdn_qkv_conv_step(ref_conv, ref_inv, host(call.x), host(w.conv), ref_tail, TensorView(),
                           to(call.positions, Device::host, DType::i64), qk);
    ref_conv = host(to(ref_conv, Device::host, DType::bf16));  // what the GPU's step reads
    Tensor ref_beta = Tensor::empty({1, h}, DType::f32), ref_g = Tensor::empty({1, h}, DType::f32);
    ops::gdn_gates(ref_beta, ref_g, host(call.b_logits), host(call.a_logits), host(w.a_log), host(w.dt_bias));
    Tensor ref = Tensor::empty({1, h, d}, DType::f32);
    const auto heads_at = [&](int64_t first) { return ref_conv.view().narrow(1, first * d, h * d).split_dim(1, h, d); };
    ops::delta_rule_step(ref, ref_state, TensorView(), heads_at(0), heads_at(h), heads_at(2 * h), ref_g, ref_beta, rule);
    const double err = rms_ratio(call.out, ref), err_state = rms_ratio(state, ref_state);
    const double err_conv = rms_ratio(call.conv_out, ref_conv), err_g = rms_ratio(call.g, ref_g);
    log::info("GDN branch check ({}), layer {}: rms error {:.2g} (out, bf16), {:.2g} (state), {:.2g} (conv out, bf16), "
              "{:.2g} (g)", ops::gdn_decode_kernel_name(kernel), l, err, err_state, err_conv, err_g);
    HYDRA_ASSERT(err < 1e-2 && err_state < 1e-5 && err_conv < 1e-2 && err_g < 1e-5,
                 "GDN branch check ({}) failed: rms error {} / {} / {} / {}", ops::gdn_decode_kernel_name(kernel), err,
                 err_state, err_conv, err_g);
    if (tail.defined()) {
      const double err_tail = rms_ratio(tail, ref_tail);
      HYDRA_ASSERT(err_tail == 0, "GDN branch check ({}) failed: the conv tail differs (rms {})",
                   ops::gdn_decode_kernel_name(kernel), err_tail);
    }
    return;
  }
}

// The GEMV on one layer's four projections (the model's weights, x random, the residual's two
// adding into random values) at `batch` rows against the CPU reference on the same bf16 values.
// `tuning`: the variant's launch shape. Ends the run on a mismatch (rms error 1e-2: the output's bf16 rounding, 2⁻⁸ at most). With
// `fused_norm`, also the two that read a norm (in_proj, mlp_in) through ops::gemv_rms_norm, which
// must equal ops::rms_norm then ops::gemv on the GPU bit for bit.
void check_gemv(const Model& model, int64_t batch, bool fused_norm, const ops::GemvTuning& tuning) {
  const LayerWeights& w = model.layer_weights(0);
  const auto host = [](const TensorView& t) { return to(t, Device::host, DType::f32); };
  struct Projection {
    const char* name;
    const Tensor& weight;
    ops::Accumulate accumulate;
  };
  for (const Projection& p : {Projection{"in_proj", w.in_proj, ops::Accumulate::no},
                              Projection{"o_proj", w.o_proj, ops::Accumulate::yes},
                              Projection{"mlp_in", w.mlp_in, ops::Accumulate::no},
                              Projection{"mlp_down", w.mlp_down, ops::Accumulate::yes}}) {
    const int64_t n = p.weight.size(0), k = p.weight.size(1);
    const Tensor x = bench::random_device({batch, k}, std::string("bench.gemv.x.") + p.name, 13);
    Tensor out = bench::random_device({batch, n}, std::string("bench.gemv.out.") + p.name, 14);
    Tensor ref = host(out);
    HYDRA_ASSERT(ops::gemv_supported(out, x, p.weight), "decode bench: the GEMV does not take {} {} at batch {}",
                 p.name, p.weight.shape_string(), batch);
    ops::gemv(out, x, p.weight, p.accumulate, tuning);
    ops::gemv(ref, host(x), host(p.weight), p.accumulate);
    const double err = rms_ratio(out, ref);
    log::info("GEMV check, layer 0 {} [{}, {}] at {} rows: rms error {:.2g}", p.name, n, k, batch, err);
    HYDRA_ASSERT(err < 1e-2, "GEMV check failed: {} rms error {}", p.name, err);
  }
  if (!fused_norm) return;
  const ops::RmsNormParams norm{static_cast<float>(model.config().rms_norm_eps)};
  for (const auto& [name, gamma, weight] : {std::tuple<const char*, const Tensor&, const Tensor&>{"in_proj", w.input_norm, w.in_proj},
                                            {"mlp_in", w.post_norm, w.mlp_in}}) {
    const int64_t n = weight.size(0), k = weight.size(1);
    const Tensor h = bench::random_device({batch, k}, std::string("bench.gemv.h.") + name, 15);
    HYDRA_ASSERT(ops::gemv_rms_norm_supported(h, gamma, weight), "decode bench: the fused norm does not take {} {}",
                 name, weight.shape_string());
    Tensor fused = Tensor::empty({batch, n}, DType::bf16, Device::cuda), separate = Tensor::empty({batch, n}, DType::bf16, Device::cuda);
    Tensor normed = Tensor::empty({batch, k}, DType::bf16, Device::cuda);
    ops::gemv_rms_norm(fused, h, {gamma, norm}, weight, tuning);
    ops::rms_norm(normed, h, gamma, norm);
    ops::gemv(separate, normed, weight, ops::Accumulate::no, tuning);
    const Tensor a = host(fused), b = host(separate);
    int64_t differ = 0;
    for (int64_t i = 0; i < a.numel(); ++i) differ += a.data_as<float>()[i] != b.data_as<float>()[i];
    log::info("GEMV check, layer 0 {} with its norm fused at {} rows: {} of {} outputs differ from norm then GEMV", name,
              batch, differ, a.numel());
    HYDRA_ASSERT(differ == 0, "GEMV check failed: {} with the norm fused differs from the norm then the GEMV", name);
  }
}

// What the cells compare their bandwidth with: a device copy measured in this run, and the card's
// datasheet figure (0: a card datasheet_bandwidth_gb_per_s does not list).
struct Ceilings {
  std::string gpu;
  double copy_gb_per_s = 0;
  double datasheet_gb_per_s = 0;
};

// The cell's JSON fields naming the kernels it ran with; gemv_in_step: whether the step's
// projections ran the GEMV (it takes at most kGemvMaxRows rows; larger batches stay on cuBLAS).
void describe(nlohmann::json& j, const DecodeKernelVariant& v, int64_t batch) {
  j["decode_ctas_per_sm"] = v.ctas_per_sm;
  j["decode_gemv"] = ops::decode_gemv_kernel_name(v.gemv);
  j["gemv_tuning"] = ops::gemv_tuning_name(v.gemv_tuning);
  j["gemv_in_step"] = v.gemv != ops::DecodeGemvKernel::cublas && batch <= ops::kGemvMaxRows;
  j["gdn_step"] = ops::gdn_decode_kernel_name(v.gdn);
  j["decode_prefetch_mib"] = v.prefetch_bytes / (1024 * 1024);  // 0: off
}

// The cell's decode steps, `opt.warmup + opt.repeat` of them from the cache's current lengths: the step
// generate runs (model/decode_engine.h), the greedy tokens feeding the next step. Returns the timed
// steps' milliseconds (those after the warm-up) and records the engine's step arena in `j`.
std::vector<double> time_steps(Communicator& self, const Model& model, KvCache& cache, int64_t batch,
                               const DecodeBenchOptions& opt, nlohmann::json& j) {
  const ModelConfig& config = model.config();
  const int64_t steps = opt.warmup + opt.repeat;
  std::vector<int64_t> slots(static_cast<size_t>(batch));
  std::iota(slots.begin(), slots.end(), int64_t{0});
  std::vector<int32_t> ids(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) ids[static_cast<size_t>(b)] = static_cast<int32_t>((b * 7919 + 1) % config.vocab_size);
  std::vector<double> ms;
  DecodeEngine engine(self, model, cache, {.cuda_graph = opt.cuda_graph});
  for (int64_t step = 0; step < steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    engine.step(slots, ids, StepResult::argmax);
    const std::span<const int32_t> next = engine.argmax();  // read back on the host: the step's end
    const double t = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (step >= opt.warmup) ms.push_back(t);
    for (int64_t b = 0; b < batch; ++b) {
      HYDRA_ASSERT(next[static_cast<size_t>(b)] >= 0, "decode bench: non-finite logits at step {}", step);
    }
    std::copy(next.begin(), next.end(), ids.begin());
  }
  j["step_arena_mib"] = engine.arena_bytes() / 1048576.0;
  return ms;
}

// The decode attention of the first layer with FA heads alone (CUDA events; the anchors measure the
// same op in PyTorch), its shape and bandwidth recorded in `j`. Returns its median ms, 0 without FA heads.
double time_attention_layer(const Model& model, const KvCache& cache, int64_t context, int64_t batch,
                            const DecodeBenchOptions& opt, nlohmann::json& j) {
  const ModelConfig& config = model.config();
  const int64_t d = config.head_dim;
  for (int64_t l = 0; l < config.num_layers; ++l) {
    const KvCacheLayer& c = cache.layer(l);
    if (!c.k.defined()) continue;
    const int64_t hq = model.layer_weights(l).h_fa;
    Tensor q = bench::random_device({batch, hq, d}, "bench.q", 9);
    Tensor len_host = Tensor::empty({batch}, DType::i32), pos_host = Tensor::empty({batch}, DType::i64);
    for (int64_t b = 0; b < batch; ++b) {
      len_host.data_as<int32_t>()[b] = static_cast<int32_t>(context);
      pos_host.data_as<int64_t>()[b] = context - 1;
    }
    const Tensor len = to_device(len_host, Device::cuda), pos = to_device(pos_host, Device::cuda);
    Tensor out = Tensor::empty({batch, hq, d}, DType::f32, Device::cuda), lse = Tensor::empty({hq, batch}, DType::f32, Device::cuda);
    const ops::AttentionParams p = model.attention_params(l);
    const double attention_ms = bench::median_ms(opt.warmup, opt.repeat, [&] {
      ops::attention_decode(out, lse, q, c.k, c.v, TensorView(), len, context, pos, p);
    });
    j["attention_heads"] = hq;
    j["attention_kv_heads"] = c.k.size(2);
    j["attention_gb_per_s"] = static_cast<double>(batch) * static_cast<double>(context) * 2.0 *
                              static_cast<double>(c.k.size(2) * d) * 2.0 / (attention_ms * 1e-3) / 1e9;
    return attention_ms;
  }
  return 0;
}

// Median ms of the first GDN layer's delta-rule step alone and of its whole branch (conv step, gates,
// step) with the cell's kernels; both 0 without GDN heads.
struct GdnLayerTimes {
  double step_ms = 0, branch_ms = 0;
};

GdnLayerTimes time_gdn_layer(const Model& model, const KvCache& cache, int64_t context, int64_t batch,
                             const DecodeBenchOptions& opt, nlohmann::json& j) {
  const ModelConfig& config = model.config();
  const int64_t d = config.head_dim;
  for (int64_t l = 0; l < config.num_layers; ++l) {
    const KvCacheLayer& c = cache.layer(l);
    if (!c.state.defined()) continue;
    const int64_t h = c.state.size(1);
    Tensor q = bench::random_device({batch, h, d}, "bench.gq", 10), k = bench::random_device({batch, h, d}, "bench.gk", 11);
    Tensor v = bench::random_device({batch, h, d}, "bench.gv", 12);
    ops::l2_norm(k, 1e-6f);
    Tensor g = Tensor::empty({batch, h}, DType::f32, Device::cuda), beta = Tensor::empty({batch, h}, DType::f32, Device::cuda);
    fill(g, -0.1);
    fill(beta, 0.5);
    Tensor out = Tensor::empty({batch, h, d}, DType::bf16, Device::cuda);
    GdnLayerTimes times;
    times.step_ms = bench::median_ms(opt.warmup, opt.repeat, [&] {
      ops::delta_rule_step(out, c.state, TensorView(), q, k, v, g, beta, {});
    });
    j["gdn_heads"] = h;
    const GdnBranchCall call = gdn_branch_call(batch, h, d, context);
    const ops::GdnDecodeTensors t = call.tensors(model.layer_weights(l), c.state, c.conv_tail);
    const ops::GdnQkParams qk = model.gdn_qk_params(h);
    const ops::DeltaRuleParams rule = model.delta_rule_params();
    times.branch_ms = bench::median_ms(opt.warmup, opt.repeat, [&] { ops::gdn_decode_step(t, qk, rule); });
    return times;
  }
  return {};
}

// One (context, batch) cell: the cache filled once, then per kernel variant (the model's
// kernel options set to it) the timed steps from the same cached length and the one-layer timings,
// one JSON object each through `emit`.
void run_cell(Model& model, const ops::KernelOptions& kernels, int64_t context, int64_t batch,
              const DecodeBenchOptions& opt, bool check, double weight_bytes, const Ceilings& ceiling,
              const std::function<void(nlohmann::json)>& emit) {
  const ModelConfig& config = model.config();
  const KvCacheBytes bytes = kv_cache_bytes(config, DType::bf16, DType::f32);
  const int64_t steps = opt.warmup + opt.repeat, capacity = context + steps;
  const double cache_bytes = static_cast<double>(batch) * (static_cast<double>(capacity) * bytes.per_token + bytes.per_slot);
  // The engine's buffers and, unplanned, the step's own tensors (the layer buffers of B rows and the
  // attention's split-KV partials: megabytes at these batches) under a fixed reserve.
  const double work_bytes = decode_engine_buffers(config, batch, false).bytes(Device::cuda) + kStepReserveBytes;
  const nlohmann::json base = {{"command", "bench"}, {"op", "decode"}, {"model", opt.preset}, {"arch", arch_name(config.arch)},
                               {"context", context}, {"batch", batch}, {"cache_bytes_per_token", bytes.per_token},
                               {"cache_bytes_per_sequence", bytes.per_slot}, {"cache_gib", cache_bytes / kGiB},
                               {"cuda_graph", opt.cuda_graph}, {"pdl", kernels.decode_pdl}};
  cuda_release_cached_memory();
  const double free_bytes = static_cast<double>(cuda_memory_stats().free_device);
  if (cache_bytes + work_bytes > 0.95 * free_bytes) {
    for (const DecodeKernelVariant& v : opt.variants) {
      nlohmann::json j = base;
      describe(j, v, batch);
      j["skipped"] = fmt::format("the cache ({:.1f} GiB) and the step's working set ({:.1f} GiB) exceed 95% of the "
                                 "GPU's free {:.1f} GiB", cache_bytes / kGiB, work_bytes / kGiB, free_bytes / kGiB);
      emit(j);
    }
    return;
  }
  cuda_reset_peak();
  KvCache cache(model, batch, capacity, 1, 0);
  fill_random(cache, config, opt.seed);
  SelfCommunicator self(Device::cuda);
  for (const DecodeKernelVariant& variant : opt.variants) {
    ops::KernelOptions chosen = kernels;
    chosen.decode_ctas_per_sm = variant.ctas_per_sm;
    chosen.decode_gemv = variant.gemv;
    chosen.gemv_tuning = variant.gemv_tuning;
    chosen.gdn_decode = variant.gdn;
    chosen.decode_prefetch_bytes = variant.prefetch_bytes;
    model.set_kernel_options(chosen);
    nlohmann::json j = base;
    describe(j, variant, batch);
    // Every variant starts from the same cached length (the rows the previous one appended are
    // overwritten: the values do not matter to the speed).
    for (int64_t s = 0; s < batch; ++s) cache.set_filled(s, context, context);
    if (check) {
      check_kernels(model, cache, std::min<int64_t>(context, 4096));
      check_gdn_branch(model, cache, variant.gdn);
    }
    if (check && j["gemv_in_step"].get<bool>()) check_gemv(model, batch, variant.gemv == ops::DecodeGemvKernel::hydra_norm, variant.gemv_tuning);
    std::vector<double> ms = time_steps(self, model, cache, batch, opt, j);
    std::sort(ms.begin(), ms.end());
    const double step_ms = ms[ms.size() / 2];
    // One layer's kernels alone (CUDA events): the anchors measure the same two ops in PyTorch.
    const double attention_ms = time_attention_layer(model, cache, context, batch, opt, j);
    const GdnLayerTimes gdn = time_gdn_layer(model, cache, context, batch, opt, j);
    // What a step must read at least: the weights once, every slot's cache, the GDN states (read and written).
    const double moved = weight_bytes + static_cast<double>(batch) * (static_cast<double>(context) * bytes.per_token +
                                                                       2.0 * bytes.per_slot);
    const double gb_per_s = moved / (step_ms * 1e-3) / 1e9;
    j.update({{"ms_per_step", step_ms},
              {"bytes_per_step", moved},
              {"gb_per_s", gb_per_s},
              {"fraction_of_copy", gb_per_s / ceiling.copy_gb_per_s},
              {"copy_gb_per_s", ceiling.copy_gb_per_s},
              {"gpu", ceiling.gpu},
              {"peak_gb_per_s", ceiling.datasheet_gb_per_s > 0 ? nlohmann::json(ceiling.datasheet_gb_per_s) : nlohmann::json()},
              {"fraction_of_peak", ceiling.datasheet_gb_per_s > 0 ? nlohmann::json(gb_per_s / ceiling.datasheet_gb_per_s)
                                                                  : nlohmann::json()},
              {"ms_per_token", batch == 1 ? nlohmann::json(step_ms) : nlohmann::json()},
              {"tokens_per_s", static_cast<double>(batch) * 1000.0 / step_ms},
              {"step_ms_all", ms},
              {"attention_layer_ms", attention_ms > 0 ? nlohmann::json(attention_ms) : nlohmann::json()},
              {"gdn_step_layer_ms", gdn.step_ms > 0 ? nlohmann::json(gdn.step_ms) : nlohmann::json()},
              {"gdn_branch_layer_ms", gdn.branch_ms > 0 ? nlohmann::json(gdn.branch_ms) : nlohmann::json()},
              {"peak_memory_gib", static_cast<double>(cuda_memory_stats().peak) / kGiB}});
    emit(j);
  }
  model.set_kernel_options(kernels);
}

}  // namespace

void bench_decode(const DecodeBenchOptions& opt, const ops::KernelOptions& kernels,
                  const std::function<void(const nlohmann::json&)>& emit) {
  const ModelConfig config = preset_config(opt.preset);
  const auto t0 = std::chrono::steady_clock::now();
  Model model(config, random_parameters(config, opt.seed, Device::cuda, DType::bf16), Device::cuda, DType::bf16);
  model.set_kernel_options(kernels);
  double weight_bytes = 0;
  model.weights().for_each([&](const std::string&, const Tensor& t) { weight_bytes += static_cast<double>(t.nbytes()); });
  const double weights_gib = weight_bytes / kGiB;
  log::info("decode bench: {} ready in {:.1f} s, weights {:.2f} GiB", opt.preset,
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), weights_gib);
  // The bandwidth ceilings of this GPU: a 1 GiB device copy (read + write) measured here, and its datasheet.
  Ceilings ceiling{.gpu = cuda_device_name()};
  ceiling.datasheet_gb_per_s = datasheet_bandwidth_gb_per_s(ceiling.gpu);
  {
    Tensor a = Tensor::zeros({int64_t{1} << 29}, DType::bf16, Device::cuda), b = Tensor::empty({int64_t{1} << 29}, DType::bf16, Device::cuda);
    const double ms = bench::median_ms(2, 5, [&] { copy_into(b, a); });
    ceiling.copy_gb_per_s = 2.0 * static_cast<double>(a.nbytes()) / (ms * 1e-3) / 1e9;
    log::info("ceiling: {}: device copy of 1 GiB at {:.0f} GB/s (read + write), datasheet {}", ceiling.gpu,
              ceiling.copy_gb_per_s,
              ceiling.datasheet_gb_per_s > 0 ? fmt::format("{:.0f} GB/s", ceiling.datasheet_gb_per_s) : "not listed");
  }
  bool checked = false;
  for (const int64_t context : opt.contexts) {
    for (const int64_t batch : opt.batches) {
      bool measured = false;
      run_cell(model, kernels, context, batch, opt, !checked, weight_bytes, ceiling, [&](nlohmann::json j) {
        j["weights_gib"] = weights_gib;
        const int ctas = j["decode_ctas_per_sm"].get<int>();
        const std::string variant = (ctas > 0 ? fmt::format("attention {} CTAs/SM", ctas) : std::string("attention")) +
                                    ", GDN " + j["gdn_step"].get<std::string>() +
                                    ", projections " +
                                    (j["gemv_in_step"].get<bool>() ? "gemv (" + j["gemv_tuning"].get<std::string>() + ")" : "cublas") +
                                    (j["decode_prefetch_mib"].get<int64_t>() > 0
                                         ? fmt::format(", L2 prefetch {} MiB", j["decode_prefetch_mib"].get<int64_t>())
                                         : std::string());
        if (j.contains("skipped")) {
          log::info("decode {} context {} batch {} ({}): skipped: {}", opt.preset, context, batch, variant,
                    j["skipped"].get<std::string>());
        } else {
          measured = true;
          log::info("decode {} context {} batch {} ({}, {}): {:.3f} ms per step, {:.1f} tokens/s, {:.0f} GB/s = {:.2f} of the copy, "
                    "{} of the datasheet; cache {:.1f} GiB ({:.1f} KiB per token), peak {:.1f} GiB; one layer: attention {} ms, GDN step {} ms, "
                    "GDN branch {} ms",
                    opt.preset, context, batch,
                    std::string(opt.cuda_graph ? "graph" : "eager") + (kernels.decode_pdl ? " + PDL" : ""), variant,
                    j["ms_per_step"].get<double>(),
                    j["tokens_per_s"].get<double>(), j["gb_per_s"].get<double>(), j["fraction_of_copy"].get<double>(),
                    j["fraction_of_peak"].is_null() ? std::string("—") : fmt::format("{:.2f}", j["fraction_of_peak"].get<double>()),
                    j["cache_gib"].get<double>(),
                    j["cache_bytes_per_token"].get<double>() / 1024.0, j["peak_memory_gib"].get<double>(),
                    j["attention_layer_ms"].dump(), j["gdn_step_layer_ms"].dump(), j["gdn_branch_layer_ms"].dump());
        }
        emit(j);
      });
      checked = checked || measured;
    }
  }
}
#else
void bench_decode(const DecodeBenchOptions&, const ops::KernelOptions&, const std::function<void(const nlohmann::json&)>&) {
  HYDRA_USER_FAIL("hydra bench --op decode needs the CUDA path; this build has HYDRA_CUDA=OFF");
}
#endif

}  // namespace hydra
