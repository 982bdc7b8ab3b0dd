// hydra bench --op gdn-input: the GDN branch's element-wise passes at a layer's shape, each timed
// alone (in a training step they share the GPU with the FA kernels, so a profile's durations are
// not theirs). x holds the conv's q | k | v columns of H GDN heads, C = 3·H·d, kernel width 4:
//   conv      ops::gdn_qkv_conv: conv + SiLU, RoPE and the L2 norm of the 2H q/k heads;
//             moves x in, the output and the inverse norms out;
//   qk-bwd    ops::gdn_qk_backward on the H q heads (dx written over dy, as the model does):
//             dy and y in, dx out;
//   conv-bwd  ops::causal_conv_silu_backward with the weight gradient: d_out and x in, dx out.
// First each runs at T = 300 on the GPU and on the CPU path (bf16-rounded inputs) and the RMS error
// ratio must stay under 1e-2; then the median of --repeat CUDA-event timings. GB/s counts the bytes
// each must move once (bf16 activations, fp32 norms), beside a device-to-device copy of x measured
// in the same run (read + write: the bandwidth these kernels can reach).
#include "launch/bench/gdn_input.h"

#include <functional>

#include "kernels/conv/conv.h"
#include "kernels/gdn_qk/gdn_qk.h"
#include "runtime/log.h"
#if HYDRA_CUDA
#include "launch/bench/util.h"
#include "runtime/cuda_memory.h"
#endif

namespace hydra {
namespace {

#if HYDRA_CUDA
constexpr int64_t kConvWidth = 4;

struct InputPass {
  int64_t t, h, d;
  Tensor x{}, w{}, positions{}, out{}, inv_norm{}, dy{}, d_out{}, dx{}, dw{};  // on one device

  int64_t channels() const { return 3 * h * d; }
  ops::GdnQkParams params() const { return {.qk_heads = 2 * h, .head_dim = d, .rope_theta = 1e6, .l2_eps = 1e-6f}; }
  TensorView q_heads(const Tensor& m) const { return m.view().narrow(1, 0, h * d).split_dim(1, h, d); }

  void conv() const { ops::gdn_qkv_conv(out, inv_norm, x, w, Tensor(), positions, params()); }
  void qk_backward() const {
    ops::gdn_qk_backward(dy, dy, q_heads(out), inv_norm.view().narrow(1, 0, h), positions, params());
  }
  void conv_backward() const { ops::causal_conv_silu_backward(dx, dw, Tensor(), d_out, x, w, Tensor()); }
};

// The pass's tensors on the GPU, drawn from `seed`; positions 0..T−1 shifted by a million (the
// angles' fp64 reduction matters there).
InputPass make_pass(int64_t t, int64_t h, int64_t d, uint64_t seed) {
  const int64_t c = 3 * h * d;
  InputPass p{t, h, d};
  p.x = bench::random_device({t, c}, "gdn_input.x", seed);
  p.w = bench::random_device({c, kConvWidth}, "gdn_input.w", seed, DType::f32, Init::conv);
  Tensor pos = Tensor::empty({t}, DType::i64);
  for (int64_t i = 0; i < t; ++i) pos.data_as<int64_t>()[i] = 1000000 + i;
  p.positions = to_device(pos, Device::cuda);
  p.out = Tensor::empty({t, c}, DType::bf16, Device::cuda);
  p.inv_norm = Tensor::empty({t, 2 * h}, DType::f32, Device::cuda);
  p.dy = bench::random_device({t, h, d}, "gdn_input.dy", seed);
  p.d_out = bench::random_device({t, c}, "gdn_input.d_out", seed);
  p.dx = Tensor::empty({t, c}, DType::bf16, Device::cuda);
  p.dw = Tensor::zeros({c, kConvWidth}, DType::f32, Device::cuda);
  return p;
}

InputPass on_host(const InputPass& g) {
  auto f32 = [](const Tensor& x) { return to(x, Device::host, DType::f32); };
  InputPass p{g.t, g.h, g.d};
  p.x = f32(g.x);
  p.w = f32(g.w);
  p.positions = to(g.positions, Device::host, DType::i64);
  p.out = Tensor::empty(g.out.shape(), DType::f32);
  p.inv_norm = Tensor::empty(g.inv_norm.shape(), DType::f32);
  p.dy = f32(g.dy);
  p.d_out = f32(g.d_out);
  p.dx = Tensor::empty(g.dx.shape(), DType::f32);
  p.dw = Tensor::zeros(g.dw.shape(), DType::f32);
  return p;
}

// The three kernels at T = 300 against the CPU path, in the order a training step runs them (the
// q/k backward reads the conv's output and norms; on the host from the GPU's, rounded as it is).
nlohmann::json check(int64_t h, int64_t d) {
  const InputPass gpu = make_pass(300, h, d, 5);
  InputPass cpu = on_host(gpu);
  gpu.conv();
  cpu.conv();
  nlohmann::json report;
  auto expect = [&](const std::string& name, const TensorView& got, const TensorView& ref) {
    const double r = rms_ratio(got, ref);
    report[name] = r;
    log::info("gdn-input check {}: RMS error ratio {:.2e} (tolerance 1e-2)", name, r);
    HYDRA_ASSERT(r <= 1e-2, "gdn-input check failed: {} RMS error ratio {}", name, r);
  };
  expect("conv out", gpu.out, cpu.out);
  expect("conv inv_norm", gpu.inv_norm, cpu.inv_norm);
  cpu.out = to(gpu.out, Device::host, DType::f32);
  cpu.inv_norm = to(gpu.inv_norm, Device::host, DType::f32);
  gpu.qk_backward();
  cpu.qk_backward();
  expect("qk-bwd dx", gpu.dy, cpu.dy);
  gpu.conv_backward();
  cpu.conv_backward();
  expect("conv-bwd dx", gpu.dx, cpu.dx);
  expect("conv-bwd dw", gpu.dw, cpu.dw);
  return report;
}
#endif

}  // namespace

nlohmann::json bench_gdn_input(int64_t t, int64_t h, int64_t d, int warmup, int repeat) {
#if HYDRA_CUDA
  nlohmann::json report = {{"op", "gdn-input"}, {"seq_len", t}, {"heads", h}, {"head_dim", d}};
  report["check_rms_ratio"] = check(h, d);
  const InputPass p = make_pass(t, h, d, 9);
  const double act = static_cast<double>(t) * static_cast<double>(p.channels()) * 2;  // one bf16 [T, C] pass
  const double heads_act = static_cast<double>(t * h * d) * 2;                         // one bf16 [T, H, d]
  Tensor copy = Tensor::empty(p.x.shape(), DType::bf16, Device::cuda);
  const double copy_ms = bench::median_ms(warmup, repeat, [&] { copy_into(copy, p.x); });
  const double ceiling = 2 * act / (copy_ms * 1e-3) / 1e9;
  log::info("ceiling: device copy of {:.0f} MB at {:.0f} GB/s (read + write)", act / 1e6, ceiling);
  report["copy_gb_per_s"] = ceiling;
  struct Kernel {
    const char* name;
    double bytes;
    std::function<void()> run;
  };
  const Kernel kernels[] = {
      {"conv", 2 * act + static_cast<double>(t * 2 * h) * 4, [&] { p.conv(); }},
      {"qk-bwd", 3 * heads_act, [&] { p.qk_backward(); }},
      {"conv-bwd", 3 * act, [&] { p.conv_backward(); }},
  };
  p.conv();  // the q/k backward reads its output
  for (const Kernel& k : kernels) {
    const double ms = bench::median_ms(warmup, repeat, k.run);
    const double gbs = k.bytes / (ms * 1e-3) / 1e9;
    log::info("gdn-input {} T={} H={} d={}: {:.3f} ms, {:.0f} GB/s = {:.2f} of the copy's {:.0f} GB/s", k.name, t, h, d,
              ms, gbs, gbs / ceiling, ceiling);
    report[k.name] = {{"ms", ms}, {"gb_per_s", gbs}, {"fraction_of_copy", gbs / ceiling}};
  }
  return report;
#else
  (void)t, (void)h, (void)d, (void)warmup, (void)repeat;
  HYDRA_USER_FAIL("hydra bench needs the CUDA path; this build has HYDRA_CUDA=OFF");
#endif
}

}  // namespace hydra
