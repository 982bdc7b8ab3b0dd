#include "launch/bench/gemv.h"

#include <algorithm>

#include "runtime/error.h"
#if HYDRA_CUDA
#include "kernels/argmax/argmax.h"
#include "kernels/matmul/matmul.h"
#include "launch/bench/decode.h"
#include "launch/bench/util.h"
#include "model/config.h"
#include "model/weight_layout.h"
#include "runtime/cuda_memory.h"
#include "runtime/error.h"
#include "runtime/log.h"
#include "runtime/programmatic_launch.h"
#endif

namespace hydra {
#if HYDRA_CUDA
namespace {

constexpr double kWeightsPerRound = 512.0 * 1024 * 1024;  // bytes of weight copies a round streams (L2: 50 MB)

struct Projection {
  std::string name;
  int64_t n, k;
  ops::Accumulate accumulate;  // the residual's projections add into their output
};

std::vector<Projection> projections(const std::string& preset) {
  const ModelConfig c = preset_config(preset);
  const LayerLayout l = layer_layout(c, 0);
  std::vector<Projection> out;
  for (const Slot slot : {Slot::in_proj, Slot::o_proj, Slot::mlp_in, Slot::mlp_down}) {
    const std::vector<int64_t> s = l.shape(slot, c);
    const bool adds = slot == Slot::o_proj || slot == Slot::mlp_down;
    out.push_back({runtime_name(0, slot), s[0], s[1], adds ? ops::Accumulate::yes : ops::Accumulate::no});
  }
  return out;
}

double device_copy_gb_per_s() {
  Tensor a = Tensor::zeros({int64_t{1} << 29}, DType::bf16, Device::cuda), b = Tensor::empty({int64_t{1} << 29}, DType::bf16, Device::cuda);
  const double ms = bench::median_ms(2, 5, [&] { copy_into(b, a); });
  return 2.0 * static_cast<double>(a.nbytes()) / (ms * 1e-3) / 1e9;
}

}  // namespace

void bench_gemv(const GemvBenchOptions& opt, const std::function<void(const nlohmann::json&)>& emit) {
  const std::string gpu = cuda_device_name();
  const double copy = device_copy_gb_per_s(), datasheet = datasheet_bandwidth_gb_per_s(gpu);
  log::info("ceiling: {}: device copy of 1 GiB at {:.0f} GB/s (read + write), datasheet {:.0f} GB/s", gpu, copy, datasheet);
  for (const Projection& p : projections(opt.preset)) {
    const double weight_bytes = 2.0 * static_cast<double>(p.n * p.k);
    const int64_t copies = std::max<int64_t>(2, static_cast<int64_t>(kWeightsPerRound / weight_bytes + 0.5));
    const Tensor weights = bench::random_device({copies * p.n, p.k}, "bench.gemv.w." + p.name, 21);
    const auto weight = [&](int64_t i) { return weights.view().narrow(0, i * p.n, p.n); };
    for (const int64_t m : opt.batches) {
      const Tensor x = bench::random_device({m, p.k}, "bench.gemv.x." + p.name, 22);
      const Tensor old = bench::random_device({m, p.n}, "bench.gemv.out." + p.name, 23);
      Tensor out = clone(old);
      // Correctness first: every tuning on copy 0 against the float64 CPU sum of the same bf16 values.
      Tensor ref = to(old, Device::host, DType::f32);
      ops::gemv(ref, to(x, Device::host, DType::f32), to(weight(0), Device::host, DType::f32), p.accumulate);
      for (const ops::GemvTuning& t : opt.tunings) {
        copy_into(out, old);
        ops::gemv(out, x, weight(0), p.accumulate, t);
        const double err = rms_ratio(to(out, Device::host, DType::f32), ref);
        HYDRA_ASSERT(err < 1e-2, "GEMV bench check failed: {} at {} rows ({}): rms error {}", p.name, m,
                     ops::gemv_tuning_name(t), err);
      }
      const double bytes = weight_bytes + 2.0 * static_cast<double>(m * p.k + m * p.n * (p.accumulate == ops::Accumulate::yes ? 2 : 1));
      const auto report = [&](const std::string& variant, bool pdl, double ms_per_round) {
        const double us = ms_per_round * 1e3 / static_cast<double>(copies), gb_per_s = bytes / (us * 1e-6) / 1e9;
        log::info("gemv {} [{}, {}] at {} rows, {}{}: {:.2f} us, {:.0f} GB/s = {:.3f} of the copy, {:.3f} of the datasheet",
                  p.name, p.n, p.k, m, variant, pdl ? " + PDL" : "", us, gb_per_s, gb_per_s / copy,
                  datasheet > 0 ? gb_per_s / datasheet : 0.0);
        emit({{"command", "bench"}, {"op", "gemv"}, {"gpu", gpu}, {"projection", p.name}, {"n", p.n}, {"k", p.k},
              {"rows", m}, {"variant", variant}, {"pdl", pdl}, {"us", us}, {"gb_per_s", gb_per_s},
              {"fraction_of_copy", gb_per_s / copy}, {"copy_gb_per_s", copy}, {"datasheet_gb_per_s", datasheet},
              {"copies_per_round", copies}});
      };
      for (const bool pdl : {false, true}) {
        const ProgrammaticLaunchScope scope(pdl);
        for (const ops::GemvTuning& t : opt.tunings) {
          report(ops::gemv_tuning_name(t), pdl, bench::median_ms(opt.warmup, opt.repeat, [&] {
                   for (int64_t i = 0; i < copies; ++i) ops::gemv(out, x, weight(i), p.accumulate, t);
                 }));
        }
      }
      report("cublas", false, bench::median_ms(opt.warmup, opt.repeat, [&] {
               for (int64_t i = 0; i < copies; ++i) ops::linear(out, x, weight(i), p.accumulate);
             }));
    }
  }
  // The greedy step's arg-max over the vocabulary (the logits just written: timed as found, in L2 or not).
  const int64_t vocab = preset_config(opt.preset).vocab_size;
  for (const int64_t m : opt.batches) {
    const Tensor logits = bench::random_device({m, vocab}, "bench.argmax.logits", 24, DType::f32);
    Tensor ids = Tensor::empty({m}, DType::i32, Device::cuda), ref = Tensor::empty({m}, DType::i32);
    ops::row_argmax(ids, logits);
    ops::row_argmax(ref, to(logits, Device::host, DType::f32));
    const Tensor got = to(ids, Device::host, DType::i32);
    for (int64_t b = 0; b < m; ++b) {
      HYDRA_ASSERT(got.data_as<int32_t>()[b] == ref.data_as<int32_t>()[b], "argmax bench check failed at row {}: {} vs {}",
                   b, got.data_as<int32_t>()[b], ref.data_as<int32_t>()[b]);
    }
    const double us = 1e3 * bench::median_ms(opt.warmup, opt.repeat, [&] { ops::row_argmax(ids, logits); });
    const double gb_per_s = 4.0 * static_cast<double>(m * vocab) / (us * 1e-6) / 1e9;
    log::info("row_argmax [{}, {}]: {:.2f} us, {:.0f} GB/s", m, vocab, us, gb_per_s);
    emit({{"command", "bench"}, {"op", "argmax"}, {"gpu", gpu}, {"rows", m}, {"vocab", vocab}, {"us", us},
          {"gb_per_s", gb_per_s}});
  }
}

#else
void bench_gemv(const GemvBenchOptions&, const std::function<void(const nlohmann::json&)>&) {
  HYDRA_USER_FAIL("hydra bench --op gemv needs the CUDA path; this build has HYDRA_CUDA=OFF");
}
#endif

}  // namespace hydra
