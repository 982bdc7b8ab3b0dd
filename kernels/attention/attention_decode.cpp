// Dispatchers and CPU references of the decode-step attention ops (attention_decode.h).
#include "kernels/attention/attention_decode.h"
#include "kernels/attention/attention_tau.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/common.h"

namespace hydra::ops {
namespace {

int64_t index_at(const TensorView& v, int64_t b) {  // host int32 entry b
  return static_cast<int64_t>(*static_cast<const int32_t*>(v.element_ptr({b})));
}

int64_t slot_of(const TensorView& slots, int64_t b) { return slots.defined() ? index_at(slots, b) : b; }

int64_t kv_head_of(const AttentionParams& p, int64_t h, int64_t hq, int64_t hk) {
  const int64_t kvh = p.kv_head_of_query.empty() ? h / (hq / hk) : p.kv_head_of_query[static_cast<size_t>(h)];
  HYDRA_ASSERT(kvh >= 0 && kvh < hk, "decode attention: query head {} maps to KV head {} of {}", h, kvh, hk);
  return kvh;
}

void check_index_vector(const TensorView& v, const char* what, int64_t rows) {
  expect_shape(v, what, {{"B", rows}});
  expect_dtype(v, what, DType::i32);
}

// The query row's factor scale·τ(position) in fp64, as attention.cpp forms it.
double query_factor(const AttentionParams& p, double scale, const TensorView& positions, int64_t b) {
  if (p.tau_log_base <= 0) return scale;
  const int64_t pos = *static_cast<const int64_t*>(positions.element_ptr({b}));
  return scale * tau_f64(pos, p.tau_log_base);
}

template <class T>
void decode_cpu(const TensorView& out, const TensorView& lse, const TensorView& q, const TensorView& k_cache,
                const TensorView& v_cache, const TensorView& slots, const TensorView& lengths, int64_t max_length,
                const TensorView& q_positions, const AttentionParams& p) {
  const int64_t rows = q.size(0), hq = q.size(1), d = q.size(2), hk = k_cache.size(2), dv = v_cache.size(3);
  const double scale = p.scale > 0 ? p.scale : 1.0 / std::sqrt(static_cast<double>(d));
  std::vector<double> scores, acc(static_cast<size_t>(dv));
  for (int64_t b = 0; b < rows; ++b) {
    const int64_t slot = slot_of(slots, b), n = index_at(lengths, b);
    HYDRA_ASSERT(slot >= 0 && slot < k_cache.size(0) && n >= 0 && n <= max_length,
                 "decode attention: row {} reads {} keys of slot {} (cache of {} slots x {} rows)", b, n, slot,
                 k_cache.size(0), k_cache.size(1));
    const double factor = query_factor(p, scale, q_positions, b);
    scores.assign(static_cast<size_t>(n), 0.0);
    for (int64_t h = 0; h < hq; ++h) {
      const int64_t kvh = kv_head_of(p, h, hq, hk);
      const T* qr = at<const T>(q, {b, h});
      T* o = at<T>(out, {b, h});
      T* l = at<T>(lse, {h, b});
      if (n == 0) {
        std::fill_n(o, dv, T(0));
        *l = -std::numeric_limits<T>::infinity();
        continue;
      }
      double m = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < n; ++j) {
        const T* kr = at<const T>(k_cache, {slot, j, kvh});
        double s = 0;
        for (int64_t c = 0; c < d; ++c) s += static_cast<double>(qr[c]) * kr[c];
        scores[static_cast<size_t>(j)] = s * factor;
        m = std::max(m, s * factor);
      }
      double sum = 0;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t j = 0; j < n; ++j) {
        const double e = std::exp(scores[static_cast<size_t>(j)] - m);
        sum += e;
        const T* vr = at<const T>(v_cache, {slot, j, kvh});
        for (int64_t c = 0; c < dv; ++c) acc[static_cast<size_t>(c)] += e * vr[c];
      }
      for (int64_t c = 0; c < dv; ++c) o[c] = static_cast<T>(acc[static_cast<size_t>(c)] / sum);
      *l = static_cast<T>(m + std::log(sum));
    }
  }
}

}  // namespace

void attention_decode(const TensorView& out, const TensorView& lse, const TensorView& q, const TensorView& k_cache,
                      const TensorView& v_cache, const TensorView& slots, const TensorView& lengths,
                      int64_t max_length, const TensorView& q_positions, const AttentionParams& params) {
  expect_shape(q, "decode q", {{"B", -1}, {"Hq", -1}, {"d", -1}});
  const int64_t rows = q.size(0), hq = q.size(1), d = q.size(2);
  expect_shape(k_cache, "decode k cache", {{"S", -1}, {"cap", -1}, {"Hk", -1}, {"d", d}});
  expect_shape(v_cache, "decode v cache", {{"S", k_cache.size(0)}, {"cap", k_cache.size(1)}, {"Hk", k_cache.size(2)}, {"dv", -1}});
  const int64_t hk = k_cache.size(2), dv = v_cache.size(3);
  expect_shape(out, "decode out", {{"B", rows}, {"Hq", hq}, {"dv", dv}});
  expect_shape(lse, "decode lse", {{"Hq", hq}, {"B", rows}});
  HYDRA_ASSERT(params.kv_head_of_query.empty() ? hq % hk == 0 : static_cast<int64_t>(params.kv_head_of_query.size()) == hq,
               "decode attention: {} query heads, {} KV heads, mapping of {}", hq, hk, params.kv_head_of_query.size());
  if (slots.defined()) check_index_vector(slots, "decode slots", rows);
  check_index_vector(lengths, "decode lengths", rows);
  if (params.tau_log_base > 0) {
    expect_shape(q_positions, "decode positions", {{"B", rows}});
    expect_dtype(q_positions, "decode positions", DType::i64);
  }
  HYDRA_ASSERT(max_length >= 0 && max_length <= k_cache.size(1), "decode attention: at most {} keys in a cache of {} rows",
               max_length, k_cache.size(1));
  if (shapes_only({out, lse, q, k_cache, v_cache, slots, lengths, q_positions})) return;
  if (on_cuda({out, lse, q, k_cache, v_cache, slots, lengths, q_positions})) {
#if HYDRA_CUDA
    cuda_impl::attention_decode(out, lse, q, k_cache, v_cache, slots, lengths, max_length, q_positions, params);
    return;
#endif
  }
  with_host_float({{out, "out"}, {lse, "lse"}, {q, "q"}, {k_cache, "k cache"}, {v_cache, "v cache"}}, [&](auto zero) {
    decode_cpu<decltype(zero)>(out, lse, q, k_cache, v_cache, slots, lengths, max_length, q_positions, params);
  });
}

void kv_cache_append(const TensorView& k_cache, const TensorView& v_cache, const TensorView& k_new,
                     const TensorView& v_new, const TensorView& slots, const TensorView& rows) {
  expect_shape(k_new, "append k", {{"B", -1}, {"Hk", -1}, {"d", -1}});
  const int64_t n = k_new.size(0);
  expect_shape(v_new, "append v", {{"B", n}, {"Hk", k_new.size(1)}, {"dv", -1}});
  expect_shape(k_cache, "append k cache", {{"S", -1}, {"cap", -1}, {"Hk", k_new.size(1)}, {"d", k_new.size(2)}});
  expect_shape(v_cache, "append v cache", {{"S", k_cache.size(0)}, {"cap", k_cache.size(1)}, {"Hk", k_new.size(1)}, {"dv", v_new.size(2)}});
  if (slots.defined()) check_index_vector(slots, "append slots", n);
  check_index_vector(rows, "append rows", n);
  HYDRA_ASSERT(k_cache.dtype() == k_new.dtype() && v_cache.dtype() == v_new.dtype(), "append: cache {} / rows {}",
               dtype_name(k_cache.dtype()), dtype_name(k_new.dtype()));
  if (shapes_only({k_cache, v_cache, k_new, v_new, slots, rows})) return;
  if (on_cuda({k_cache, v_cache, k_new, v_new, slots, rows})) {
#if HYDRA_CUDA
    cuda_impl::kv_cache_append(k_cache, v_cache, k_new, v_new, slots, rows);
    return;
#endif
  }
  for (int64_t b = 0; b < n; ++b) {
    const int64_t row = index_at(rows, b), slot = slot_of(slots, b);
    if (row < 0) continue;
    HYDRA_ASSERT(slot >= 0 && slot < k_cache.size(0) && row < k_cache.size(1),
                 "append: row {} of slot {} outside a cache of {} slots x {} rows", row, slot, k_cache.size(0),
                 k_cache.size(1));
    copy_into(k_cache.select(0, slot).select(0, row), k_new.select(0, b));
    copy_into(v_cache.select(0, slot).select(0, row), v_new.select(0, b));
  }
}

void attention_merge_partials(const TensorView& out, const TensorView& lse, const TensorView& part_out,
                              const TensorView& part_lse) {
  expect_shape(part_out, "merge parts out", {{"n", -1}, {"B", -1}, {"Hq", -1}, {"dv", -1}});
  const int64_t n = part_out.size(0), rows = part_out.size(1), hq = part_out.size(2), dv = part_out.size(3);
  expect_shape(part_lse, "merge parts lse", {{"n", n}, {"Hq", hq}, {"B", rows}});
  expect_shape(out, "merge out", {{"B", rows}, {"Hq", hq}, {"dv", dv}});
  expect_shape(lse, "merge lse", {{"Hq", hq}, {"B", rows}});
  if (shapes_only({out, lse, part_out, part_lse})) return;
  if (on_cuda({out, lse, part_out, part_lse})) {
#if HYDRA_CUDA
    cuda_impl::attention_merge_partials(out, lse, part_out, part_lse);
    return;
#endif
  }
  fill(out, 0.0);
  fill(lse, -std::numeric_limits<double>::infinity());
  for (int64_t i = 0; i < n; ++i) attention_merge(out, lse, part_out.select(0, i), part_lse.select(0, i));
}

}  // namespace hydra::ops
