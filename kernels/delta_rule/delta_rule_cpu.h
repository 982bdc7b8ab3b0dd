// Internal to the delta rule: the shape checks its entry points share (delta_rule.cpp,
// delta_rule_backward.cpp) and, for its CPU reference (delta_rule_reference.cpp: forward forms;
// delta_rule_backward_reference.cpp: backward), the per-chunk quantities of the WY/UT form, templated
// on the element type (float: the fp32 reference; double: gradient checks).
#pragma once

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "kernels/common.h"
#include "kernels/delta_rule/delta_rule.h"
#include "kernels/matmul/matmul.h"

namespace hydra::ops::delta_cpu {

struct Dims {
  int64_t t, h, dk, dv;
};

// Shape checks shared by both devices; v may be undefined (the state-gradient pass), then dv
// comes from `out` or `state`.
inline Dims check_shapes(const TensorView* out, const TensorView* state, const TensorView* q, const TensorView& k,
                         const TensorView& v, const TensorView& g, const TensorView& beta) {
  expect_shape(k, "delta rule k", {{"T", -1}, {"H", -1}, {"dk", -1}});
  const int64_t dv = v.defined() ? v.size(2) : out ? out->size(2) : state->size(2);
  const Dims d{k.size(0), k.size(1), k.size(2), dv};
  if (v.defined()) expect_shape(v, "delta rule v", {{"T", d.t}, {"H", d.h}, {"dv", -1}});
  expect_shape(g, "delta rule g", {{"T", d.t}, {"H", d.h}});
  expect_shape(beta, "delta rule beta", {{"T", d.t}, {"H", d.h}});
  if (q) expect_shape(*q, "delta rule q", {{"T", d.t}, {"H", d.h}, {"dk", d.dk}});
  if (out) expect_shape(*out, "delta rule out", {{"T", d.t}, {"H", d.h}, {"dv", d.dv}});
  if (state) expect_shape(*state, "delta rule state", {{"H", d.h}, {"dk", d.dk}, {"dv", d.dv}});
  return d;
}

template <class T>
T value_at(const TensorView& x, int64_t t, int64_t h) {
  return *at<const T>(x, {t, h});
}

// Contiguous [rows, cols] scratch matrix with a view.
template <class T>
struct Mat {
  std::vector<T> data;
  int64_t rows = 0, cols = 0;
  Mat(int64_t r, int64_t c) : data(static_cast<size_t>(r * c)), rows(r), cols(c) {}
  T* row(int64_t i) { return data.data() + i * cols; }
  T& operator()(int64_t i, int64_t j) { return data[static_cast<size_t>(i * cols + j)]; }
  TensorView view() { return TensorView(data.data(), dtype_of<T>(), Device::host, {rows, cols}); }
  TensorView top(int64_t n) { return view().narrow(0, 0, n); }
  TensorView square(int64_t n) { return view().narrow(0, 0, n).narrow(1, 0, n); }
};

// The per-chunk quantities of the WY/UT form for one head; rows beyond `len` are unused.
template <class T>
struct Chunk {
  int64_t len = 0;
  Mat<T> q, k, ktilde, w, u;  // [C, dk] x4 (q scaled), [C, dv]
  Mat<T> l;                   // [C, C]: L, strictly lower
  std::vector<T> gamma, b;    // cumulative log-decay within the chunk, β
  Chunk(int64_t c, int64_t dk, int64_t dv)
      : q(c, dk), k(c, dk), ktilde(c, dk), w(c, dk), u(c, dv), l(c, c), gamma(c), b(c) {}

  // Loads tokens [t0, t0+n) of head h and builds W, U (unless vv is null) and the decayed keys K̃.
  void build(const TensorView* qv, const TensorView* vv, const TensorView& kv, const TensorView& g,
             const TensorView& beta, int64_t h, int64_t t0, int64_t n, T scale) {
    len = n;
    const int64_t dk = k.cols, dv = u.cols;
    double acc = 0;
    for (int64_t i = 0; i < n; ++i) {
      acc += value_at<T>(g, t0 + i, h);
      gamma[i] = static_cast<T>(acc);
      b[i] = value_at<T>(beta, t0 + i, h);
      std::copy_n(at<const T>(kv, {t0 + i, h}), dk, k.row(i));
      if (qv) {
        const T* qr = at<const T>(*qv, {t0 + i, h});
        for (int64_t c = 0; c < dk; ++c) q.row(i)[c] = qr[c] * scale;
      }
      if (vv) {
        const T* vr = at<const T>(*vv, {t0 + i, h});
        for (int64_t c = 0; c < dv; ++c) u.row(i)[c] = b[i] * vr[c];  // β ⊙ V, solved in place below
      }
      const T e = std::exp(gamma[i]);
      for (int64_t c = 0; c < dk; ++c) w.row(i)[c] = b[i] * e * k.row(i)[c];  // β ⊙ e^γ ⊙ K
    }
    const T gamma_last = gamma[n - 1];
    for (int64_t i = 0; i < n; ++i) {
      const T e = std::exp(gamma_last - gamma[i]);
      for (int64_t c = 0; c < dk; ++c) ktilde.row(i)[c] = e * k.row(i)[c];
    }
    // L = strictly lower part of β_i (k_i·k_j) e^{γ_i−γ_j}; solve (I + L) X = RHS by forward
    // substitution for X = U and X = W.
    Mat<T> kk(n, n);
    gemm(kk.view(), k.top(n), k.top(n), GemmParams{.transpose_b = Transpose::yes});
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < n; ++j) l(i, j) = T(0);
      for (int64_t j = 0; j < i; ++j) {
        const T lij = b[i] * kk.row(i)[j] * std::exp(gamma[i] - gamma[j]);
        l(i, j) = lij;
        if (lij == T(0)) continue;
        if (vv) {
          for (int64_t c = 0; c < dv; ++c) u.row(i)[c] -= lij * u.row(j)[c];
        }
        for (int64_t c = 0; c < dk; ++c) w.row(i)[c] -= lij * w.row(j)[c];
      }
    }
  }
};

// out ← alpha · op(a) op(b) + decay · out. GemmParams carries float factors: float passes the decay to
// BLAS as it always has; double scales `out` itself first, because a decay rounded to float would
// make the float64 forward a staircase in g, and its finite differences meaningless.
template <class T>
void gemm_decayed(const TensorView& out, const TensorView& a, const TensorView& b, GemmParams p, T decay) {
  if constexpr (std::is_same_v<T, float>) {
    p.beta = decay;
  } else {
    for (int64_t i = 0; i < out.size(0); ++i) {
      T* row = at<T>(out, {i});
      for (int64_t j = 0; j < out.size(1); ++j) row[j] *= decay;
    }
    p.beta = 1.0f;
  }
  gemm(out, a, b, p);
}

// S ← e^{γ_C} S + K̃ᵀ (U − W S); `vnew` receives U − W S.
template <class T>
void advance_state(Chunk<T>& c, const TensorView& s, Mat<T>& vnew) {
  const int64_t n = c.len;
  std::copy_n(c.u.data.data(), n * c.u.cols, vnew.data.data());
  gemm(vnew.top(n), c.w.top(n), s, GemmParams{.alpha = -1.0f, .beta = 1.0f});
  gemm_decayed(s, c.ktilde.top(n), vnew.top(n), GemmParams{.transpose_a = Transpose::yes}, std::exp(c.gamma[n - 1]));
}

// Intra-chunk scores A = (Q̂ Kᵀ) ⊙ D (D_ij = e^{γ_i−γ_j}, j ≤ i; zero above the diagonal) and the
// decayed queries e^γ ⊙ Q̂, as the chunked forward computes them.
template <class T>
void chunk_scores(Chunk<T>& c, Mat<T>& attn, Mat<T>& qdecay) {
  const int64_t n = c.len, dk = c.k.cols;
  gemm(attn.square(n), c.q.top(n), c.k.top(n), GemmParams{.transpose_b = Transpose::yes});
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      attn.row(i)[j] = j <= i ? attn.row(i)[j] * std::exp(c.gamma[i] - c.gamma[j]) : T(0);
    }
    const T e = std::exp(c.gamma[i]);
    for (int64_t x = 0; x < dk; ++x) qdecay.row(i)[x] = e * c.q.row(i)[x];
  }
}

}  // namespace hydra::ops::delta_cpu
