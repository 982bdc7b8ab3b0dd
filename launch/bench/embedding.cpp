// hydra bench --op embedding-bwd: d_table [V, D] += the fp32 rows of d_out [T, D] scattered by the
// token ids (ops::embedding_backward), timed alone for two id patterns:
//   skewed   id = ⌊V u⁴⌋ for uniform u: id 0 takes V^(−1/4) of the tokens (21% at V = 512, a run of
//            ~3500 in qwen3-synth's 16384-token step), the long runs a small vocabulary makes;
//   uniform  id = ⌊V u⌋: runs of T/V.
// First the kernel runs at T = 3000 on the GPU and on the CPU reference (RMS error ratio ≤ 1e-5:
// fp32 sums in another order). GB/s counts the bytes it must move once: d_out read, each id's row of
// d_table read and written, the ids read (the sort's own passes are not counted), beside a device
// copy of d_out measured in the same run (read + write: the bandwidth the kernel can reach).
#include "launch/bench/embedding.h"

#include <random>
#include <set>

#include "kernels/embedding/embedding.h"
#include "runtime/log.h"
#if HYDRA_CUDA
#include "launch/bench/util.h"
#include "runtime/cuda_memory.h"
#endif

namespace hydra {
namespace {

#if HYDRA_CUDA
enum class Ids { skewed, uniform };

Tensor make_ids(int64_t t, int64_t vocab, Ids pattern) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  Tensor ids = Tensor::empty({t}, DType::i32);
  for (int64_t i = 0; i < t; ++i) {
    const double x = u(rng), y = pattern == Ids::skewed ? x * x * x * x : x;
    ids.data_as<int32_t>()[i] = static_cast<int32_t>(std::min<int64_t>(static_cast<int64_t>(vocab * y), vocab - 1));
  }
  return ids;
}

void check(int64_t vocab, int64_t dim) {
  const int64_t t = 3000;
  const Tensor ids = make_ids(t, vocab, Ids::skewed);
  const Tensor d_out = bench::random_device({t, dim}, "embedding.d_out", 3, DType::f32);
  Tensor got = Tensor::zeros({vocab, dim}, DType::f32, Device::cuda), ref = Tensor::zeros({vocab, dim}, DType::f32);
  ops::embedding_backward(got, d_out, to_device(ids, Device::cuda));
  ops::embedding_backward(ref, to(d_out, Device::host, DType::f32), ids);
  const double r = rms_ratio(to(got, Device::host, DType::f32), ref);
  log::info("embedding-bwd check V={} D={} T={}: RMS error ratio {:.2e} (tolerance 1e-5)", vocab, dim, t, r);
  HYDRA_ASSERT(r <= 1e-5, "embedding-bwd check failed: RMS error ratio {}", r);
}
#endif

}  // namespace

nlohmann::json bench_embedding_backward(int64_t tokens, int64_t vocab, int64_t dim, int warmup, int repeat) {
#if HYDRA_CUDA
  check(vocab, dim);
  nlohmann::json report = {{"op", "embedding-bwd"}, {"tokens", tokens}, {"vocab", vocab}, {"dim", dim}};
  const Tensor d_out = bench::random_device({tokens, dim}, "embedding.d_out", 9, DType::f32);
  Tensor d_table = Tensor::zeros({vocab, dim}, DType::f32, Device::cuda);
  Tensor copy = Tensor::empty({tokens, dim}, DType::f32, Device::cuda);
  const double rows_bytes = static_cast<double>(tokens) * static_cast<double>(dim) * 4;
  const double copy_ms = bench::median_ms(warmup, repeat, [&] { copy_into(copy, d_out); });
  const double ceiling = 2 * rows_bytes / (copy_ms * 1e-3) / 1e9;
  log::info("ceiling: device copy of {:.1f} MB at {:.0f} GB/s (read + write)", rows_bytes / 1e6, ceiling);
  report["copy_gb_per_s"] = ceiling;
  for (const auto& [name, pattern] : {std::pair{"skewed", Ids::skewed}, std::pair{"uniform", Ids::uniform}}) {
    const Tensor ids = make_ids(tokens, vocab, pattern);
    const std::set<int32_t> distinct(ids.data_as<int32_t>(), ids.data_as<int32_t>() + tokens);
    const Tensor gids = to_device(ids, Device::cuda);
    const double ms = bench::median_ms(warmup, repeat, [&] { ops::embedding_backward(d_table, d_out, gids); });
    const double bytes = rows_bytes + 2.0 * static_cast<double>(distinct.size()) * static_cast<double>(dim) * 4 +
                         4.0 * static_cast<double>(tokens);
    const double gbs = bytes / (ms * 1e-3) / 1e9;
    log::info("embedding-bwd {} ids T={} V={} D={} ({} distinct): {:.1f} us, {:.0f} GB/s = {:.2f} of the copy's {:.0f} GB/s",
              name, tokens, vocab, dim, distinct.size(), ms * 1e3, gbs, gbs / ceiling, ceiling);
    report[name] = {{"us", ms * 1e3}, {"distinct_ids", distinct.size()}, {"gb_per_s", gbs}, {"fraction_of_copy", gbs / ceiling}};
  }
  return report;
#else
  (void)tokens, (void)vocab, (void)dim, (void)warmup, (void)repeat;
  HYDRA_USER_FAIL("hydra bench needs the CUDA path; this build has HYDRA_CUDA=OFF");
#endif
}

}  // namespace hydra
