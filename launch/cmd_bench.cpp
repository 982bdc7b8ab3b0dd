// hydra bench: one kernel, timed on the GPU, next to the bf16 GEMM ceiling measured in the same
// process (cuBLAS 8192³ unless --ceiling-size says otherwise).
//
// Order: check correctness against the CPU reference on a slice (the run is refused if the slice
// disagrees), warm up, then time --repeat launches with CUDA events and report the median.
// attention: causal FA forward (τ on, as the HydraHead FA heads run), TFLOP/s = 2·T²·d·H / time.
// gdn: the chunked gated delta rule forward (prepare + state pass + outputs), time and the
// effective TFLOP/s of model/cost.h's FLOP count. gemm: M×N×K bf16, 2·M·N·K / time.
// attention-bwd, gdn-bwd: forward + backward (bench_backward.cpp states their checks and FLOP counts).
// gdn-input: the GDN conv/RoPE/L2 pass, its q/k backward and the conv backward, in GB/s beside a
// device copy measured in the same run instead of the GEMM ceiling (bench_gdn_input.cpp).
// decode: a whole model's greedy decode steps at long context (bench_decode.h): ms per step,
// tokens/s, cache bytes, peak memory and GB/s beside a device copy, per (--contexts, --batches) cell.
// The kernel measured is the one a model run would use (HYDRA_ATTENTION_KERNEL, HYDRA_GDN_KERNEL,
// HYDRA_GDN_SEGMENTS select others); its name is part of the printed label and the JSON line.
#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "kernels/attention/attention.h"
#include "kernels/delta_rule/delta_rule.h"
#include "kernels/l2norm/l2norm.h"
#include "kernels/matmul/matmul.h"
#include "launch/bench_backward.h"
#include "launch/bench_decode.h"
#include "launch/bench_gdn_input.h"
#include "launch/cli.h"
#include "model/cost.h"
#include "model/params.h"
#include "runtime/atomic_file.h"
#include "runtime/log.h"
#include "runtime/random.h"
#include "runtime/sizes.h"
#if HYDRA_CUDA
#include "launch/bench_util.h"
#include "runtime/cuda_memory.h"
#endif

namespace hydra {
namespace {

struct BenchOptions {
  std::string op;
  std::string seq_len = "32K";
  int64_t heads = 16;
  int64_t kv_heads = 0;
  int64_t head_dim = 128;
  int64_t m = 8192, n = 8192, k = 8192;
  int64_t ceiling_size = 8192;
  int repeat = 10;
  int warmup = 3;
  std::string json_out;
  std::string preset;
  std::string contexts = "32K,128K,512K,1M";
  std::string batches = "1,8,32";

  void bind(po::options_description& o) {
    o.add_options()
        ("op", po::value(&op)->required(), "gemm, attention, gdn, attention-bwd, gdn-bwd or gdn-input")
        ("seq-len", po::value(&seq_len)->default_value("32K"), "tokens (all but gemm)")
        ("heads", po::value(&heads)->default_value(16), "query heads (attention) or GDN heads")
        ("kv-heads", po::value(&kv_heads)->default_value(0), "attention KV heads (0: as many as query heads)")
        ("head-dim", po::value(&head_dim)->default_value(128), "64 or 128")
        ("m", po::value(&m)->default_value(8192), "gemm M")
        ("n", po::value(&n)->default_value(8192), "gemm N")
        ("k", po::value(&k)->default_value(8192), "gemm K")
        ("ceiling-size", po::value(&ceiling_size)->default_value(8192), "square bf16 GEMM measured as the ceiling")
        ("repeat", po::value(&repeat)->default_value(10), "timed launches (median reported)")
        ("warmup", po::value(&warmup)->default_value(3), "untimed launches first")
        ("json-out", po::value(&json_out), "append the JSON line to this file")
        ("preset", po::value(&preset), "decode: the model (random weights), e.g. hydrahead-1.7b or qwen3-1.7b")
        ("contexts", po::value(&contexts)->default_value("32K,128K,512K,1M"), "decode: cached tokens per sequence, a list")
        ("batches", po::value(&batches)->default_value("1,8,32"), "decode: sequences per step, a list");
  }
  // A comma-separated list of sizes (accepts 32K, 1M).
  static std::vector<int64_t> size_list(const std::string& text, const char* flag) {
    std::vector<int64_t> out;
    std::stringstream in(text);
    std::string item;
    while (std::getline(in, item, ',')) out.push_back(parse_size(item, flag));
    HYDRA_USER_CHECK(!out.empty(), "{} needs at least one value", flag);
    for (const int64_t v : out) HYDRA_USER_CHECK(v >= 1, "{} values must be >= 1 (got {})", flag, v);
    return out;
  }
  void validate() const {
    HYDRA_USER_CHECK(op == "gemm" || op == "attention" || op == "gdn" || op == "gdn-input" || op == "decode" ||
                         is_backward_bench_op(op),
                     "--op must be gemm, attention, gdn, attention-bwd, gdn-bwd, gdn-input or decode (got '{}')", op);
    if (op == "decode") {
      HYDRA_USER_CHECK(!preset.empty(), "--op decode needs --preset (e.g. hydrahead-1.7b)");
      preset_config(preset);  // a UserError listing the presets
      size_list(contexts, "--contexts");
      size_list(batches, "--batches");
    }
    parse_size(seq_len, "--seq-len");
    HYDRA_USER_CHECK(head_dim == 64 || head_dim == 128, "--head-dim must be 64 or 128");
    HYDRA_USER_CHECK(heads >= 1 && kv_heads >= 0 && (kv_heads == 0 || heads % kv_heads == 0),
                     "--heads must be a positive multiple of --kv-heads");
    HYDRA_USER_CHECK(repeat >= 1 && warmup >= 0, "--repeat >= 1, --warmup >= 0");
    if (!json_out.empty()) require_writable_destination(json_out, "JSON output");
  }
};

#if HYDRA_CUDA
using bench::median_ms;
Tensor random_device(std::initializer_list<int64_t> shape, const std::string& name) {
  return bench::random_device(shape, name, 7);
}

double gemm_tflops(int64_t m, int64_t n, int64_t k, int warmup, int repeat) {
  Tensor a = random_device({m, k}, "bench.a"), b = random_device({n, k}, "bench.b");
  Tensor c = Tensor::empty({m, n}, DType::bf16, Device::cuda);
  const double ms = median_ms(warmup, repeat, [&] { ops::linear(c, a, b); });
  return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) / (ms * 1e-3) / 1e12;
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

int run_bench(App& app, const std::vector<std::string>& args) {
  BenchOptions opt;
  po::options_description desc("hydra bench");
  opt.bind(desc);
  if (!parse_command_line(app, "bench",
                          "--op gemm|attention|gdn|attention-bwd|gdn-bwd|gdn-input [--seq-len 32K --heads 16 --head-dim 128] | "
                          "--op decode --preset NAME [--contexts 32K,128K,512K,1M --batches 1,8,32]",
                          desc, args)) {
    return 0;
  }
  opt.validate();
  agree_on_run(app, {});
#if HYDRA_CUDA
  HYDRA_USER_CHECK(cuda_device_count() > 0, "hydra bench needs a CUDA device; none is visible");
  cuda_set_device(app.mpi.local_rank() % cuda_device_count());
  if (opt.op == "decode") {  // bandwidth-bound: its own ceiling (a device copy), no GEMM
    const DecodeBenchOptions d{.preset = opt.preset, .contexts = BenchOptions::size_list(opt.contexts, "--contexts"),
                               .batches = BenchOptions::size_list(opt.batches, "--batches"), .warmup = opt.warmup,
                               .repeat = opt.repeat};
    bench_decode(d, app.kernels, [&](const nlohmann::json& r) {
      if (app.world.rank() != 0) return;
      std::cout << r.dump() << std::endl;
      if (!opt.json_out.empty()) std::ofstream(opt.json_out, std::ios::app) << r.dump() << "\n";
    });
    return 0;
  }
  if (opt.op == "gdn-input") {  // bandwidth-bound: its own ceiling (a device copy), no GEMM
    const nlohmann::json r =
        bench_gdn_input(parse_size(opt.seq_len, "--seq-len"), opt.heads, opt.head_dim, opt.warmup, opt.repeat);
    if (app.world.rank() == 0) {
      std::cout << r.dump() << std::endl;
      if (!opt.json_out.empty()) std::ofstream(opt.json_out, std::ios::app) << r.dump() << "\n";
    }
    return 0;
  }
  const double ceiling = gemm_tflops(opt.ceiling_size, opt.ceiling_size, opt.ceiling_size, 3, 10);
  log::info("ceiling: cuBLAS bf16 GEMM {}^3 = {:.1f} TFLOP/s", opt.ceiling_size, ceiling);
  nlohmann::json j = {{"command", "bench"}, {"op", opt.op}, {"ceiling_tflops", ceiling}};
  double tflops = 0, ms = 0;
  std::string what;
  if (opt.op == "gemm") {
    tflops = gemm_tflops(opt.m, opt.n, opt.k, opt.warmup, opt.repeat);
    ms = 2.0 * opt.m * opt.n * opt.k / (tflops * 1e12) * 1e3;
    what = opt.m == opt.n && opt.n == opt.k ? fmt::format("gemm {}^3 bf16", opt.m)
                                            : fmt::format("gemm {}x{}x{} bf16", opt.m, opt.n, opt.k);
    j.update({{"m", opt.m}, {"n", opt.n}, {"k", opt.k}});
  } else if (is_backward_bench_op(opt.op)) {
    const BackwardBenchResult r = bench_backward(opt.op, parse_size(opt.seq_len, "--seq-len"), opt.heads, opt.kv_heads,
                                                 opt.head_dim, opt.warmup, opt.repeat, app.kernels);
    tflops = r.tflops;
    ms = r.ms;
    what = r.what;
    j.update(r.extra);
  } else {
    const int64_t t = parse_size(opt.seq_len, "--seq-len"), h = opt.heads, d = opt.head_dim;
    if (opt.op == "attention") {
      const int64_t hk = opt.kv_heads > 0 ? opt.kv_heads : h;
      Tensor q = random_device({t, h, d}, "bench.q"), k = random_device({t, hk, d}, "bench.k"), v = random_device({t, hk, d}, "bench.v");
      Tensor out = Tensor::empty({t, h, d}, DType::f32, Device::cuda), lse = Tensor::empty({h, t}, DType::f32, Device::cuda);
      const ops::AttentionParams p{.tau_log_base = 362.0, .forward_kernel = app.kernels.attention};
      ops::attention_forward(out, lse, q, k, v, p);
      check_attention(q, k, v, out, p);
      ms = median_ms(opt.warmup, opt.repeat, [&] { ops::attention_forward(out, lse, q, k, v, p); });
      tflops = causal_attention_flops(t, h, d) / (ms * 1e-3) / 1e12;
      const char* kernel = ops::attention_kernel_name(ops::cuda_impl::resolve_flash_kernel(p.forward_kernel, d));
      what = fmt::format("attention causal T={} H={} d={} [{}]", t, h, d, kernel);
      j.update({{"seq_len", t}, {"heads", h}, {"kv_heads", hk}, {"head_dim", d}, {"kernel", kernel}});
    } else {
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
      const ops::DeltaRuleParams gdn{.segments = app.kernels.gdn_segments, .profile = app.kernels.gdn_profile};
      check_gdn(q, k, v, g, beta, out, state, gdn);
      ms = median_ms(opt.warmup, opt.repeat, [&] {
        fill(state, 0.0f);
        ops::delta_rule_chunked(out, state, q, k, v, g, beta, gdn);
      });
      tflops = delta_rule_flops(t, h, d) / (ms * 1e-3) / 1e12;
      const std::string segments = gdn.segments > 0 ? std::to_string(gdn.segments) : "auto";
      what = fmt::format("gdn chunked T={} H={} d={} [fused, segments {}]", t, h, d, segments);
      j.update({{"seq_len", t}, {"heads", h}, {"head_dim", d}, {"kernel", "fused"}, {"segments", segments}});
    }
  }
  j.update({{"what", what}, {"ms", ms}, {"tflops", tflops}, {"fraction_of_ceiling", tflops / ceiling}});
  log::info("{}: {:.3f} ms, {:.1f} TFLOP/s = {:.2f} of the {:.1f} TFLOP/s GEMM ceiling measured in this run", what, ms,
            tflops, tflops / ceiling, ceiling);
  if (app.world.rank() == 0) {
    std::cout << j.dump() << std::endl;
    if (!opt.json_out.empty()) std::ofstream(opt.json_out, std::ios::app) << j.dump() << "\n";
  }
  return 0;
#else
  (void)app;
  HYDRA_USER_FAIL("hydra bench needs the CUDA path; this build has HYDRA_CUDA=OFF");
#endif
}

}  // namespace hydra
