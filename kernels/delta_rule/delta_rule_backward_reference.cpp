// CPU backward of the chunked gated delta rule: the reference the GPU backward is tested against,
// written for clarity (plain loops and BLAS), following flash-linear-attention's
// chunk_gated_delta_rule_bwd: recompute the chunk states, run the state gradient backward over the
// chunks, then per chunk the gradients of q, k, v, β and the log-decays.
//
// Per head and chunk of n tokens (notation of delta_rule.h; Q̂ = scale·Q, γ_i = Σ_{j≤i} g_j,
// C = the chunk's last row, S the state entering the chunk):
//   forward   L_ij = β_i (k_i·k_j) e^{γ_i−γ_j} (j < i),  U = (I+L)⁻¹ (β⊙V),  W = (I+L)⁻¹ (β⊙e^γ⊙K),
//             V' = U − W S,  A = (Q̂ Kᵀ) ⊙ D,  O = (e^γ⊙Q̂) S + A V',  S' = e^{γ_C} S + K̃ᵀ V',
//             K̃ = e^{γ_C−γ} ⊙ K.
//   given dO and dS' (the gradient w.r.t. the state after the chunk):
//     dV' = Aᵀ dO + K̃ dS'
//     dS  = (e^γ⊙Q̂)ᵀ dO + e^{γ_C} dS' − Wᵀ dV'             (the state gradient, passed backward)
//     dA  = dO V'ᵀ (j ≤ i) → dQ̂ += (dA⊙D) K, dK += (dA⊙D)ᵀ Q̂, dγ_i += Σ_j dA_ij A_ij, dγ_j −= Σ_i dA_ij A_ij
//     d(e^γ⊙Q̂) = dO Sᵀ → dQ̂_i += e^{γ_i} (dO Sᵀ)_i, dγ_i += (dO Sᵀ)_i · e^{γ_i} Q̂_i
//     dK̃  = V' dS'ᵀ → dK_i += e^{γ_C−γ_i} dK̃_i, dγ_i −= dK̃_i·K̃_i, dγ_C += Σ_i dK̃_i·K̃_i
//     dγ_C += e^{γ_C} ⟨S, dS'⟩
//     dU = dV',  dW = −dV' Sᵀ
//   through the triangular solves X = (I+L)⁻¹ B (B = β⊙V for U, β⊙e^γ⊙K for W):
//     dB = (I+L)⁻ᵀ dX (back substitution),  dL = −(dB_U Uᵀ + dB_W Wᵀ) on j < i,
//     dβ_i += Σ_j dL_ij (k_i·k_j) e^{γ_i−γ_j},  dK += G K + Gᵀ K with G_ij = dL_ij β_i e^{γ_i−γ_j},
//     dγ_i += Σ_j dL_ij L_ij,  dγ_j −= Σ_i dL_ij L_ij,
//     dV_i = β_i dB_U,i,  dβ_i += dB_U,i · V_i,
//     dK_i += β_i e^{γ_i} dB_W,i,  dβ_i += e^{γ_i} dB_W,i · K_i,  dγ_i += β_i e^{γ_i} dB_W,i · K_i
//   and finally dγ_{n−1} += dγ_C, dg_j = Σ_{i ≥ j} dγ_i (the reverse cumulative sum), dq = scale dQ̂.
// The chunk states S are recomputed from state0 with the forward's own code, so they are the
// states the forward used, to the bit.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/common.h"
#include "kernels/delta_rule/delta_rule.h"
#include "kernels/delta_rule/delta_rule_cpu.h"
#include "kernels/delta_rule/delta_rule_reference.h"
#include "kernels/matmul/matmul.h"

namespace hydra::ops::reference {
namespace {

using delta_cpu::Chunk;
using delta_cpu::Dims;
using delta_cpu::Mat;

constexpr GemmParams kTransA{.transpose_a = Transpose::yes};
constexpr GemmParams kTransB{.transpose_b = Transpose::yes};

template <class T>
T query_scale(const DeltaRuleParams& params, int64_t dk) {
  return params.scale > 0 ? static_cast<T>(params.scale) : T(1) / std::sqrt(static_cast<T>(dk));
}

// Σ_c a[i][c] b[i][c] of two rows.
template <class T>
double dot(const T* a, const T* b, int64_t n) {
  double s = 0;
  for (int64_t c = 0; c < n; ++c) s += static_cast<double>(a[c]) * b[c];
  return s;
}

// The state-gradient step of one chunk: dV' = Aᵀ dO + K̃ dS', then dS' ← (e^γ⊙Q̂)ᵀ dO + e^{γ_C} dS' − Wᵀ dV'.
// `attn`, `qdecay` hold A and e^γ⊙Q̂ (chunk_scores); d_o [n, dv]; ds [dk, dv] in/out.
template <class T>
void state_gradient_step(Chunk<T>& c, Mat<T>& attn, Mat<T>& qdecay, const TensorView& d_o, const TensorView& ds,
                         Mat<T>& dvnew) {
  const int64_t n = c.len;
  gemm(dvnew.top(n), attn.square(n), d_o, kTransA);
  gemm(dvnew.top(n), c.ktilde.top(n), ds, GemmParams{.beta = 1.0f});
  delta_cpu::gemm_decayed(ds, qdecay.top(n), d_o, kTransA, std::exp(c.gamma[n - 1]));
  gemm(ds, c.w.top(n), dvnew.top(n), GemmParams{.transpose_a = Transpose::yes, .alpha = -1.0f, .beta = 1.0f});
}

// Back substitution in place: X ← (I + L)⁻ᵀ X for strictly lower L, X [n, cols].
template <class T>
void solve_unit_upper_transposed(Mat<T>& l, Mat<T>& x, int64_t n) {
  for (int64_t i = n - 1; i >= 0; --i) {
    for (int64_t j = i + 1; j < n; ++j) {
      const T lji = l(j, i);
      if (lji == T(0)) continue;
      for (int64_t c = 0; c < x.cols; ++c) x(i, c) -= lji * x(j, c);
    }
  }
}

// Scratch of the full backward for one chunk.
template <class T>
struct Work {
  Chunk<T> c;
  Mat<T> attn, qdecay, vnew, dvnew, dattn, dqhat, dkey, dkt, dbu, dbw, dl, kk, gmat;
  std::vector<double> dgamma, dbeta;
  Work(int64_t cs, int64_t dk, int64_t dv)
      : c(cs, dk, dv), attn(cs, cs), qdecay(cs, dk), vnew(cs, dv), dvnew(cs, dv), dattn(cs, cs), dqhat(cs, dk),
        dkey(cs, dk), dkt(cs, dk), dbu(cs, dv), dbw(cs, dk), dl(cs, cs), kk(cs, cs), gmat(cs, cs), dgamma(cs),
        dbeta(cs) {}
};

// Gradients of one chunk (tokens [t0, t0 + n) of head h) entered with state `s`; `ds` holds dS'
// on entry and dS on return. Writes dq, dk, dv, dg, dbeta of the chunk's rows.
template <class T>
void chunk_backward(Work<T>& wk, const TensorView& s, const TensorView& ds, const TensorView& d_o, const TensorView& v,
                    int64_t h, int64_t t0, T scale, const TensorView& dq, const TensorView& dk, const TensorView& dv,
                    const TensorView& dg, const TensorView& dbeta) {
  Chunk<T>& c = wk.c;
  const int64_t n = c.len, dkd = c.k.cols, dvd = c.u.cols;
  delta_cpu::chunk_scores(c, wk.attn, wk.qdecay);
  std::copy_n(c.u.data.data(), n * dvd, wk.vnew.data.data());  // V' = U − W S
  gemm(wk.vnew.top(n), c.w.top(n), s, GemmParams{.alpha = -1.0f, .beta = 1.0f});
  std::fill(wk.dgamma.begin(), wk.dgamma.end(), 0.0);
  std::fill(wk.dbeta.begin(), wk.dbeta.end(), 0.0);
  const double decay_c = std::exp(static_cast<double>(c.gamma[n - 1]));

  // Terms of dS' (before the step overwrites it): dγ_C from S' = e^{γ_C} S + ..., and dK̃ = V' dS'ᵀ.
  double dgamma_c = 0;
  for (int64_t i = 0; i < dkd; ++i) dgamma_c += decay_c * dot(at<const T>(s, {i}), at<const T>(ds, {i}), dvd);
  gemm(wk.dkt.top(n), wk.vnew.top(n), ds, kTransB);
  state_gradient_step(c, wk.attn, wk.qdecay, d_o, ds, wk.dvnew);  // dV', and ds ← dS

  // A = (Q̂ Kᵀ) ⊙ D: dA = dO V'ᵀ on j ≤ i; dattn becomes dA ⊙ D.
  gemm(wk.dattn.square(n), d_o, wk.vnew.top(n), kTransB);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      if (j > i) {
        wk.dattn(i, j) = T(0);
        continue;
      }
      const double m = static_cast<double>(wk.dattn(i, j)) * wk.attn(i, j);
      wk.dgamma[i] += m;
      wk.dgamma[j] -= m;
      wk.dattn(i, j) *= std::exp(c.gamma[i] - c.gamma[j]);
    }
  }
  // e^γ ⊙ Q̂: its gradient is dO Sᵀ.
  gemm(wk.dqhat.top(n), d_o, s, kTransB);
  for (int64_t i = 0; i < n; ++i) {
    wk.dgamma[i] += dot(wk.dqhat.row(i), wk.qdecay.row(i), dkd);
    const T e = std::exp(c.gamma[i]);
    for (int64_t x = 0; x < dkd; ++x) wk.dqhat(i, x) *= e;
  }
  gemm(wk.dqhat.top(n), wk.dattn.square(n), c.k.top(n), GemmParams{.beta = 1.0f});
  gemm(wk.dkey.top(n), wk.dattn.square(n), c.q.top(n), kTransA);
  // K̃ = e^{γ_C−γ} ⊙ K.
  for (int64_t i = 0; i < n; ++i) {
    const double z = dot(wk.dkt.row(i), c.ktilde.row(i), dkd);
    wk.dgamma[i] -= z;
    dgamma_c += z;
    const T e = std::exp(c.gamma[n - 1] - c.gamma[i]);
    for (int64_t x = 0; x < dkd; ++x) wk.dkey(i, x) += e * wk.dkt(i, x);
  }
  // U and W: dU = dV', dW = −dV' Sᵀ, then through the triangular solves.
  std::copy_n(wk.dvnew.data.data(), n * dvd, wk.dbu.data.data());
  gemm(wk.dbw.top(n), wk.dvnew.top(n), s, GemmParams{.transpose_b = Transpose::yes, .alpha = -1.0f});
  solve_unit_upper_transposed(c.l, wk.dbu, n);
  solve_unit_upper_transposed(c.l, wk.dbw, n);
  gemm(wk.dl.square(n), wk.dbu.top(n), c.u.top(n), GemmParams{.transpose_b = Transpose::yes, .alpha = -1.0f});
  gemm(wk.dl.square(n), wk.dbw.top(n), c.w.top(n),
       GemmParams{.transpose_b = Transpose::yes, .alpha = -1.0f, .beta = 1.0f});
  // L_ij = β_i (k_i·k_j) e^{γ_i−γ_j}, j < i.
  gemm(wk.kk.square(n), c.k.top(n), c.k.top(n), kTransB);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      if (j >= i) {
        wk.gmat(i, j) = T(0);
        continue;
      }
      const double dlij = wk.dl(i, j), e = std::exp(static_cast<double>(c.gamma[i] - c.gamma[j]));
      wk.dbeta[i] += dlij * wk.kk(i, j) * e;
      const double m = dlij * c.l(i, j);
      wk.dgamma[i] += m;
      wk.dgamma[j] -= m;
      wk.gmat(i, j) = static_cast<T>(dlij * c.b[i] * e);
    }
  }
  gemm(wk.dkey.top(n), wk.gmat.square(n), c.k.top(n), GemmParams{.beta = 1.0f});
  gemm(wk.dkey.top(n), wk.gmat.square(n), c.k.top(n), GemmParams{.transpose_a = Transpose::yes, .beta = 1.0f});
  // β ⊙ V and β ⊙ e^γ ⊙ K; then write the chunk's rows.
  for (int64_t i = 0; i < n; ++i) {
    const T* vr = at<const T>(v, {t0 + i, h});
    T* dvr = at<T>(dv, {t0 + i, h});
    wk.dbeta[i] += dot(wk.dbu.row(i), vr, dvd);
    for (int64_t x = 0; x < dvd; ++x) dvr[x] = c.b[i] * wk.dbu(i, x);
    const T e = std::exp(c.gamma[i]);
    const double t = static_cast<double>(e) * dot(wk.dbw.row(i), c.k.row(i), dkd);
    wk.dbeta[i] += t;
    wk.dgamma[i] += static_cast<double>(c.b[i]) * t;
    T* dkr = at<T>(dk, {t0 + i, h});
    T* dqr = at<T>(dq, {t0 + i, h});
    for (int64_t x = 0; x < dkd; ++x) {
      dkr[x] = wk.dkey(i, x) + c.b[i] * e * wk.dbw(i, x);
      dqr[x] = scale * wk.dqhat(i, x);
    }
    *at<T>(dbeta, {t0 + i, h}) = static_cast<T>(wk.dbeta[i]);
  }
  wk.dgamma[n - 1] += dgamma_c;
  double suffix = 0;
  for (int64_t i = n - 1; i >= 0; --i) {
    suffix += wk.dgamma[i];
    *at<T>(dg, {t0 + i, h}) = static_cast<T>(suffix);
  }
}

template <class T>
void chunked_backward_cpu(const TensorView& dq, const TensorView& dk, const TensorView& dv, const TensorView& dg,
                          const TensorView& dbeta, const TensorView& d_state, const TensorView& d_out,
                          const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g,
                          const TensorView& beta, const TensorView& state0, const DeltaRuleParams& params,
                          const Dims& d) {
  const T scale = query_scale<T>(params, d.dk);
  const int64_t cs = params.chunk, chunks = (d.t + cs - 1) / cs;
  Work<T> wk(cs, d.dk, d.dv);
  Mat<T> states(std::max<int64_t>(chunks, 1) * d.dk, d.dv), cur(d.dk, d.dv), vnew(cs, d.dv), ds(d.dk, d.dv);
  auto state_view = [&](int64_t ci) { return states.view().narrow(0, ci * d.dk, d.dk); };
  for (int64_t h = 0; h < d.h; ++h) {
    // Recompute the state entering every chunk, as the forward does.
    copy_into(cur.view(), state0.select(0, h));
    for (int64_t ci = 0; ci < chunks; ++ci) {
      const int64_t t0 = ci * cs, n = std::min(cs, d.t - t0);
      copy_into(state_view(ci), cur.view());
      wk.c.build(&q, &v, k, g, beta, h, t0, n, scale);
      delta_cpu::advance_state(wk.c, cur.view(), vnew);
    }
    // Reverse pass over the chunks with the state gradient.
    copy_into(ds.view(), d_state.select(0, h));
    for (int64_t ci = chunks - 1; ci >= 0; --ci) {
      const int64_t t0 = ci * cs, n = std::min(cs, d.t - t0);
      wk.c.build(&q, &v, k, g, beta, h, t0, n, scale);
      chunk_backward(wk, state_view(ci), ds.view(), d_out.select(1, h).narrow(0, t0, n), v, h, t0, scale, dq, dk, dv,
                     dg, dbeta);
    }
    copy_into(d_state.select(0, h), ds.view());
  }
}

template <class T>
void state_backward_cpu(const TensorView& d_state, const TensorView& d_out, const TensorView& q, const TensorView& k,
                        const TensorView& g, const TensorView& beta, const DeltaRuleParams& params, const Dims& d) {
  const T scale = query_scale<T>(params, d.dk);
  const int64_t cs = params.chunk, chunks = (d.t + cs - 1) / cs;
  Chunk<T> c(cs, d.dk, d.dv);
  Mat<T> attn(cs, cs), qdecay(cs, d.dk), dvnew(cs, d.dv), ds(d.dk, d.dv);
  for (int64_t h = 0; h < d.h; ++h) {
    copy_into(ds.view(), d_state.select(0, h));
    for (int64_t ci = chunks - 1; ci >= 0; --ci) {
      const int64_t t0 = ci * cs, n = std::min(cs, d.t - t0);
      c.build(&q, nullptr, k, g, beta, h, t0, n, scale);
      delta_cpu::chunk_scores(c, attn, qdecay);
      state_gradient_step(c, attn, qdecay, d_out.select(1, h).narrow(0, t0, n), ds.view(), dvnew);
    }
    copy_into(d_state.select(0, h), ds.view());
  }
}

template <class T>
void apply_map_transposed_cpu(const TensorView& d_state, const TensorView& m, const TensorView& d_loc) {
  const int64_t h = d_state.size(0), dk = d_state.size(1), dv = d_state.size(2);
  Mat<T> tmp(dk, dv);
  for (int64_t i = 0; i < h; ++i) {
    copy_into(tmp.view(), d_loc.select(0, i));
    gemm(tmp.view(), m.select(0, i), d_state.select(0, i), GemmParams{.transpose_a = Transpose::yes, .beta = 1.0f});
    copy_into(d_state.select(0, i), tmp.view());
  }
}

}  // namespace

void delta_rule_chunked_backward(const TensorView& dq, const TensorView& dk, const TensorView& dv,
                                 const TensorView& dg, const TensorView& dbeta, const TensorView& d_state,
                                 const TensorView& d_out, const TensorView& q, const TensorView& k,
                                 const TensorView& v, const TensorView& g, const TensorView& beta,
                                 const TensorView& state0, const DeltaRuleParams& params) {
  const Dims d = delta_cpu::check_shapes(&d_out, &state0, &q, k, v, g, beta);
  with_host_float({{dq, "dq"}, {dk, "dk"}, {dv, "dv"}, {dg, "dg"}, {dbeta, "dbeta"}, {d_state, "d_state"},
                   {d_out, "d_out"}, {q, "q"}, {k, "k"}, {v, "v"}, {g, "g"}, {beta, "beta"}, {state0, "state0"}},
                  [&](auto zero) {
                    chunked_backward_cpu<decltype(zero)>(dq, dk, dv, dg, dbeta, d_state, d_out, q, k, v, g, beta,
                                                         state0, params, d);
                  });
}

void delta_rule_state_backward(const TensorView& d_state, const TensorView& d_out, const TensorView& q,
                               const TensorView& k, const TensorView& g, const TensorView& beta,
                               const DeltaRuleParams& params) {
  const Dims d = delta_cpu::check_shapes(&d_out, &d_state, &q, k, TensorView(), g, beta);
  with_host_float({{d_state, "d_state"}, {d_out, "d_out"}, {q, "q"}, {k, "k"}, {g, "g"}, {beta, "beta"}},
                  [&](auto zero) { state_backward_cpu<decltype(zero)>(d_state, d_out, q, k, g, beta, params, d); });
}

void delta_rule_apply_map_transposed(const TensorView& d_state, const TensorView& m, const TensorView& d_loc) {
  with_host_float({{d_state, "d_state"}, {m, "m"}, {d_loc, "d_loc"}},
                  [&](auto zero) { apply_map_transposed_cpu<decltype(zero)>(d_state, m, d_loc); });
}

}  // namespace hydra::ops::reference
