// The CPU reference of the attention ops (fp32 accumulation, or fp64 with double tensors): the
// forward blocked over 64 query rows, the merge of two blocks' results, and the backward. The
// entry points (attention.cpp) check shapes and dispatch here for host tensors.
#include "kernels/attention/attention_reference.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/attention/attention_mask.h"
#include "kernels/attention/attention_tau.h"
#include "kernels/common.h"
#include "kernels/matmul/matmul.h"

namespace hydra::ops::reference {
namespace {

constexpr int64_t kQueryBlock = 64;

// Softmax scale and τ(i): the factor query row i is multiplied by before its dot products, rounded
// to T as the forward rounds it (the backward must see the same scores).
template <class T>
T softmax_scale(const AttentionParams& p, int64_t d) {
  return p.scale > 0 ? static_cast<T>(p.scale) : T(1) / std::sqrt(static_cast<T>(d));
}

// s(q) of query row i (0 without documents), from a host view of q_document_start.
int64_t doc_start(const AttentionParams& p, int64_t i) {
  return p.q_document_start.defined() ? *at<const int64_t>(p.q_document_start, {i}) : 0;
}

template <class T>
T query_factor(const AttentionParams& p, T scale, int64_t i) {
  const int64_t position = mask::tau_position(p.q_position0 + i, doc_start(p, i));
  const double tau = tau_f64(position, p.tau_log_base);
  return static_cast<T>(static_cast<double>(scale) * tau);
}

int64_t kv_head(const AttentionParams& p, int64_t h, int64_t hq, int64_t hk) {
  const int64_t kvh = p.kv_head_of_query.empty() ? h / (hq / hk) : p.kv_head_of_query[h];
  HYDRA_ASSERT(kvh >= 0 && kvh < hk, "query head {} maps to KV head {} of {}", h, kvh, hk);
  return kvh;
}

// Keys [0, end) that some query of rows [q0, q0 + bq) may see, and how many row i sees.
int64_t block_key_end(const AttentionParams& p, int64_t q0, int64_t bq, int64_t tk) {
  if (p.causality != Causality::causal) return tk;
  return std::clamp<int64_t>(p.q_position0 + q0 + bq - 1 - p.k_position0 + 1, 0, tk);
}

// Row i sees keys [row_first, row_visible) of [0, kend): mask::visible as index ranges.
int64_t row_visible(const AttentionParams& p, int64_t i, int64_t kend) {
  if (p.causality != Causality::causal) return kend;
  return std::clamp<int64_t>(p.q_position0 + i - p.k_position0 + 1, 0, kend);
}
int64_t row_first(const AttentionParams& p, int64_t i, int64_t kend) {
  return std::clamp<int64_t>(doc_start(p, i) - p.k_position0, 0, kend);
}

// Keys [begin, kend) that some row of [q0, q0 + bq) may see: packed documents hide the keys before the
// block's earliest document start, so a block of short documents scores a short key range.
int64_t block_key_begin(const AttentionParams& p, int64_t q0, int64_t bq, int64_t kend) {
  int64_t begin = kend;
  for (int64_t i = 0; i < bq; ++i) begin = std::min(begin, row_first(p, q0 + i, kend));
  return begin;
}

template <class T>
TensorView matrix(std::vector<T>& buf, int64_t rows, int64_t cols) {
  return TensorView(buf.data(), dtype_of<T>(), Device::host, {rows, cols});
}

template <class T>
void attention_forward_cpu(const TensorView& out, const TensorView& lse, const TensorView& q, const TensorView& k,
                           const TensorView& v, const AttentionParams& p) {
  const int64_t tq = q.size(0), hq = q.size(1), d = q.size(2), tk = k.size(0), hk = k.size(1), dv = v.size(2);
  const T scale = softmax_scale<T>(p, d);
  const T neg_inf = -std::numeric_limits<T>::infinity();

  std::vector<T> qbuf(static_cast<size_t>(kQueryBlock * d));
  std::vector<T> scores(static_cast<size_t>(kQueryBlock * std::max<int64_t>(tk, 1)));
  std::vector<T> obuf(static_cast<size_t>(kQueryBlock * dv));
  for (int64_t h = 0; h < hq; ++h) {
    const int64_t kvh = kv_head(p, h, hq, hk);
    const TensorView kh = k.select(1, kvh), vh = v.select(1, kvh);  // [Tk, d], [Tk, dv]
    T* lse_h = at<T>(lse, {h});
    for (int64_t q0 = 0; q0 < tq; q0 += kQueryBlock) {
      const int64_t bq = std::min(kQueryBlock, tq - q0);
      const int64_t kend = block_key_end(p, q0, bq, tk);
      // Scores of keys [kb, kend) only (column j is key kb + j).
      const int64_t kb = block_key_begin(p, q0, bq, kend), kn = kend - kb;
      if (kn == 0) {  // no key of this block is visible to these queries
        for (int64_t i = 0; i < bq; ++i) {
          lse_h[q0 + i] = neg_inf;
          std::fill_n(at<T>(out, {q0 + i, h}), dv, T(0));
        }
        continue;
      }
      for (int64_t i = 0; i < bq; ++i) {
        const T* qr = at<const T>(q, {q0 + i, h});
        const T s = query_factor<T>(p, scale, q0 + i);
        for (int64_t c = 0; c < d; ++c) qbuf[i * d + c] = qr[c] * s;
      }
      const TensorView qv = matrix(qbuf, bq, d), sv = matrix(scores, bq, kn);
      gemm(sv, qv, kh.narrow(0, kb, kn), GemmParams{.transpose_b = Transpose::yes});
      for (int64_t i = 0; i < bq; ++i) {
        T* row = scores.data() + i * kn;
        const int64_t visible = row_visible(p, q0 + i, kend) - kb;
        const int64_t first = std::min(row_first(p, q0 + i, kend) - kb, visible);
        T m = neg_inf;
        for (int64_t j = first; j < visible; ++j) m = std::max(m, row[j]);
        double l = 0;
        for (int64_t j = 0; j < kn; ++j) {
          const T e = j >= first && j < visible ? std::exp(row[j] - m) : T(0);
          row[j] = e;
          l += e;
        }
        const bool any = visible > first;
        const T inv = any ? static_cast<T>(1.0 / l) : T(0);
        for (int64_t j = first; j < visible; ++j) row[j] *= inv;
        lse_h[q0 + i] = any ? m + static_cast<T>(std::log(l)) : neg_inf;
      }
      const TensorView ov = matrix(obuf, bq, dv);
      gemm(ov, sv, vh.narrow(0, kb, kn), GemmParams{});
      for (int64_t i = 0; i < bq; ++i) std::copy_n(obuf.data() + i * dv, dv, at<T>(out, {q0 + i, h}));
    }
  }
}

template <class T>
void attention_merge_cpu(const TensorView& out, const TensorView& lse, const TensorView& part_out,
                         const TensorView& part_lse) {
  const int64_t tq = out.size(0), hq = out.size(1), dv = out.size(2);
  for (int64_t h = 0; h < hq; ++h) {
    for (int64_t t = 0; t < tq; ++t) {
      T* l = at<T>(lse, {h, t});
      const T lp = *at<const T>(part_lse, {h, t});
      if (std::isinf(lp) && lp < 0) continue;  // the part saw no key
      T* o = at<T>(out, {t, h});
      const T* op = at<const T>(part_out, {t, h});
      if (std::isinf(*l) && *l < 0) {
        std::copy_n(op, dv, o);
        *l = lp;
        continue;
      }
      const T m = std::max(*l, lp);
      const T wa = std::exp(*l - m), wb = std::exp(lp - m);
      const T inv = T(1) / (wa + wb);
      for (int64_t c = 0; c < dv; ++c) o[c] = (wa * o[c] + wb * op[c]) * inv;
      *l = m + std::log(wa + wb);
    }
  }
}

template <class T>
void attention_backward_prepare_cpu(const TensorView& delta, const TensorView& d_out, const TensorView& out) {
  const int64_t tq = out.size(0), hq = out.size(1), dv = out.size(2);
  for (int64_t h = 0; h < hq; ++h) {
    for (int64_t t = 0; t < tq; ++t) {
      const T* o = at<const T>(out, {t, h});
      const T* dov = at<const T>(d_out, {t, h});
      double sum = 0;
      for (int64_t c = 0; c < dv; ++c) sum += static_cast<double>(dov[c]) * o[c];
      *at<T>(delta, {h, t}) = static_cast<T>(sum);
    }
  }
}

// Per query head and block of query rows: recompute S = (c ⊙ Q) Kᵀ with the forward's factors
// c_i = scale τ_i, P = exp(S − lse) on the visible keys (0 elsewhere, and on rows whose final lse
// is −inf), then dV += Pᵀ dO, dS = P ⊙ (dO Vᵀ − D), dK += dSᵀ (c ⊙ Q), dQ += c ⊙ (dS K).
template <class T>
void attention_backward_cpu(const TensorView& dq, const TensorView& dk, const TensorView& dv, const TensorView& d_out,
                            const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& lse,
                            const TensorView& delta, const AttentionParams& p) {
  const int64_t tq = q.size(0), hq = q.size(1), d = q.size(2), tk = k.size(0), hk = k.size(1);
  const T scale = softmax_scale<T>(p, d);
  const size_t kmax = static_cast<size_t>(std::max<int64_t>(tk, 1));
  std::vector<T> qs(static_cast<size_t>(kQueryBlock * d)), factor(static_cast<size_t>(kQueryBlock));
  std::vector<T> prob(kQueryBlock * kmax), dprob(kQueryBlock * kmax), dqbuf(static_cast<size_t>(kQueryBlock * d));
  for (int64_t h = 0; h < hq; ++h) {
    const int64_t kvh = kv_head(p, h, hq, hk);
    const TensorView kh = k.select(1, kvh), vh = v.select(1, kvh);      // [Tk, d], [Tk, dv]
    const TensorView dkh = dk.select(1, kvh), dvh = dv.select(1, kvh);  // accumulators
    for (int64_t q0 = 0; q0 < tq; q0 += kQueryBlock) {
      const int64_t bq = std::min(kQueryBlock, tq - q0);
      const int64_t kend = block_key_end(p, q0, bq, tk);
      if (kend == 0) continue;  // no key of this block is visible to these queries
      for (int64_t i = 0; i < bq; ++i) {
        const T* qr = at<const T>(q, {q0 + i, h});
        factor[i] = query_factor<T>(p, scale, q0 + i);
        for (int64_t c = 0; c < d; ++c) qs[i * d + c] = qr[c] * factor[i];
      }
      // Keys [kb, kend) only, as in the forward (column j is key kb + j).
      const int64_t kb = block_key_begin(p, q0, bq, kend), kn = kend - kb;
      if (kn == 0) continue;
      const TensorView qsv = matrix(qs, bq, d), pv = matrix(prob, bq, kn), dpv = matrix(dprob, bq, kn);
      const TensorView dob = d_out.select(1, h).narrow(0, q0, bq);  // [bq, dv]
      gemm(pv, qsv, kh.narrow(0, kb, kn), GemmParams{.transpose_b = Transpose::yes});
      gemm(dpv, dob, vh.narrow(0, kb, kn), GemmParams{.transpose_b = Transpose::yes});
      for (int64_t i = 0; i < bq; ++i) {
        T* pr = prob.data() + i * kn;
        T* dpr = dprob.data() + i * kn;
        const T l = *at<const T>(lse, {h, q0 + i}), dsum = *at<const T>(delta, {h, q0 + i});
        const int64_t visible = std::isinf(l) && l < 0 ? 0 : row_visible(p, q0 + i, kend) - kb;
        const int64_t first = row_first(p, q0 + i, kend) - kb;
        for (int64_t j = 0; j < kn; ++j) {
          const T pij = j >= first && j < visible ? std::exp(pr[j] - l) : T(0);
          pr[j] = pij;
          dpr[j] = pij * (dpr[j] - dsum);  // dS
        }
      }
      gemm(dvh.narrow(0, kb, kn), pv, dob, GemmParams{.transpose_a = Transpose::yes, .beta = 1.0f});
      gemm(dkh.narrow(0, kb, kn), dpv, qsv, GemmParams{.transpose_a = Transpose::yes, .beta = 1.0f});
      const TensorView dqv = matrix(dqbuf, bq, d);
      gemm(dqv, dpv, kh.narrow(0, kb, kn), GemmParams{});
      for (int64_t i = 0; i < bq; ++i) {
        T* row = at<T>(dq, {q0 + i, h});
        for (int64_t c = 0; c < d; ++c) row[c] += factor[i] * dqbuf[i * d + c];
      }
    }
  }
}

}  // namespace

void attention_forward(const TensorView& out, const TensorView& lse, const TensorView& q, const TensorView& k,
                       const TensorView& v, const AttentionParams& p) {
  with_host_float({{out, "out"}, {lse, "lse"}, {q, "q"}, {k, "k"}, {v, "v"}},
                  [&](auto zero) { attention_forward_cpu<decltype(zero)>(out, lse, q, k, v, p); });
}

void attention_merge(const TensorView& out, const TensorView& lse, const TensorView& part_out, const TensorView& part_lse) {
  with_host_float({{out, "out"}, {lse, "lse"}, {part_out, "part_out"}, {part_lse, "part_lse"}},
                  [&](auto zero) { attention_merge_cpu<decltype(zero)>(out, lse, part_out, part_lse); });
}

void attention_backward_prepare(const TensorView& delta, const TensorView& d_out, const TensorView& out) {
  with_host_float({{delta, "delta"}, {d_out, "d_out"}, {out, "out"}},
                  [&](auto zero) { attention_backward_prepare_cpu<decltype(zero)>(delta, d_out, out); });
}

void attention_backward(const TensorView& dq, const TensorView& dk, const TensorView& dv, const TensorView& d_out,
                        const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& lse,
                        const TensorView& delta, const AttentionParams& params) {
  with_host_float({{dq, "dq"}, {dk, "dk"}, {dv, "dv"}, {d_out, "d_out"}, {q, "q"}, {k, "k"}, {v, "v"},
                   {lse, "lse"}, {delta, "delta"}},
                  [&](auto zero) {
                    attention_backward_cpu<decltype(zero)>(dq, dk, dv, d_out, q, k, v, lse, delta, params);
                  });
}

}  // namespace hydra::ops::reference
