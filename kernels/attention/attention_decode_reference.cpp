// The CPU reference of the decode-step attention ops (attention_decode.h): the attention of one query
// row over its slot's cached keys in fp64, and the append of new rows into the cache; called by the
// entry points (attention_decode.cpp) for host tensors once shapes are checked.
#include "kernels/attention/attention_decode_reference.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/attention/attention_tau.h"
#include "kernels/common.h"

namespace hydra::ops::reference {
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

// The query row's factor scale·τ(position) in fp64, as attention_reference.cpp forms it.
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
  with_host_float({{out, "out"}, {lse, "lse"}, {q, "q"}, {k_cache, "k cache"}, {v_cache, "v cache"}}, [&](auto zero) {
    decode_cpu<decltype(zero)>(out, lse, q, k_cache, v_cache, slots, lengths, max_length, q_positions, params);
  });
}

void kv_cache_append(const TensorView& k_cache, const TensorView& v_cache, const TensorView& k_new,
                     const TensorView& v_new, const TensorView& slots, const TensorView& rows) {
  for (int64_t b = 0; b < k_new.size(0); ++b) {
    const int64_t row = index_at(rows, b), slot = slot_of(slots, b);
    if (row < 0) continue;
    HYDRA_ASSERT(slot >= 0 && slot < k_cache.size(0) && row < k_cache.size(1),
                 "append: row {} of slot {} outside a cache of {} slots x {} rows", row, slot, k_cache.size(0),
                 k_cache.size(1));
    copy_into(k_cache.select(0, slot).select(0, row), k_new.select(0, b));
    copy_into(v_cache.select(0, slot).select(0, row), v_new.select(0, b));
  }
}

}  // namespace hydra::ops::reference
