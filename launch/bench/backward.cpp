// hydra bench --op attention-bwd | gdn-bwd (see backward.h).
//
// Order: the correctness check first — a small shape (300 tokens, 2 query heads, d as asked; the
// attention at positions ≥ 1000 with τ on) through the GPU forward and backward and through the
// CPU references, every gradient's RMS error ratio printed and held to the GPU tests' tolerances
// (the run stops if one fails) — then the timed shape: warm-up, then the median of --repeat
// CUDA-event timings of forward + backward, and of the backward alone (delta pass + kernel, the
// accumulators zeroed) with the chosen kernel; then, for the before/after of a kernel choice in one
// run, the backward kernel alone with each kernel that runs the shape (d = 64: mma, mma-k64;
// d = 128: ws, mma; ws not with packed documents) and the delta pass alone. --doc-len packs the
// tokens as documents (the check then runs documents of the same length too).
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

// Packed documents of doc_len tokens from position 0, for the rows at positions [pos0, pos0 + t):
// each row's document start and document end (attention.h q_document_start / k_document_end), i64
// on the host.
struct DocumentBounds {
  Tensor start, end;  // [t] each
};
DocumentBounds document_bounds(int64_t pos0, int64_t t, int64_t doc_len) {
  DocumentBounds b{Tensor::empty({t}, DType::i64), Tensor::empty({t}, DType::i64)};
  for (int64_t i = 0; i < t; ++i) {
    b.start.data_as<int64_t>()[i] = (pos0 + i) / doc_len * doc_len;
    b.end.data_as<int64_t>()[i] = b.start.data_as<int64_t>()[i] + doc_len;
  }
  return b;
}

nlohmann::json check_attention(int64_t d, int64_t doc_len, const ops::KernelOptions& kernels) {
  const int64_t t = 300, h = 2, hk = 1;
  Tensor q = random_device({t, h, d}, "check.q"), k = random_device({t, hk, d}, "check.k");
  Tensor v = random_device({t, hk, d}, "check.v"), dout = random_device({t, h, d}, "check.dout");
  ops::AttentionParams p;
  p.q_position0 = p.k_position0 = 1000;
  p.tau_log_base = kDefaultFaLogBase;
  p.forward_kernel = kernels.attention;
  p.backward_kernel = kernels.attention_backward;
  DocumentBounds docs, docs_gpu;
  if (doc_len > 0) {
    docs = document_bounds(p.q_position0, t, doc_len);
    docs_gpu = {to_device(docs.start, Device::cuda), to_device(docs.end, Device::cuda)};
  }
  auto run = [&](const Tensor& qx, const Tensor& kx, const Tensor& vx, const Tensor& dox, Device dev) {
    if (doc_len > 0) {  // the bounds on the device that runs
      const DocumentBounds& b = dev == Device::cuda ? docs_gpu : docs;
      p.q_document_start = b.start;
      p.k_document_end = b.end;
    }
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

KernelBenchResult bench_backward(const std::string& op, int64_t t, int64_t h, int64_t kv_heads, int64_t d,
                                   int64_t doc_len, int warmup, int repeat, const ops::KernelOptions& kernels) {
#if HYDRA_CUDA
  KernelBenchResult r;
  if (op == "attention-bwd") {
    r.extra["check_rms_ratio"] = check_attention(d, doc_len, kernels);
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
    DocumentBounds docs;
    if (doc_len > 0) {
      const DocumentBounds host_docs = document_bounds(0, t, doc_len);
      docs = {to_device(host_docs.start, Device::cuda), to_device(host_docs.end, Device::cuda)};
      p.q_document_start = docs.start;
      p.k_document_end = docs.end;
    }
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
    // The delta pass and the backward kernel alone, with each kernel that runs this shape (the
    // accumulators keep growing across the launches: a sum of a few dozen gradients, no overflow).
    // The delta pass as the model runs it: bf16 dO and O.
    const Tensor out_bf16 = to(out, Device::cuda, DType::bf16);
    const double delta_ms = median_ms(warmup, repeat, [&] { ops::attention_backward_prepare(delta, dout, out_bf16); });
    nlohmann::json by_kernel;
    std::vector<ops::AttentionBackwardKernel> alternatives = {ops::AttentionBackwardKernel::mma};
    alternatives.push_back(d == 64 ? ops::AttentionBackwardKernel::mma_k64 : ops::AttentionBackwardKernel::ws);
    for (const ops::AttentionBackwardKernel kernel : alternatives) {
      if (kernel == ops::AttentionBackwardKernel::ws && doc_len > 0) continue;  // ws takes no documents
      ops::AttentionParams pk = p;
      pk.backward_kernel = kernel;
      const double ms = median_ms(warmup, repeat, [&] { ops::attention_backward(dq, dk, dv, dout, q, k, v, lse, delta, pk); });
      by_kernel[ops::attention_backward_kernel_name(kernel)] = ms;
      log::info("backward kernel alone [{}]: {:.4f} ms", ops::attention_backward_kernel_name(kernel), ms);
    }
    log::info("delta pass alone (bf16 dO, O): {:.4f} ms ({:.0f} GB/s)", delta_ms, 2.0 * t * h * d * 2 / (delta_ms * 1e-3) / 1e9);
    // Causal FLOPs: per document with documents (T / L documents of L tokens and one of the rest).
    const double fwd_flops = doc_len > 0 ? causal_attention_flops(doc_len, h, d) * static_cast<double>(t / doc_len) +
                                               causal_attention_flops(t % doc_len, h, d)
                                         : causal_attention_flops(t, h, d);
    r.tflops = 3.5 * fwd_flops / (r.ms * 1e-3) / 1e12;
    const ops::AttentionBackwardKernel kernel = kernels.attention_backward;
    r.what = fmt::format("attention fwd+bwd causal T={} H={} d={}{}", t, h, d,
                         doc_len > 0 ? fmt::format(" docs={}", doc_len) : std::string()) +
             (kernel == ops::AttentionBackwardKernel::mma       ? " [mma.sync backward]"
              : kernel == ops::AttentionBackwardKernel::mma_k64 ? " [mma.sync 64-key backward]"
              : kernel == ops::AttentionBackwardKernel::ws      ? " [warp-specialised backward]"
                                                                : "");
    r.extra.update({{"seq_len", t}, {"heads", h}, {"kv_heads", hk}, {"head_dim", d}, {"doc_len", doc_len},
                    {"backward_ms", bwd_ms}, {"backward_tflops", 2.5 * fwd_flops / (bwd_ms * 1e-3) / 1e12},
                    {"flops", 3.5 * fwd_flops}, {"delta_ms", delta_ms}, {"backward_ms_by_kernel", by_kernel}});
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
  (void)op, (void)t, (void)h, (void)kv_heads, (void)d, (void)doc_len, (void)warmup, (void)repeat, (void)kernels;
  HYDRA_USER_FAIL("hydra bench needs the CUDA path; this build has HYDRA_CUDA=OFF");
#endif
}

}  // namespace hydra
