#include "kernels/attention/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/common.h"
#include "kernels/matmul/matmul.h"

namespace hydra::ops {
namespace {

constexpr int64_t kQueryBlock = 64;

void check_shapes(const TensorView& out, const TensorView& lse, const TensorView& q, const TensorView& k,
                  const TensorView& v, const AttentionParams& p) {
  expect_shape(q, "attention q", {{"Tq", -1}, {"Hq", -1}, {"d", -1}});
  expect_shape(k, "attention k", {{"Tk", -1}, {"Hk", -1}, {"d", q.size(2)}});
  expect_shape(v, "attention v", {{"Tk", k.size(0)}, {"Hk", k.size(1)}, {"dv", -1}});
  expect_shape(out, "attention out", {{"Tq", q.size(0)}, {"Hq", q.size(1)}, {"dv", v.size(2)}});
  expect_shape(lse, "attention lse", {{"Hq", q.size(1)}, {"Tq", q.size(0)}});
  HYDRA_ASSERT(p.kv_head_of_query.empty() ? q.size(1) % k.size(1) == 0
                                          : static_cast<int64_t>(p.kv_head_of_query.size()) == q.size(1),
               "attention: {} query heads, {} KV heads, mapping of {}", q.size(1), k.size(1),
               p.kv_head_of_query.size());
}

}  // namespace

double log_position_scale(int64_t position, double log_base) {
  return std::log(static_cast<double>(position) + log_base) / std::log(log_base);
}

void attention_forward(const TensorView& out, const TensorView& lse, const TensorView& q, const TensorView& k,
                       const TensorView& v, const AttentionParams& p) {
  check_shapes(out, lse, q, k, v, p);
  if (on_cuda({out, lse, q, k, v})) {
#if HYDRA_CUDA
    cuda_impl::attention_forward(out, lse, q, k, v, p);
    return;
#endif
  }
  if (p.output == AttentionOutput::merge) {
    // CPU: compute this block on its own, then merge; the CUDA kernel merges in its epilogue.
    Tensor part = Tensor::empty(out.shape(), DType::f32), part_lse = Tensor::empty(lse.shape(), DType::f32);
    AttentionParams fresh = p;
    fresh.output = AttentionOutput::overwrite;
    attention_forward(part, part_lse, q, k, v, fresh);
    attention_merge(out, lse, part, part_lse);
    return;
  }
  for (const auto& [view, name] : {std::pair{out, "out"}, {lse, "lse"}, {q, "q"}, {k, "k"}, {v, "v"}}) {
    expect_host_f32(view, name);
  }
  const int64_t tq = q.size(0), hq = q.size(1), d = q.size(2), tk = k.size(0), hk = k.size(1), dv = v.size(2);
  const float scale = p.scale > 0 ? p.scale : 1.0f / std::sqrt(static_cast<float>(d));
  const bool causal = p.causality == Causality::causal;
  const float neg_inf = -std::numeric_limits<float>::infinity();

  std::vector<float> qbuf(static_cast<size_t>(kQueryBlock * d));
  std::vector<float> scores(static_cast<size_t>(kQueryBlock * std::max<int64_t>(tk, 1)));
  std::vector<float> obuf(static_cast<size_t>(kQueryBlock * dv));
  for (int64_t h = 0; h < hq; ++h) {
    const int64_t kvh = p.kv_head_of_query.empty() ? h / (hq / hk) : p.kv_head_of_query[h];
    HYDRA_ASSERT(kvh >= 0 && kvh < hk, "query head {} maps to KV head {} of {}", h, kvh, hk);
    const TensorView kh = k.select(1, kvh), vh = v.select(1, kvh);  // [Tk, d], [Tk, dv]
    float* lse_h = static_cast<float*>(lse.element_ptr({h}));
    for (int64_t q0 = 0; q0 < tq; q0 += kQueryBlock) {
      const int64_t bq = std::min(kQueryBlock, tq - q0);
      // Keys any query of the block may see: positions up to the block's last query.
      int64_t kend = tk;
      if (causal) kend = std::clamp<int64_t>(p.q_position0 + q0 + bq - 1 - p.k_position0 + 1, 0, tk);
      if (kend == 0) {
        for (int64_t i = 0; i < bq; ++i) {
          lse_h[q0 + i] = neg_inf;
          std::fill_n(static_cast<float*>(out.element_ptr({q0 + i, h})), dv, 0.0f);
        }
        continue;
      }
      for (int64_t i = 0; i < bq; ++i) {
        const float* qr = static_cast<const float*>(q.element_ptr({q0 + i, h}));
        const double tau = p.tau_log_base > 0 ? log_position_scale(p.q_position0 + q0 + i, p.tau_log_base) : 1.0;
        const float s = static_cast<float>(scale * tau);
        for (int64_t c = 0; c < d; ++c) qbuf[i * d + c] = qr[c] * s;
      }
      const TensorView qv(qbuf.data(), DType::f32, Device::host, {bq, d});
      const TensorView sv(scores.data(), DType::f32, Device::host, {bq, kend});
      gemm(sv, qv, kh.narrow(0, 0, kend), GemmParams{.transpose_b = Transpose::yes});
      for (int64_t i = 0; i < bq; ++i) {
        float* row = scores.data() + i * kend;
        const int64_t visible =
            causal ? std::clamp<int64_t>(p.q_position0 + q0 + i - p.k_position0 + 1, 0, kend) : kend;
        float m = neg_inf;
        for (int64_t j = 0; j < visible; ++j) m = std::max(m, row[j]);
        double l = 0;
        for (int64_t j = 0; j < kend; ++j) {
          const float e = j < visible ? std::exp(row[j] - m) : 0.0f;
          row[j] = e;
          l += e;
        }
        const float inv = visible > 0 ? static_cast<float>(1.0 / l) : 0.0f;
        for (int64_t j = 0; j < visible; ++j) row[j] *= inv;
        lse_h[q0 + i] = visible > 0 ? m + static_cast<float>(std::log(l)) : neg_inf;
      }
      const TensorView ov(obuf.data(), DType::f32, Device::host, {bq, dv});
      gemm(ov, sv, vh.narrow(0, 0, kend), GemmParams{});
      for (int64_t i = 0; i < bq; ++i) {
        std::copy_n(obuf.data() + i * dv, dv, static_cast<float*>(out.element_ptr({q0 + i, h})));
      }
    }
  }
}

void attention_merge(const TensorView& out, const TensorView& lse, const TensorView& part_out,
                     const TensorView& part_lse) {
  expect_shape(out, "merge out", {{"Tq", -1}, {"Hq", -1}, {"dv", -1}});
  expect_shape(part_out, "merge part_out", {{"Tq", out.size(0)}, {"Hq", out.size(1)}, {"dv", out.size(2)}});
  expect_shape(lse, "merge lse", {{"Hq", out.size(1)}, {"Tq", out.size(0)}});
  expect_shape(part_lse, "merge part_lse", {{"Hq", out.size(1)}, {"Tq", out.size(0)}});
  for (const auto& [view, name] : {std::pair{out, "out"}, {lse, "lse"}, {part_out, "part_out"}, {part_lse, "part_lse"}}) {
    expect_host_f32(view, name);
  }
  const int64_t tq = out.size(0), hq = out.size(1), dv = out.size(2);
  for (int64_t h = 0; h < hq; ++h) {
    for (int64_t t = 0; t < tq; ++t) {
      float* l = static_cast<float*>(lse.element_ptr({h, t}));
      const float lp = *static_cast<const float*>(part_lse.element_ptr({h, t}));
      if (std::isinf(lp) && lp < 0) continue;  // the part saw no key
      float* o = static_cast<float*>(out.element_ptr({t, h}));
      const float* op = static_cast<const float*>(part_out.element_ptr({t, h}));
      if (std::isinf(*l) && *l < 0) {
        std::copy_n(op, dv, o);
        *l = lp;
        continue;
      }
      const float m = std::max(*l, lp);
      const float wa = std::exp(*l - m), wb = std::exp(lp - m);
      const float inv = 1.0f / (wa + wb);
      for (int64_t c = 0; c < dv; ++c) o[c] = (wa * o[c] + wb * op[c]) * inv;
      *l = m + std::log(wa + wb);
    }
  }
}

}  // namespace hydra::ops
