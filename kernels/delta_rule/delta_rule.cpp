#include "kernels/delta_rule/delta_rule.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/common.h"
#include "kernels/matmul/matmul.h"

namespace hydra::ops {
namespace {

struct Dims {
  int64_t t, h, dk, dv;
};

// Shape checks shared by both devices.
Dims check_shapes(const TensorView* out, const TensorView* state, const TensorView* q, const TensorView& k,
                  const TensorView& v, const TensorView& g, const TensorView& beta) {
  expect_shape(k, "delta rule k", {{"T", -1}, {"H", -1}, {"dk", -1}});
  const Dims d{k.size(0), k.size(1), k.size(2), v.size(2)};
  expect_shape(v, "delta rule v", {{"T", d.t}, {"H", d.h}, {"dv", -1}});
  expect_shape(g, "delta rule g", {{"T", d.t}, {"H", d.h}});
  expect_shape(beta, "delta rule beta", {{"T", d.t}, {"H", d.h}});
  if (q) expect_shape(*q, "delta rule q", {{"T", d.t}, {"H", d.h}, {"dk", d.dk}});
  if (out) expect_shape(*out, "delta rule out", {{"T", d.t}, {"H", d.h}, {"dv", d.dv}});
  if (state) expect_shape(*state, "delta rule state", {{"H", d.h}, {"dk", d.dk}, {"dv", d.dv}});
  return d;
}

Dims check(const TensorView* out, const TensorView* state, const TensorView* q, const TensorView& k,
           const TensorView& v, const TensorView& g, const TensorView& beta) {
  const Dims d = check_shapes(out, state, q, k, v, g, beta);
  expect_host_f32(k, "k");
  expect_host_f32(v, "v");
  expect_host_f32(g, "g");
  expect_host_f32(beta, "beta");
  if (q) {
    expect_shape(*q, "delta rule q", {{"T", d.t}, {"H", d.h}, {"dk", d.dk}});
    expect_host_f32(*q, "q");
  }
  if (out) {
    expect_shape(*out, "delta rule out", {{"T", d.t}, {"H", d.h}, {"dv", d.dv}});
    expect_host_f32(*out, "out");
  }
  if (state) {
    expect_shape(*state, "delta rule state", {{"H", d.h}, {"dk", d.dk}, {"dv", d.dv}});
    expect_host_f32(*state, "state");
    HYDRA_ASSERT(state->is_contiguous(), "delta rule state must be contiguous");
  }
  return d;
}

float value_at(const TensorView& x, int64_t t, int64_t h) { return *static_cast<const float*>(x.element_ptr({t, h})); }

// Contiguous [rows, cols] fp32 scratch matrix with a view.
struct Mat {
  std::vector<float> data;
  int64_t rows = 0, cols = 0;
  Mat(int64_t r, int64_t c) : data(static_cast<size_t>(r * c)), rows(r), cols(c) {}
  float* row(int64_t i) { return data.data() + i * cols; }
  TensorView view() { return TensorView(data.data(), DType::f32, Device::host, {rows, cols}); }
  TensorView top(int64_t n) { return view().narrow(0, 0, n); }
};

// The per-chunk quantities of the WY/UT form for one head; rows beyond `len` are unused.
struct Chunk {
  int64_t len = 0;
  Mat q, k, ktilde, w, u;        // [C, dk] x4 (q scaled), [C, dv]
  std::vector<float> gamma;      // cumulative log-decay within the chunk
  Chunk(int64_t c, int64_t dk, int64_t dv) : q(c, dk), k(c, dk), ktilde(c, dk), w(c, dk), u(c, dv), gamma(c) {}

  // Loads tokens [t0, t0+len) of head h and builds W, U (and the decayed keys K̃).
  void build(const TensorView* qv, const TensorView& kv, const TensorView& vv, const TensorView& g,
             const TensorView& beta, int64_t h, int64_t t0, int64_t n, float scale) {
    len = n;
    const int64_t dk = k.cols, dv = u.cols;
    std::vector<float> b(static_cast<size_t>(n));
    double acc = 0;
    for (int64_t i = 0; i < n; ++i) {
      acc += value_at(g, t0 + i, h);
      gamma[i] = static_cast<float>(acc);
      b[i] = value_at(beta, t0 + i, h);
      const float* kr = static_cast<const float*>(kv.element_ptr({t0 + i, h}));
      std::copy_n(kr, dk, k.row(i));
      if (qv) {
        const float* qr = static_cast<const float*>(qv->element_ptr({t0 + i, h}));
        for (int64_t c = 0; c < dk; ++c) q.row(i)[c] = qr[c] * scale;
      }
      const float* vr = static_cast<const float*>(vv.element_ptr({t0 + i, h}));
      for (int64_t c = 0; c < dv; ++c) u.row(i)[c] = b[i] * vr[c];  // β ⊙ V, solved in place below
      const float e = std::exp(gamma[i]);
      for (int64_t c = 0; c < dk; ++c) w.row(i)[c] = b[i] * e * k.row(i)[c];  // β ⊙ e^γ ⊙ K
    }
    const float gamma_last = gamma[n - 1];
    for (int64_t i = 0; i < n; ++i) {
      const float e = std::exp(gamma_last - gamma[i]);
      for (int64_t c = 0; c < dk; ++c) ktilde.row(i)[c] = e * k.row(i)[c];
    }
    // L = strictly lower part of β_i (k_i·k_j) e^{γ_i−γ_j}; solve (I + L) X = RHS by forward
    // substitution for X = U and X = W.
    Mat kk(n, n);
    gemm(kk.view(), k.top(n), k.top(n), GemmParams{.transpose_b = Transpose::yes});
    for (int64_t i = 1; i < n; ++i) {
      for (int64_t j = 0; j < i; ++j) {
        const float l = b[i] * kk.row(i)[j] * std::exp(gamma[i] - gamma[j]);
        if (l == 0.0f) continue;
        for (int64_t c = 0; c < dv; ++c) u.row(i)[c] -= l * u.row(j)[c];
        for (int64_t c = 0; c < dk; ++c) w.row(i)[c] -= l * w.row(j)[c];
      }
    }
  }
};

TensorView state_of(const TensorView& state, int64_t h) { return state.select(0, h); }  // [dk, dv]

// S ← e^{γ_C} S + K̃ᵀ (U − W S); `vnew` receives U − W S.
void advance_state(Chunk& c, const TensorView& s, Mat& vnew) {
  const int64_t n = c.len;
  std::copy_n(c.u.data.data(), n * c.u.cols, vnew.data.data());
  gemm(vnew.top(n), c.w.top(n), s, GemmParams{.alpha = -1.0f, .beta = 1.0f});
  const float decay = std::exp(c.gamma[n - 1]);
  gemm(s, c.ktilde.top(n), vnew.top(n), GemmParams{.transpose_a = Transpose::yes, .beta = decay});
}

}  // namespace

void delta_rule_recurrent(const TensorView& out, const TensorView& state, const TensorView& q, const TensorView& k,
                          const TensorView& v, const TensorView& g, const TensorView& beta,
                          const DeltaRuleParams& params) {
  HYDRA_ASSERT(!on_cuda({out, state, q, k, v, g, beta}), "the recurrent form is the CPU oracle; use the chunked form on CUDA");
  const Dims d = check(&out, &state, &q, k, v, g, beta);
  const double scale = params.scale > 0 ? params.scale : 1.0 / std::sqrt(static_cast<double>(d.dk));
  std::vector<double> s(static_cast<size_t>(d.dk * d.dv)), delta(static_cast<size_t>(d.dv));
  for (int64_t h = 0; h < d.h; ++h) {
    float* sh = static_cast<float*>(state.element_ptr({h}));
    std::copy_n(sh, d.dk * d.dv, s.begin());
    for (int64_t t = 0; t < d.t; ++t) {
      const float* kt = static_cast<const float*>(k.element_ptr({t, h}));
      const float* vt = static_cast<const float*>(v.element_ptr({t, h}));
      const float* qt = static_cast<const float*>(q.element_ptr({t, h}));
      const double decay = std::exp(static_cast<double>(value_at(g, t, h)));
      const double b = value_at(beta, t, h);
      for (double& x : s) x *= decay;
      for (int64_t j = 0; j < d.dv; ++j) {
        double kv = 0;
        for (int64_t i = 0; i < d.dk; ++i) kv += s[i * d.dv + j] * kt[i];
        delta[j] = b * (vt[j] - kv);
      }
      for (int64_t i = 0; i < d.dk; ++i)
        for (int64_t j = 0; j < d.dv; ++j) s[i * d.dv + j] += kt[i] * delta[j];
      float* ot = static_cast<float*>(out.element_ptr({t, h}));
      for (int64_t j = 0; j < d.dv; ++j) {
        double o = 0;
        for (int64_t i = 0; i < d.dk; ++i) o += s[i * d.dv + j] * qt[i];
        ot[j] = static_cast<float>(o * scale);
      }
    }
    for (int64_t i = 0; i < d.dk * d.dv; ++i) sh[i] = static_cast<float>(s[i]);
  }
}

void delta_rule_chunked(const TensorView& out, const TensorView& state, const TensorView& q, const TensorView& k,
                        const TensorView& v, const TensorView& g, const TensorView& beta,
                        const DeltaRuleParams& params) {
  if (on_cuda({out, state, q, k, v, g, beta})) {
#if HYDRA_CUDA
    check_shapes(&out, &state, &q, k, v, g, beta);
    cuda_impl::delta_rule_chunked(out, state, q, k, v, g, beta, params);
    return;
#endif
  }
  const Dims d = check(&out, &state, &q, k, v, g, beta);
  HYDRA_ASSERT(params.chunk >= 1, "chunk size {}", params.chunk);
  const float scale = params.scale > 0 ? params.scale : 1.0f / std::sqrt(static_cast<float>(d.dk));
  const int64_t cs = params.chunk;
  Chunk c(cs, d.dk, d.dv);
  Mat vnew(cs, d.dv), attn(cs, cs), o(cs, d.dv), qdecay(cs, d.dk);
  for (int64_t h = 0; h < d.h; ++h) {
    const TensorView s = state_of(state, h);
    for (int64_t t0 = 0; t0 < d.t; t0 += cs) {
      const int64_t n = std::min(cs, d.t - t0);
      c.build(&q, k, v, g, beta, h, t0, n, scale);
      // Intra-chunk scores (Q Kᵀ) ⊙ D, causal including the diagonal.
      gemm(attn.view().narrow(0, 0, n).narrow(1, 0, n), c.q.top(n), c.k.top(n),
           GemmParams{.transpose_b = Transpose::yes});
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          attn.row(i)[j] = j <= i ? attn.row(i)[j] * std::exp(c.gamma[i] - c.gamma[j]) : 0.0f;
        }
        const float e = std::exp(c.gamma[i]);
        for (int64_t x = 0; x < d.dk; ++x) qdecay.row(i)[x] = e * c.q.row(i)[x];
      }
      // O = (e^γ ⊙ Q) S + attn (U − W S), then S advances.
      gemm(o.top(n), qdecay.top(n), s, GemmParams{});
      advance_state(c, s, vnew);
      gemm(o.top(n), attn.view().narrow(0, 0, n).narrow(1, 0, n), vnew.top(n), GemmParams{.beta = 1.0f});
      for (int64_t i = 0; i < n; ++i) std::copy_n(o.row(i), d.dv, static_cast<float*>(out.element_ptr({t0 + i, h})));
    }
  }
}

void delta_rule_segment_map(const TensorView& m, const TensorView& s_ext, const TensorView& k, const TensorView& v,
                            const TensorView& g, const TensorView& beta, const DeltaRuleParams& params) {
  if (on_cuda({m, s_ext, k, v, g, beta})) {
#if HYDRA_CUDA
    check_shapes(nullptr, &s_ext, nullptr, k, v, g, beta);
    expect_shape(m, "segment map m", {{"H", k.size(1)}, {"dk", k.size(2)}, {"dk", k.size(2)}});
    cuda_impl::delta_rule_segment_map(m, s_ext, k, v, g, beta, params);
    return;
#endif
  }
  const Dims d = check(nullptr, &s_ext, nullptr, k, v, g, beta);
  expect_shape(m, "segment map m", {{"H", d.h}, {"dk", d.dk}, {"dk", d.dk}});
  expect_host_f32(m, "m");
  HYDRA_ASSERT(m.is_contiguous(), "segment map m must be contiguous");
  const int64_t cs = params.chunk;
  Chunk c(cs, d.dk, d.dv);
  Mat vnew(cs, d.dv), wm(cs, d.dk);
  for (int64_t h = 0; h < d.h; ++h) {
    const TensorView mh = m.select(0, h), sh = s_ext.select(0, h);
    fill(mh, 0.0f);
    for (int64_t i = 0; i < d.dk; ++i) *static_cast<float*>(mh.element_ptr({i, i})) = 1.0f;
    fill(sh, 0.0f);
    for (int64_t t0 = 0; t0 < d.t; t0 += cs) {
      const int64_t n = std::min(cs, d.t - t0);
      c.build(nullptr, k, v, g, beta, h, t0, n, 1.0f);
      // M ← e^{γ_C} M − K̃ᵀ (W M)
      gemm(wm.top(n), c.w.top(n), mh, GemmParams{});
      gemm(mh, c.ktilde.top(n), wm.top(n),
           GemmParams{.transpose_a = Transpose::yes, .alpha = -1.0f, .beta = std::exp(c.gamma[n - 1])});
      advance_state(c, sh, vnew);
    }
  }
}

void delta_rule_apply_map(const TensorView& state, const TensorView& m, const TensorView& s_ext) {
  expect_shape(state, "state", {{"H", -1}, {"dk", -1}, {"dv", -1}});
  const int64_t h = state.size(0), dk = state.size(1), dv = state.size(2);
  expect_shape(m, "map m", {{"H", h}, {"dk", dk}, {"dk", dk}});
  expect_shape(s_ext, "map s_ext", {{"H", h}, {"dk", dk}, {"dv", dv}});
  if (on_cuda({state, m, s_ext})) {
#if HYDRA_CUDA
    cuda_impl::delta_rule_apply_map(state, m, s_ext);
    return;
#endif
  }
  std::vector<float> tmp(static_cast<size_t>(dk * dv));
  for (int64_t i = 0; i < h; ++i) {
    const TensorView t(tmp.data(), DType::f32, Device::host, {dk, dv});
    copy_into(t, s_ext.select(0, i));
    gemm(t, m.select(0, i), state.select(0, i), GemmParams{.beta = 1.0f});
    copy_into(state.select(0, i), t);
  }
}

}  // namespace hydra::ops
