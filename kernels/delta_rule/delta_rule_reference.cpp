// The CPU reference of the gated delta rule's forward forms (delta_rule.h): the recurrent oracle, the
// chunked WY/UT form, the segment map and its application; called by the entry points (delta_rule.cpp)
// for host tensors once shapes are checked. The backward's reference is delta_rule_backward_reference.cpp.
#include "kernels/delta_rule/delta_rule_reference.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/common.h"
#include "kernels/delta_rule/delta_rule_cpu.h"
#include "kernels/matmul/matmul.h"

namespace hydra::ops::reference {
namespace {

using delta_cpu::Chunk;
using delta_cpu::Dims;
using delta_cpu::Mat;
using delta_cpu::value_at;

TensorView state_of(const TensorView& state, int64_t h) { return state.select(0, h); }  // [dk, dv]

template <class T>
void recurrent_cpu(const TensorView& out, const TensorView& state, const TensorView& q, const TensorView& k,
                   const TensorView& v, const TensorView& g, const TensorView& beta, const DeltaRuleParams& params,
                   const Dims& d) {
  const double scale = params.scale > 0 ? params.scale : 1.0 / std::sqrt(static_cast<double>(d.dk));
  std::vector<double> s(static_cast<size_t>(d.dk * d.dv)), delta(static_cast<size_t>(d.dv));
  for (int64_t h = 0; h < d.h; ++h) {
    T* sh = at<T>(state, {h});
    std::copy_n(sh, d.dk * d.dv, s.begin());
    for (int64_t t = 0; t < d.t; ++t) {
      const T* kt = at<const T>(k, {t, h});
      const T* vt = at<const T>(v, {t, h});
      const T* qt = at<const T>(q, {t, h});
      const double decay = std::exp(static_cast<double>(value_at<T>(g, t, h)));
      const double b = value_at<T>(beta, t, h);
      for (double& x : s) x *= decay;
      for (int64_t j = 0; j < d.dv; ++j) {
        double kv = 0;
        for (int64_t i = 0; i < d.dk; ++i) kv += s[i * d.dv + j] * kt[i];
        delta[j] = b * (vt[j] - kv);
      }
      for (int64_t i = 0; i < d.dk; ++i)
        for (int64_t j = 0; j < d.dv; ++j) s[i * d.dv + j] += kt[i] * delta[j];
      T* ot = at<T>(out, {t, h});
      for (int64_t j = 0; j < d.dv; ++j) {
        double o = 0;
        for (int64_t i = 0; i < d.dk; ++i) o += s[i * d.dv + j] * qt[i];
        ot[j] = static_cast<T>(o * scale);
      }
    }
    for (int64_t i = 0; i < d.dk * d.dv; ++i) sh[i] = static_cast<T>(s[i]);
  }
}

template <class T>
void chunked_cpu(const TensorView& out, const TensorView& state, const TensorView& q, const TensorView& k,
                 const TensorView& v, const TensorView& g, const TensorView& beta, const DeltaRuleParams& params,
                 const Dims& d) {
  const T scale = params.scale > 0 ? static_cast<T>(params.scale) : T(1) / std::sqrt(static_cast<T>(d.dk));
  const int64_t cs = params.chunk;
  Chunk<T> c(cs, d.dk, d.dv);
  Mat<T> vnew(cs, d.dv), attn(cs, cs), o(cs, d.dv), qdecay(cs, d.dk);
  for (int64_t h = 0; h < d.h; ++h) {
    const TensorView s = state_of(state, h);
    for (int64_t t0 = 0; t0 < d.t; t0 += cs) {
      const int64_t n = std::min(cs, d.t - t0);
      c.build(&q, &v, k, g, beta, h, t0, n, scale);
      delta_cpu::chunk_scores(c, attn, qdecay);
      // O = (e^γ ⊙ Q) S + attn (U − W S), then S advances.
      gemm(o.top(n), qdecay.top(n), s, GemmParams{});
      delta_cpu::advance_state(c, s, vnew);
      gemm(o.top(n), attn.square(n), vnew.top(n), GemmParams{.beta = 1.0f});
      for (int64_t i = 0; i < n; ++i) std::copy_n(o.row(i), d.dv, at<T>(out, {t0 + i, h}));
    }
  }
}

template <class T>
void segment_map_cpu(const TensorView& m, const TensorView& s_ext, const TensorView& k, const TensorView& v,
                     const TensorView& g, const TensorView& beta, const DeltaRuleParams& params, const Dims& d) {
  const int64_t cs = params.chunk;
  Chunk<T> c(cs, d.dk, d.dv);
  Mat<T> vnew(cs, d.dv), wm(cs, d.dk);
  for (int64_t h = 0; h < d.h; ++h) {
    const TensorView mh = m.select(0, h), sh = s_ext.select(0, h);
    fill(mh, 0.0);
    for (int64_t i = 0; i < d.dk; ++i) *at<T>(mh, {i, i}) = T(1);
    fill(sh, 0.0);
    for (int64_t t0 = 0; t0 < d.t; t0 += cs) {
      const int64_t n = std::min(cs, d.t - t0);
      c.build(nullptr, &v, k, g, beta, h, t0, n, T(1));
      // M ← e^{γ_C} M − K̃ᵀ (W M)
      gemm(wm.top(n), c.w.top(n), mh, GemmParams{});
      delta_cpu::gemm_decayed(mh, c.ktilde.top(n), wm.top(n),
                              GemmParams{.transpose_a = Transpose::yes, .alpha = -1.0f}, std::exp(c.gamma[n - 1]));
      delta_cpu::advance_state(c, sh, vnew);
    }
  }
}

template <class T>
void apply_map_cpu(const TensorView& state, const TensorView& m, const TensorView& s_ext) {
  const int64_t h = state.size(0), dk = state.size(1), dv = state.size(2);
  std::vector<T> tmp(static_cast<size_t>(dk * dv));
  for (int64_t i = 0; i < h; ++i) {
    const TensorView t(tmp.data(), dtype_of<T>(), Device::host, {dk, dv});
    copy_into(t, s_ext.select(0, i));
    gemm(t, m.select(0, i), state.select(0, i), GemmParams{.beta = 1.0f});
    copy_into(state.select(0, i), t);
  }
}

// Shapes, then the host element type of every float view (state contiguous).
DType check_host(const TensorView* out, const TensorView* state, const TensorView* q, const TensorView& k,
                 const TensorView& v, const TensorView& g, const TensorView& beta, Dims* dims) {
  *dims = delta_cpu::check_shapes(out, state, q, k, v, g, beta);
  if (state) HYDRA_ASSERT(state->is_contiguous(), "delta rule state must be contiguous");
  return expect_host_float({{k, "k"}, {v, "v"}, {g, "g"}, {beta, "beta"}, {q ? *q : TensorView(), "q"},
                            {out ? *out : TensorView(), "out"}, {state ? *state : TensorView(), "state"}});
}

}  // namespace

void delta_rule_recurrent(const TensorView& out, const TensorView& state, const TensorView& q, const TensorView& k,
                          const TensorView& v, const TensorView& g, const TensorView& beta,
                          const DeltaRuleParams& params) {
  Dims d;
  if (check_host(&out, &state, &q, k, v, g, beta, &d) == DType::f64) {
    recurrent_cpu<double>(out, state, q, k, v, g, beta, params, d);
  } else {
    recurrent_cpu<float>(out, state, q, k, v, g, beta, params, d);
  }
}

void delta_rule_chunked(const TensorView& out, const TensorView& state, const TensorView& q, const TensorView& k,
                        const TensorView& v, const TensorView& g, const TensorView& beta,
                        const DeltaRuleParams& params) {
  Dims d;
  if (check_host(&out, &state, &q, k, v, g, beta, &d) == DType::f64) {
    chunked_cpu<double>(out, state, q, k, v, g, beta, params, d);
  } else {
    chunked_cpu<float>(out, state, q, k, v, g, beta, params, d);
  }
}

void delta_rule_segment_map(const TensorView& m, const TensorView& s_ext, const TensorView& k, const TensorView& v,
                            const TensorView& g, const TensorView& beta, const DeltaRuleParams& params) {
  Dims d;
  const DType t = check_host(nullptr, &s_ext, nullptr, k, v, g, beta, &d);
  expect_shape(m, "segment map m", {{"H", d.h}, {"dk", d.dk}, {"dk", d.dk}});
  HYDRA_ASSERT(m.is_contiguous(), "segment map m must be contiguous");
  expect_host_float({{m, "m"}, {k, "k"}});
  if (t == DType::f64) {
    segment_map_cpu<double>(m, s_ext, k, v, g, beta, params, d);
  } else {
    segment_map_cpu<float>(m, s_ext, k, v, g, beta, params, d);
  }
}

void delta_rule_apply_map(const TensorView& state, const TensorView& m, const TensorView& s_ext) {
  with_host_float({{state, "state"}, {m, "m"}, {s_ext, "s_ext"}},
                  [&](auto zero) { apply_map_cpu<decltype(zero)>(state, m, s_ext); });
}

}  // namespace hydra::ops::reference
