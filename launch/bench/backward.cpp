// hydra bench --op attention-bwd | gdn-bwd (see backward.h).
//
// Order: the correctness check first — a small shape (300 tokens, 2 query heads, d as asked; the
// attention at positions ≥ 1000 with τ on) through the GPU forward and backward and through the
// CPU references, every gradient's RMS error ratio printed and held to the GPU tests' tolerances
// (the run stops if one fails) — then the timed shape: warm-up, then the median of --repeat
// CUDA-event timings of forward + backward, and of the backward alone.
// FLOP counts (FlashAttention's convention): causal attention forward 4·T²·d·H / 2 = 2·T²·d·H,
// backward 2.5× that (five products instead of two), so forward + backward = 7·T²·d·H. The gated
// delta rule has no agreed count; its TFLOP/s is nominal: 3 × model/cost.h's forward count
// (T·H·(6d² + 8·64·d)), the same in anchors.py; compare its milliseconds.
#include "launch/bench/backward.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "kernels/attention/attention.h"
#include "kernels/delta_rule/delta_rule.h"
#include "kernels/l2norm/l2norm.h"
#include "model/config.h"
#include "model/cost.h"
#include "model/params.h"
#include "runtime/log.h"
#include "runtime/random.h"
#if HYDRA_CUDA
#include "launch/bench/util.h"
#include "runtime/cuda_memory.h"
#endif

namespace hydra {
namespace {

#if HYDRA_CUDA
using bench::median_ms;
Tensor random_device(std::initializer_list<int64_t> shape, const std::string& name) {
  return bench::random_device(shape, name, 11);
}

Tensor host_f32(const TensorView& t) { return to(t, Device::host, DType::f32); }

void check_ratio(nlohmann::json& report, const std::string& name, double ratio, double tolerance) {
  report[name] = ratio;
  log::info("check {}: RMS error ratio {:.2e} (tolerance {:.0e})", name, ratio, tolerance);
  HYDRA_ASSERT(ratio <= tolerance, "backward check failed: {} RMS error ratio {} > {}", name, ratio, tolerance);
}

nlohmann::json check_attention(int64_t d, const ops::KernelOptions& kernels) {
  const int64_t t = 300, h = 2, hk = 1;
  Tensor q = random_device({t, h, d}, "check.q"), k = random_device({t, hk, d}, "check.k");
  Tensor v = random_device({t, hk, d}, "check.v"), dout = random_device({t, h, d}, "check.dout");
  ops::AttentionParams p;
  p.q_position0 = p.k_position0 = 1000;
  p.tau_log_base = kDefaultFaLogBase;
  p.forward_kernel = kernels.attention;
  p.backward_kernel = kernels.attention_backward;
  auto run = [&](const Tensor& qx, const Tensor& kx, const Tensor& vx, const Tensor& dox, Device dev) {
    std::vector<Tensor> r;  // dq, dk, dv
    Tensor out = Tensor::empty({t, h, d}, DType::f32, dev), lse = Tensor::empty({h, t}, DType::f32, dev);
    Tensor delta = Tensor::empty({h, t}, DType::f32, dev);
    ops::attention_forward(out, lse, qx, kx, vx, p);
    ops::attention_backward_prepare(delta, dox, out);
    r.push_back(Tensor::zeros({t, h, d}, DType::f32, dev));
    r.push_back(Tensor::zeros({t, hk, d}, DType::f32, dev));
    r.push_back(Tensor::zeros({t, hk, d}, DType::f32, dev));
    ops::attention_backward(r[0], r[1], r[2], dox, qx, kx, vx, lse, delta, p);
    return r;
  };
  const std::vector<Tensor> gpu = run(q, k, v, dout, Device::cuda);
  const std::vector<Tensor> cpu = run(host_f32(q), host_f32(k), host_f32(v), host_f32(dout), Device::host);
  nlohmann::json report;
  const char* names[] = {"dq", "dk", "dv"};
  for (int i = 0; i < 3; ++i) check_ratio(report, names[i], rms_ratio(gpu[i], cpu[i]), 1e-2);
  return report;
}

struct GdnInputs {
  Tensor q, k, v, g, beta, dout;
};

GdnInputs gdn_inputs(int64_t t, int64_t h, int64_t d) {
  GdnInputs in{random_device({t, h, d}, "gdn.q"), random_device({t, h, d}, "gdn.k"), random_device({t, h, d}, "gdn.v"),
               Tensor(), Tensor(), random_device({t, h, d}, "gdn.dout")};
  ops::l2_norm(in.q, 1e-6f);
  ops::l2_norm(in.k, 1e-6f);
  Tensor g = Tensor::empty({t, h}, DType::f32), b = Tensor::empty({t, h}, DType::f32);
  const RandomStream rng{3, 1};
  for (int64_t i = 0; i < t * h; ++i) {
    g.data_as<float>()[i] = static_cast<float>(-0.5 * rng.uniform(2 * static_cast<uint64_t>(i)));
    b.data_as<float>()[i] = static_cast<float>(rng.uniform(2 * static_cast<uint64_t>(i) + 1));
  }
  in.g = to_device(g, Device::cuda);
  in.beta = to_device(b, Device::cuda);
  return in;
}

nlohmann::json check_gdn(int64_t d) {
  const int64_t t = 300, h = 2;
  const GdnInputs in = gdn_inputs(t, h, d);
  auto run = [&](Device dev) {
    auto on = [&](const Tensor& x) { return dev == Device::cuda ? clone(x) : host_f32(x); };
    std::vector<Tensor> r;  // dq, dk, dv, dbeta, dg, d_state
    for (int i = 0; i < 3; ++i) r.push_back(Tensor::empty({t, h, d}, DType::f32, dev));
    r.push_back(Tensor::empty({t, h}, DType::f32, dev));
    r.push_back(Tensor::empty({t, h}, DType::f32, dev));
    r.push_back(Tensor::zeros({h, d, d}, DType::f32, dev));
    Tensor s0 = Tensor::zeros({h, d, d}, DType::f32, dev);
    ops::delta_rule_chunked_backward(r[0], r[1], r[2], r[4], r[3], r[5], on(in.dout), on(in.q), on(in.k), on(in.v),
                                     on(in.g), on(in.beta), s0, {});
    return r;
  };
  const std::vector<Tensor> gpu = run(Device::cuda), cpu = run(Device::host);
  nlohmann::json report;
  const char* names[] = {"dq", "dk", "dv", "dbeta", "dg", "d_state"};
  for (int i = 0; i < 6; ++i) check_ratio(report, names[i], rms_ratio(gpu[i], cpu[i]), i < 3 ? 2e-2 : 4e-2);
  return report;
}
#endif

}  // namespace

KernelBenchResult bench_backward(const std::string& op, int64_t t, int64_t h, int64_t kv_heads, int64_t d, int warmup,
                                   int repeat, const ops::KernelOptions& kernels) {
#if HYDRA_CUDA
  KernelBenchResult r;
  if (op == "attention-bwd") {
    r.extra["check_rms_ratio"] = check_attention(d, kernels);
    const int64_t hk = kv_heads > 0 ? kv_heads : h;
    Tensor q = random_device({t, h, d}, "bench.q"), k = random_device({t, hk, d}, "bench.k");
    Tensor v = random_device({t, hk, d}, "bench.v"), dout = random_device({t, h, d}, "bench.dout");
    Tensor out = Tensor::empty({t, h, d}, DType::f32, Device::cuda), lse = Tensor::empty({h, t}, DType::f32, Device::cuda);
    Tensor delta = Tensor::empty({h, t}, DType::f32, Device::cuda);
    Tensor dq = Tensor::empty({t, h, d}, DType::f32, Device::cuda), dk = Tensor::empty({t, hk, d}, DType::f32, Device::cuda),
           dv = Tensor::empty({t, hk, d}, DType::f32, Device::cuda);
    ops::AttentionParams p;
    p.tau_log_base = kDefaultFaLogBase;  // as the HydraHead FA heads run
    p.forward_kernel = kernels.attention;
    p.backward_kernel = kernels.attention_backward;
    auto forward = [&] { ops::attention_forward(out, lse, q, k, v, p); };
    auto backward = [&] {
      ops::attention_backward_prepare(delta, dout, out);
      fill(dq, 0.0f);
      fill(dk, 0.0f);
      fill(dv, 0.0f);
      ops::attention_backward(dq, dk, dv, dout, q, k, v, lse, delta, p);
    };
    forward();
    r.ms = median_ms(warmup, repeat, [&] {
      forward();
      backward();
    });
    const double bwd_ms = median_ms(warmup, repeat, backward);
    const double fwd_flops = causal_attention_flops(t, h, d);
    r.tflops = 3.5 * fwd_flops / (r.ms * 1e-3) / 1e12;
    const ops::AttentionBackwardKernel kernel = d == 128 ? kernels.attention_backward : ops::AttentionBackwardKernel::automatic;
    r.what = fmt::format("attention fwd+bwd causal T={} H={} d={}{}", t, h, d,
                         kernel == ops::AttentionBackwardKernel::mma  ? " [mma.sync backward]"
                         : kernel == ops::AttentionBackwardKernel::ws ? " [warp-specialised backward]"
                                                                      : "");
    r.extra.update({{"seq_len", t}, {"heads", h}, {"kv_heads", hk}, {"head_dim", d}, {"backward_ms", bwd_ms},
                    {"backward_tflops", 2.5 * fwd_flops / (bwd_ms * 1e-3) / 1e12}, {"flops", 3.5 * fwd_flops}});
  } else {
    r.extra["check_rms_ratio"] = check_gdn(d);
    const GdnInputs in = gdn_inputs(t, h, d);
    Tensor out = Tensor::empty({t, h, d}, DType::bf16, Device::cuda);
    Tensor state = Tensor::zeros({h, d, d}, DType::f32, Device::cuda), dstate = Tensor::zeros({h, d, d}, DType::f32, Device::cuda);
    Tensor s0 = Tensor::zeros({h, d, d}, DType::f32, Device::cuda);
    Tensor dq = Tensor::empty({t, h, d}, DType::bf16, Device::cuda), dk = Tensor::empty({t, h, d}, DType::bf16, Device::cuda),
           dv = Tensor::empty({t, h, d}, DType::bf16, Device::cuda);
    Tensor dg = Tensor::empty({t, h}, DType::f32, Device::cuda), db = Tensor::empty({t, h}, DType::f32, Device::cuda);
    const ops::DeltaRuleParams gdn{.segments = kernels.gdn_segments, .profile = kernels.gdn_profile};
    auto forward = [&] {
      fill(state, 0.0f);
      ops::delta_rule_chunked(out, state, in.q, in.k, in.v, in.g, in.beta, gdn);
    };
    auto backward = [&] {
      fill(dstate, 0.0f);
      ops::delta_rule_chunked_backward(dq, dk, dv, dg, db, dstate, in.dout, in.q, in.k, in.v, in.g, in.beta, s0, gdn);
    };
    r.ms = median_ms(warmup, repeat, [&] {
      forward();
      backward();
    });
    const double bwd_ms = median_ms(warmup, repeat, backward);
    const double flops = 3.0 * delta_rule_flops(t, h, d);
    r.tflops = flops / (r.ms * 1e-3) / 1e12;
    r.what = fmt::format("gdn fwd+bwd T={} H={} d={}", t, h, d);
    r.extra.update({{"seq_len", t}, {"heads", h}, {"head_dim", d}, {"backward_ms", bwd_ms}, {"flops_nominal", flops}});
  }
  log::info("{}: backward alone {:.3f} ms", r.what, r.extra["backward_ms"].get<double>());
  return r;
#else
  (void)op, (void)t, (void)h, (void)kv_heads, (void)d, (void)warmup, (void)repeat, (void)kernels;
  HYDRA_USER_FAIL("hydra bench needs the CUDA path; this build has HYDRA_CUDA=OFF");
#endif
}

}  // namespace hydra
