// hydra bench --op gemm | attention | gdn (see forward.h). Order: the correctness check on a slice
// against the CPU reference (the run is refused if the slice disagrees), warm-up, then the median of
// --repeat CUDA-event timings.
#include "launch/bench/forward.h"

#include <algorithm>
#include <cmath>

#include "kernels/attention/attention.h"
#include "kernels/delta_rule/delta_rule.h"
#include "kernels/l2norm/l2norm.h"
#include "kernels/matmul/matmul.h"
#include "model/config.h"
#include "model/cost.h"
#include "runtime/error.h"
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
  return bench::random_device(shape, name, 7);
}

// Correctness gates: a slice against the CPU reference; a mismatch ends the benchmark.
void check_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const ops::AttentionParams& p) {
  const int64_t t = q.size(0), rows = std::min<int64_t>(64, t), hq = q.size(1), hk = k.size(1);
  for (const int64_t h : {int64_t{0}, hq - 1}) {
    const int64_t kvh = h / (hq / hk);
    Tensor qh = to(q.view().narrow(0, t - rows, rows).narrow(1, h, 1), Device::host, DType::f32);
    Tensor kh = to(k.view().narrow(1, kvh, 1), Device::host, DType::f32), vh = to(v.view().narrow(1, kvh, 1), Device::host, DType::f32);
    Tensor ref = Tensor::empty({rows, 1, q.size(2)}, DType::f32), lse = Tensor::empty({1, rows}, DType::f32);
    ops::AttentionParams hp = p;
    hp.q_position0 = t - rows;
    hp.kv_head_of_query = {};
    ops::attention_forward(ref, lse, qh, kh, vh, hp);
    Tensor got = to(out.view().narrow(0, t - rows, rows).narrow(1, h, 1), Device::host, DType::f32);
    double diff = 0, scale = 0;
    for (int64_t i = 0; i < ref.numel(); ++i) {
      diff = std::max(diff, static_cast<double>(std::abs(got.data_as<float>()[i] - ref.data_as<float>()[i])));
      scale = std::max(scale, static_cast<double>(std::abs(ref.data_as<float>()[i])));
    }
    HYDRA_ASSERT(std::isfinite(diff) && diff <= 2e-2 * scale, "attention check failed on head {}: max error {} of {}", h,
                 diff, scale);
  }
}

// Largest |a − b| and |b| over two equally shaped host tensors.
std::pair<double, double> max_error(const Tensor& a, const Tensor& b) {
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < b.numel(); ++i) {
    diff = std::max(diff, static_cast<double>(std::abs(a.data_as<float>()[i] - b.data_as<float>()[i])));
    scale = std::max(scale, static_cast<double>(std::abs(b.data_as<float>()[i])));
  }
  return {diff, scale};
}

// GDN correctness gates, run once before timing: the first 256 tokens of two heads against the CPU
// chunked form, and the last 256 tokens against the same kernels run as one segment (no in-GPU
// split), so the later segments of the split and the fold are checked too. A mismatch ends the
// benchmark.
void check_gdn(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta, const Tensor& out,
               const Tensor& state, const ops::DeltaRuleParams& gdn) {
  const int64_t t = q.size(0), d = q.size(2), n = std::min<int64_t>(256, t), heads = std::min<int64_t>(2, q.size(1));
  auto slice = [&](const Tensor& x, int64_t t0) { return to(x.view().narrow(0, t0, n).narrow(1, 0, heads), Device::host, DType::f32); };
  fill(state, 0.0f);
  ops::cuda_impl::delta_rule_chunked(out, state, q, k, v, g, beta, gdn);
  Tensor ref = Tensor::empty({n, heads, d}, DType::f32), s0 = Tensor::zeros({heads, d, d}, DType::f32);
  ops::delta_rule_chunked(ref, s0, slice(q, 0), slice(k, 0), slice(v, 0), slice(g, 0), slice(beta, 0), {});
  const auto [diff, scale] = max_error(slice(out, 0), ref);
  log::info("gdn check, first {} tokens vs the CPU reference: max error {:.3g} of {:.3g}", n, diff, scale);
  HYDRA_ASSERT(std::isfinite(diff) && diff <= 3e-2 * scale, "GDN check failed: max error {} of {}", diff, scale);
  Tensor out_one = Tensor::empty(out.shape(), DType::bf16, Device::cuda);
  fill(state, 0.0f);
  ops::cuda_impl::delta_rule_chunked(out_one, state, q, k, v, g, beta, {.segments = 1});
  const auto [diff_end, scale_end] = max_error(slice(out, t - n), slice(out_one, t - n));
  log::info("gdn check, last {} tokens vs one unsplit segment: max error {:.3g} of {:.3g}", n, diff_end, scale_end);
  HYDRA_ASSERT(std::isfinite(diff_end) && diff_end <= 3e-2 * scale_end, "GDN check (end of the sequence) failed: max "
               "error {} of {}", diff_end, scale_end);
}
#endif

}  // namespace

double gemm_tflops(int64_t m, int64_t n, int64_t k, int warmup, int repeat) {
#if HYDRA_CUDA
  Tensor a = random_device({m, k}, "bench.a"), b = random_device({n, k}, "bench.b");
  Tensor c = Tensor::empty({m, n}, DType::bf16, Device::cuda);
  const double ms = median_ms(warmup, repeat, [&] { ops::linear(c, a, b); });
  return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) / (ms * 1e-3) / 1e12;
#else
  (void)m, (void)n, (void)k, (void)warmup, (void)repeat;
  HYDRA_USER_FAIL("hydra bench needs the CUDA path; this build has HYDRA_CUDA=OFF");
#endif
}

KernelBenchResult bench_forward(const std::string& op, int64_t t, int64_t h, int64_t kv_heads, int64_t d, int warmup,
                                int repeat, const ops::KernelOptions& kernels) {
  HYDRA_ASSERT(is_forward_bench_op(op), "bench_forward of op '{}'", op);
#if HYDRA_CUDA
  KernelBenchResult r;
  if (op == "attention") {
    const int64_t hk = kv_heads > 0 ? kv_heads : h;
    Tensor q = random_device({t, h, d}, "bench.q"), k = random_device({t, hk, d}, "bench.k"), v = random_device({t, hk, d}, "bench.v");
    Tensor out = Tensor::empty({t, h, d}, DType::f32, Device::cuda), lse = Tensor::empty({h, t}, DType::f32, Device::cuda);
    const ops::AttentionParams p{.tau_log_base = kDefaultFaLogBase, .forward_kernel = kernels.attention};  // HydraHead's τ
    ops::attention_forward(out, lse, q, k, v, p);
    check_attention(q, k, v, out, p);
    r.ms = median_ms(warmup, repeat, [&] { ops::attention_forward(out, lse, q, k, v, p); });
    r.tflops = causal_attention_flops(t, h, d) / (r.ms * 1e-3) / 1e12;
    const char* kernel = ops::attention_kernel_name(ops::cuda_impl::resolve_flash_kernel(p.forward_kernel, d));
    r.what = fmt::format("attention causal T={} H={} d={} [{}]", t, h, d, kernel);
    r.extra = {{"seq_len", t}, {"heads", h}, {"kv_heads", hk}, {"head_dim", d}, {"kernel", kernel}};
    return r;
  }
  Tensor q = random_device({t, h, d}, "bench.q"), k = random_device({t, h, d}, "bench.k"), v = random_device({t, h, d}, "bench.v");
  ops::l2_norm(q, 1e-6f);
  ops::l2_norm(k, 1e-6f);
  Tensor g_host = Tensor::empty({t, h}, DType::f32), b_host = Tensor::empty({t, h}, DType::f32);
  const RandomStream rng{3, 1};
  for (int64_t i = 0; i < t * h; ++i) {
    g_host.data_as<float>()[i] = static_cast<float>(-0.5 * rng.uniform(2 * static_cast<uint64_t>(i)));
    b_host.data_as<float>()[i] = static_cast<float>(rng.uniform(2 * static_cast<uint64_t>(i) + 1));
  }
  Tensor g = to_device(g_host, Device::cuda), beta = to_device(b_host, Device::cuda);
  Tensor out = Tensor::empty({t, h, d}, DType::bf16, Device::cuda), state = Tensor::zeros({h, d, d}, DType::f32, Device::cuda);
  const ops::DeltaRuleParams gdn{.segments = kernels.gdn_segments, .profile = kernels.gdn_profile};
  check_gdn(q, k, v, g, beta, out, state, gdn);
  r.ms = median_ms(warmup, repeat, [&] {
    fill(state, 0.0f);
    ops::delta_rule_chunked(out, state, q, k, v, g, beta, gdn);
  });
  r.tflops = delta_rule_flops(t, h, d) / (r.ms * 1e-3) / 1e12;
  const std::string segments = gdn.segments > 0 ? std::to_string(gdn.segments) : "auto";
  r.what = fmt::format("gdn chunked T={} H={} d={} [fused, segments {}]", t, h, d, segments);
  r.extra = {{"seq_len", t}, {"heads", h}, {"head_dim", d}, {"kernel", "fused"}, {"segments", segments}};
  return r;
#else
  (void)op, (void)t, (void)h, (void)kv_heads, (void)d, (void)warmup, (void)repeat, (void)kernels;
  HYDRA_USER_FAIL("hydra bench needs the CUDA path; this build has HYDRA_CUDA=OFF");
#endif
}

}  // namespace hydra
