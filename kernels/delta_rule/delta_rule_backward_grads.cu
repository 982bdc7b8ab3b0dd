// Stage 4 of the gated-delta-rule backward (delta_rule_backward.cu): the gradients of one chunk,
// every chunk in parallel, from its start state S, the gradient dS at its end, V' and dV'.
//
// One CTA = one (chunk, head), 8 warps; warp w owns rows 16·(w % 4) of every [C × ·] product and
// half (w / 4) of its columns. With dA = dO V'ᵀ, dÃ_ij = scale·dA_ij e^{γ_i−γ_j} (j ≤ i):
//   dq = scale·e^γ ⊙ (dO Sᵀ) + dÃ K
//   dk = dÃᵀ Q + e^{γ_C−γ} ⊙ (V' dSᵀ) + β e^γ ⊙ (Tᵀ dW) + G K + Gᵀ K
//   dv = β ⊙ (Tᵀ dV')                          (dU = dV', dW = −dV' Sᵀ)
//   dT = dV' (β V)ᵀ + dW (β e^γ K)ᵀ, dL = −Tᵀ dT Tᵀ (strictly lower), G = dL ⊙ β_i e^{γ_i−γ_j}
//   dβ_i = Σ V_i·(Tᵀ dV')_i + e^{γ_i} K_i·(Tᵀ dW)_i + Σ_{j<i} dL_ij (k_i·k_j) e^{γ_i−γ_j}
//   dγ_i = q_i·dq_inter_i + Σ_j Z_ij − Σ_j Z_ji − k̃_i·dK̃_i + β_i e^{γ_i} K_i·(Tᵀ dW)_i
//          + Σ_j dL_ij L_ij − Σ_j dL_ji L_ji,  Z = dÃ ⊙ (Q Kᵀ),  dK̃ = V' dSᵀ,
//   dγ_{C−1} += Σ_i k̃_i·dK̃_i + e^{γ_C} ⟨S, dS⟩, and dg = the reverse cumulative sum of dγ.
// Shared memory is reused across the phases (barriers mark where a tile's last reader is done).
// The kernel is the sequence of its stages (grads_load, grads_dq_inter, ..., grads_store_dg_dbeta
// below), one __forceinline__ function per phase, with the barriers between them in the kernel;
// the stages are the former kernel body cut at its phase boundaries (same operations, same order).
#include "kernels/delta_rule/delta_rule_backward.cuh"
#include "kernels/delta_rule/delta_rule_cuda.cuh"

namespace hydra::ops::cuda_impl::gdn_bwd {
namespace {

template <int D>
struct GradSmem {
  static constexpr int kLd = D + 8, kLc = kC + 8;
  static constexpr size_t rows = size_t(kC) * kLd * 2;                 // [C][D] bf16
  static constexpr size_t square = size_t(D) * kLd * 2;                // [D][D] bf16
  static constexpr size_t cc = size_t(kC) * kLc * 2;                   // [C][C] bf16
  static constexpr size_t region_s = square > rows ? square : rows;    // S, later −dW
  static constexpr size_t region_ds = square > 2 * rows ? square : 2 * rows;  // dS, later βe^γK and βV
  static constexpr size_t total = 6 * rows + region_s + region_ds + 3 * cc + (6 * kC + 4) * 4;
};

template <class T>
__device__ __forceinline__ void store_pair(T* p, float x, float y);
template <>
__device__ __forceinline__ void store_pair<float>(float* p, float x, float y) {
  *reinterpret_cast<float2*>(p) = make_float2(x, y);
}
template <>
__device__ __forceinline__ void store_pair<bf16_t>(bf16_t* p, float x, float y) {
  *reinterpret_cast<uint32_t*>(p) = cuda::pack_bf16(x, y);
}

// Adds per-row partial sums part[h2] (rows m0 + lane/4 + 8·h2) into dst[row], summing the 4 lanes of a row.
__device__ __forceinline__ void add_rows(const float (&part)[2], float* dst, int m0, int lane) {
#pragma unroll
  for (int h2 = 0; h2 < 2; ++h2) {
    float v = part[h2];
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    v += __shfl_xor_sync(0xffffffffu, v, 2);
    if (lane % 4 == 0) atomicAdd(dst + m0 + lane / 4 + h2 * 8, v);
  }
}
// Adds per-column partial sums part[j][x] (column n0 + 8j + 2·(lane%4) + x) into dst[col], summing the 8 lanes of a column.
__device__ __forceinline__ void add_cols(const float (&part)[4][2], float* dst, int n0, int lane) {
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int x = 0; x < 2; ++x) {
      float v = part[j][x];
      v += __shfl_xor_sync(0xffffffffu, v, 4);
      v += __shfl_xor_sync(0xffffffffu, v, 8);
      v += __shfl_xor_sync(0xffffffffu, v, 16);
      if (lane < 4) atomicAdd(dst + n0 + j * 8 + lane * 2 + x, v);
    }
}

// The shared-memory tiles of one CTA (GradSmem's regions; a second name is the region's use after
// the barrier noted). Padded bf16 tiles as in delta_rule_backward.cuh, then the per-row values.
template <int D>
struct GradTiles {
  static constexpr int kLd = GradSmem<D>::kLd, kLc = GradSmem<D>::kLc;
  bf16_t *q, *k, *v, *dout, *vnew, *dvnew;  // [C][D] rows
  bf16_t *s, *dw;                           // S [D][D]; after barrier 1: −dW [C][D]
  bf16_t *ds, *kb, *vb;                     // dS [D][D]; after barrier 1: βe^γK, βV [C][D]
  bf16_t *cc1, *cc2, *t;                    // [C][C]: dÃ, later X; dT, later G; T
  float *gam, *beta, *exp, *tail, *dgam, *dbeta;  // [C]: γ, β, e^γ, e^{γ_C−γ}, dγ, dβ
  float* scalar;                                  // [0]: Σ_i k̃_i·dK̃_i, [1]: ⟨S, dS⟩
  __device__ __forceinline__ explicit GradTiles(unsigned char* smem) {
    using S = GradSmem<D>;
    q = reinterpret_cast<bf16_t*>(smem);
    k = reinterpret_cast<bf16_t*>(smem + S::rows);
    v = reinterpret_cast<bf16_t*>(smem + 2 * S::rows);
    dout = reinterpret_cast<bf16_t*>(smem + 3 * S::rows);
    vnew = reinterpret_cast<bf16_t*>(smem + 4 * S::rows);
    dvnew = reinterpret_cast<bf16_t*>(smem + 5 * S::rows);
    s = reinterpret_cast<bf16_t*>(smem + 6 * S::rows);
    dw = s;
    ds = reinterpret_cast<bf16_t*>(smem + 6 * S::rows + S::region_s);
    kb = ds;
    vb = ds + kC * kLd;
    cc1 = reinterpret_cast<bf16_t*>(smem + 6 * S::rows + S::region_s + S::region_ds);
    cc2 = cc1 + kC * kLc;
    t = cc2 + kC * kLc;
    gam = reinterpret_cast<float*>(t + kC * kLc);
    beta = gam + kC;
    exp = beta + kC;
    tail = exp + kC;
    dgam = tail + kC;
    dbeta = dgam + kC;
    scalar = dbeta + kC;
  }
};

// This thread's place: its CTA's (chunk, head), and its warp's rows m0() .. of every [C × ·]
// product with columns n0() .. of D (n0c() .. of C). The warp offsets are computed where they are
// used, as the single kernel did (kept as members, they stayed live from the start and ptxas
// allocated 4-12 more registers).
template <int D>
struct GradPos {
  int chunk, head, t0, tid, warp, lane, valid;
  int64_t ch;  // chunk-head index of the per-chunk records
  __device__ __forceinline__ GradPos(const GradArgs& a)
      : chunk(blockIdx.x), head(blockIdx.y), t0(chunk * kC), tid(threadIdx.x), warp(tid / 32), lane(tid % 32),
        valid(min(kC, a.t_len - t0)), ch(int64_t(chunk) * a.heads + head) {}
  __device__ __forceinline__ int m0() const { return (warp % 4) * 16; }
  __device__ __forceinline__ int n0() const { return (warp / 4) * (D / 2); }
  __device__ __forceinline__ int n0c() const { return (warp / 4) * 32; }
  __device__ __forceinline__ const bf16_t* seq(const SeqRows& x) const {
    return static_cast<const bf16_t*>(x.ptr) + t0 * x.st + head * x.sh;
  }
};

// Load: three cp.async groups in the order of first use, so that the first products start while
// the rest is still arriving: (dO, S, Q), (V', K), (dS, dV', T, V); and the per-row values.
template <int D>
__device__ __forceinline__ void grads_load(const GradArgs& a, const GradTiles<D>& sm, const GradPos<D>& at) {
  constexpr int kLd = GradTiles<D>::kLd, kLc = GradTiles<D>::kLc;
  const int tid = at.tid, valid = at.valid;
  load_tile_async<kC, D, kLd, 256>(sm.dout, at.seq(a.dout), a.dout.st, tid, valid);
  load_tile_async<D, D, kLd, 256>(sm.s, a.states + at.ch * D * D, D, tid);
  load_tile_async<kC, D, kLd, 256>(sm.q, at.seq(a.q), a.q.st, tid, valid);
  cuda::cp_async_commit();
  load_tile_async<kC, D, kLd, 256>(sm.vnew, a.vnew + at.ch * kC * D, D, tid);
  load_tile_async<kC, D, kLd, 256>(sm.k, at.seq(a.k), a.k.st, tid, valid);
  cuda::cp_async_commit();
  load_tile_async<D, D, kLd, 256>(sm.ds, a.dstates + at.ch * D * D, D, tid);
  load_tile_async<kC, D, kLd, 256>(sm.dvnew, a.dvnew + at.ch * kC * D, D, tid);
  load_tile_async<kC, kC, kLc, 256>(sm.t, a.t + at.ch * kC * kC, kC, tid);
  load_tile_async<kC, D, kLd, 256>(sm.v, at.seq(a.v), a.v.st, tid, valid);
  cuda::cp_async_commit();
  if (tid < kC) {
    const float gam = a.gamma[at.ch * kC + tid], last = a.gamma[at.ch * kC + kC - 1];
    sm.gam[tid] = gam;
    sm.exp[tid] = expf(gam);
    sm.tail[tid] = expf(last - gam);
    sm.beta[tid] = tid < valid ? static_cast<const float*>(a.beta.ptr)[(at.t0 + tid) * a.beta.st + at.head * a.beta.sh] : 0.0f;
    sm.dgam[tid] = 0.0f;
    sm.dbeta[tid] = 0.0f;
  }
  if (tid < 2) sm.scalar[tid] = 0.0f;
}

// Inter-chunk dq (reads S): dq = scale e^γ (dO Sᵀ); dγ += q · dq.
template <int D>
__device__ __forceinline__ void grads_dq_inter(const GradArgs& a, const GradTiles<D>& sm, const GradPos<D>& at,
                                               float (&dq)[D / 16][4]) {
  constexpr int kLd = GradTiles<D>::kLd;
  const int m0 = at.m0(), n0 = at.n0(), lane = at.lane;
  zero(dq);
  warp_mma<D / 2, D, false, true>(dq, sm.dout, kLd, sm.s, kLd, m0, n0, lane);
  float part[2] = {0.0f, 0.0f};
#pragma unroll
  for (int j = 0; j < D / 16; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = acc_row(m0, e, lane), c = acc_col(n0, j, e, lane);
      dq[j][e] *= a.scale * sm.exp[r];
      part[e / 2] += dq[j][e] * __bfloat162float(sm.q[r * kLd + c]);
    }
  add_rows(part, sm.dgam, m0, lane);
}

// Intra-chunk attention: dÃ (to shared memory) and Z = dÃ ⊙ (Q Kᵀ): dγ_i += Σ_j Z_ij, dγ_j −= Σ_i Z_ij.
template <int D>
__device__ __forceinline__ void grads_intra_attention(const GradArgs& a, const GradTiles<D>& sm, const GradPos<D>& at) {
  constexpr int kLd = GradTiles<D>::kLd, kLc = GradTiles<D>::kLc;
  const int m0 = at.m0(), n0c = at.n0c(), lane = at.lane;
  float da[4][4], qk[4][4];
  zero(da);
  zero(qk);
  warp_mma<32, D, false, true>(da, sm.dout, kLd, sm.vnew, kLd, m0, n0c, lane);
  warp_mma<32, D, false, true>(qk, sm.q, kLd, sm.k, kLd, m0, n0c, lane);
  float rows[2] = {0.0f, 0.0f}, cols[4][2] = {};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = acc_row(m0, e, lane), c = acc_col(n0c, j, e, lane);
      const float dam = c <= i ? a.scale * da[j][e] * expf(sm.gam[i] - sm.gam[c]) : 0.0f;
      da[j][e] = dam;
      const float z = dam * qk[j][e];
      rows[e / 2] += z;
      cols[j][e % 2] -= z;
    }
#pragma unroll
    for (int h2 = 0; h2 < 2; ++h2) {
      const int i = acc_row(m0, 2 * h2, lane), c = acc_col(n0c, j, 0, lane);
      *reinterpret_cast<uint32_t*>(sm.cc1 + i * kLc + c) = cuda::pack_bf16(da[j][2 * h2], da[j][2 * h2 + 1]);
    }
  }
  add_rows(rows, sm.dgam, m0, lane);
  add_cols(cols, sm.dgam, n0c, lane);
}

// State gradient into dk: dK̃ = V' dSᵀ, dk = e^{γ_C−γ} dK̃; dγ_i −= k̃_i·dK̃_i, Σ_i k̃_i·dK̃_i to dγ_{C−1}.
template <int D>
__device__ __forceinline__ void grads_dk_state(const GradTiles<D>& sm, const GradPos<D>& at, float (&dk)[D / 16][4]) {
  constexpr int kLd = GradTiles<D>::kLd;
  const int m0 = at.m0(), n0 = at.n0(), lane = at.lane;
  zero(dk);
  warp_mma<D / 2, D, false, true>(dk, sm.vnew, kLd, sm.ds, kLd, m0, n0, lane);
  float part[2] = {0.0f, 0.0f};
#pragma unroll
  for (int j = 0; j < D / 16; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = acc_row(m0, e, lane), c = acc_col(n0, j, e, lane);
      dk[j][e] *= sm.tail[r];
      part[e / 2] -= dk[j][e] * __bfloat162float(sm.k[r * kLd + c]);
    }
  add_rows(part, sm.dgam, m0, lane);
  float total = part[0] + part[1];
#pragma unroll
  for (int o = 16; o > 0; o /= 2) total += __shfl_xor_sync(0xffffffffu, total, o);
  if (lane == 0) atomicAdd(sm.scalar, -total);
}

// dW = −dV' Sᵀ (kept in registers until S's readers are done) and ⟨S, dS⟩.
template <int D>
__device__ __forceinline__ void grads_dw(const GradTiles<D>& sm, const GradPos<D>& at, float (&dw)[D / 16][4]) {
  constexpr int kLd = GradTiles<D>::kLd;
  zero(dw);
  warp_mma<D / 2, D, false, true>(dw, sm.dvnew, kLd, sm.s, kLd, at.m0(), at.n0(), at.lane);
  float frob = 0.0f;
  for (int i = at.tid; i < D * D / 8; i += 256) {  // 16-byte chunks of both tiles
    const int r = i / (D / 8), c = (i % (D / 8)) * 8;
    const uint4 x = *reinterpret_cast<const uint4*>(sm.s + r * kLd + c), y = *reinterpret_cast<const uint4*>(sm.ds + r * kLd + c);
    float xf[8], yf[8];
    cuda::unpack_bf16<8>(x, xf);
    cuda::unpack_bf16<8>(y, yf);
#pragma unroll
    for (int e = 0; e < 4; ++e) frob += xf[2 * e] * yf[2 * e] + xf[2 * e + 1] * yf[2 * e + 1];
  }
#pragma unroll
  for (int o = 16; o > 0; o /= 2) frob += __shfl_xor_sync(0xffffffffu, frob, o);
  if (at.lane == 0) atomicAdd(sm.scalar + 1, frob);
}

// After barrier 1: −dW, βe^γK and βV into the freed S and dS regions (operands of the WY stages);
// dq += dÃ K, dk += dÃᵀ Q.
template <int D>
__device__ __forceinline__ void grads_wy_operands(const GradTiles<D>& sm, const GradPos<D>& at, const float (&dw)[D / 16][4],
                                                  float (&dq)[D / 16][4], float (&dk)[D / 16][4]) {
  constexpr int kLd = GradTiles<D>::kLd, kLc = GradTiles<D>::kLc;
  const int m0 = at.m0(), n0 = at.n0(), lane = at.lane;
#pragma unroll
  for (int j = 0; j < D / 16; ++j)
#pragma unroll
    for (int h2 = 0; h2 < 2; ++h2) {
      const int r = acc_row(m0, 2 * h2, lane), c = acc_col(n0, j, 0, lane);
      *reinterpret_cast<uint32_t*>(sm.dw + r * kLd + c) = cuda::pack_bf16(-dw[j][2 * h2], -dw[j][2 * h2 + 1]);
    }
  for (int i = at.tid; i < kC * D / 8; i += 256) {  // 16-byte chunks
    const int r = i / (D / 8), c = (i % (D / 8)) * 8;
    *reinterpret_cast<uint4*>(sm.kb + r * kLd + c) =
        gdn::scaled8(*reinterpret_cast<const uint4*>(sm.k + r * kLd + c), sm.beta[r] * sm.exp[r]);
    *reinterpret_cast<uint4*>(sm.vb + r * kLd + c) = gdn::scaled8(*reinterpret_cast<const uint4*>(sm.v + r * kLd + c), sm.beta[r]);
  }
  warp_mma<D / 2, kC, false, false>(dq, sm.cc1, kLc, sm.k, kLd, m0, n0, lane);  // dq += dÃ K
  warp_mma<D / 2, kC, true, false>(dk, sm.cc1, kLc, sm.q, kLd, m0, n0, lane);   // dk += dÃᵀ Q
}

// WY: dv = β (Tᵀ dV') to memory, dβ += V·(Tᵀ dV').
template <int D, class OutT>
__device__ __forceinline__ void grads_dv(const GradArgs& a, const GradTiles<D>& sm, const GradPos<D>& at) {
  constexpr int kLd = GradTiles<D>::kLd, kLc = GradTiles<D>::kLc;
  const int m0 = at.m0(), n0 = at.n0(), lane = at.lane;
  float x[D / 16][4];
  zero(x);
  warp_mma<D / 2, kC, true, false>(x, sm.t, kLc, sm.dvnew, kLd, m0, n0, lane);
  float part[2] = {0.0f, 0.0f};
  OutT* dvp = static_cast<OutT*>(a.dv);
#pragma unroll
  for (int j = 0; j < D / 16; ++j)
#pragma unroll
    for (int h2 = 0; h2 < 2; ++h2) {
      const int r = acc_row(m0, 2 * h2, lane), c = acc_col(n0, j, 0, lane);
      part[h2] += x[j][2 * h2] * __bfloat162float(sm.v[r * kLd + c]) + x[j][2 * h2 + 1] * __bfloat162float(sm.v[r * kLd + c + 1]);
      if (r < at.valid)
        store_pair(dvp + (at.t0 + r) * a.dv_st + at.head * a.dv_sh + c, sm.beta[r] * x[j][2 * h2], sm.beta[r] * x[j][2 * h2 + 1]);
    }
  add_rows(part, sm.dbeta, m0, lane);
}

// WY: Tᵀ dW: dk += β e^γ (Tᵀ dW), dβ += e^γ K·(Tᵀ dW), dγ += β e^γ K·(Tᵀ dW).
template <int D>
__device__ __forceinline__ void grads_tdw(const GradTiles<D>& sm, const GradPos<D>& at, float (&dk)[D / 16][4]) {
  constexpr int kLd = GradTiles<D>::kLd, kLc = GradTiles<D>::kLc;
  const int m0 = at.m0(), n0 = at.n0(), lane = at.lane;
  float x[D / 16][4];
  zero(x);
  warp_mma<D / 2, kC, true, false>(x, sm.t, kLc, sm.dw, kLd, m0, n0, lane);
  float part[2] = {0.0f, 0.0f};
#pragma unroll
  for (int j = 0; j < D / 16; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = acc_row(m0, e, lane), c = acc_col(n0, j, e, lane);
      dk[j][e] += sm.beta[r] * sm.exp[r] * x[j][e];
      part[e / 2] += sm.exp[r] * __bfloat162float(sm.k[r * kLd + c]) * x[j][e];
    }
  add_rows(part, sm.dbeta, m0, lane);
  const float p2[2] = {part[0] * sm.beta[m0 + lane / 4], part[1] * sm.beta[m0 + lane / 4 + 8]};
  add_rows(p2, sm.dgam, m0, lane);
}

// A warp's [16][32] block of a [C][C] product, stored as bf16 pairs into dst (leading dimension kLc).
template <int D>
__device__ __forceinline__ void store_cc(bf16_t* dst, const float (&x)[4][4], const GradPos<D>& at) {
  constexpr int kLc = GradTiles<D>::kLc;
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int h2 = 0; h2 < 2; ++h2) {
      const int i = acc_row(at.m0(), 2 * h2, at.lane), c = acc_col(at.n0c(), j, 0, at.lane);
      *reinterpret_cast<uint32_t*>(dst + i * kLc + c) = cuda::pack_bf16(x[j][2 * h2], x[j][2 * h2 + 1]);
    }
}

// WY: dT = dV' (βV)ᵀ + dW (βe^γK)ᵀ into the dT tile.
template <int D>
__device__ __forceinline__ void grads_dt(const GradTiles<D>& sm, const GradPos<D>& at) {
  constexpr int kLd = GradTiles<D>::kLd;
  float x[4][4];
  zero(x);
  warp_mma<32, D, false, true>(x, sm.dvnew, kLd, sm.vb, kLd, at.m0(), at.n0c(), at.lane);
  warp_mma<32, D, false, true>(x, sm.dw, kLd, sm.kb, kLd, at.m0(), at.n0c(), at.lane);
  store_cc(sm.cc2, x, at);
}

// WY: X = Tᵀ dT into the dÃ tile.
template <int D>
__device__ __forceinline__ void grads_x(const GradTiles<D>& sm, const GradPos<D>& at) {
  constexpr int kLc = GradTiles<D>::kLc;
  float x[4][4];
  zero(x);
  warp_mma<32, kC, true, false>(x, sm.t, kLc, sm.cc2, kLc, at.m0(), at.n0c(), at.lane);
  store_cc(sm.cc1, x, at);
}

// WY: dL = −X Tᵀ (strictly lower); its gradients through L_ij = β_i (k_i·k_j) e^{γ_i−γ_j} to dβ
// and dγ; G = dL ⊙ β_i e^{γ_i−γ_j} into the dT tile.
template <int D>
__device__ __forceinline__ void grads_dl(const GradTiles<D>& sm, const GradPos<D>& at) {
  constexpr int kLd = GradTiles<D>::kLd, kLc = GradTiles<D>::kLc;
  const int m0 = at.m0(), n0c = at.n0c(), lane = at.lane;
  float x[4][4], kk[4][4];
  zero(x);
  zero(kk);
  warp_mma<32, kC, false, true>(x, sm.cc1, kLc, sm.t, kLc, m0, n0c, lane);
  warp_mma<32, D, false, true>(kk, sm.k, kLd, sm.k, kLd, m0, n0c, lane);
  float rows_g[2] = {0.0f, 0.0f}, rows_b[2] = {0.0f, 0.0f}, cols[4][2] = {};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = acc_row(m0, e, lane), c = acc_col(n0c, j, e, lane);
      float gval = 0.0f;
      if (c < i) {
        const float m = -x[j][e], decay = expf(sm.gam[i] - sm.gam[c]);
        const float l = sm.beta[i] * kk[j][e] * decay;
        rows_b[e / 2] += m * kk[j][e] * decay;
        rows_g[e / 2] += m * l;
        cols[j][e % 2] -= m * l;
        gval = m * sm.beta[i] * decay;
      }
      x[j][e] = gval;
    }
#pragma unroll
    for (int h2 = 0; h2 < 2; ++h2) {
      const int i = acc_row(m0, 2 * h2, lane), c = acc_col(n0c, j, 0, lane);
      *reinterpret_cast<uint32_t*>(sm.cc2 + i * kLc + c) = cuda::pack_bf16(x[j][2 * h2], x[j][2 * h2 + 1]);
    }
  }
  add_rows(rows_b, sm.dbeta, m0, lane);
  add_rows(rows_g, sm.dgam, m0, lane);
  add_cols(cols, sm.dgam, n0c, lane);
}

// Epilogue of dq and dk: dk += G K + Gᵀ K, then both to memory (rows past the end skipped).
template <int D, class OutT>
__device__ __forceinline__ void grads_store_dq_dk(const GradArgs& a, const GradTiles<D>& sm, const GradPos<D>& at,
                                                  const float (&dq)[D / 16][4], float (&dk)[D / 16][4]) {
  constexpr int kLd = GradTiles<D>::kLd, kLc = GradTiles<D>::kLc;
  const int m0 = at.m0(), n0 = at.n0(), lane = at.lane;
  warp_mma<D / 2, kC, false, false>(dk, sm.cc2, kLc, sm.k, kLd, m0, n0, lane);  // dk += G K
  warp_mma<D / 2, kC, true, false>(dk, sm.cc2, kLc, sm.k, kLd, m0, n0, lane);   // dk += Gᵀ K
  OutT* dqp = static_cast<OutT*>(a.dq);
  OutT* dkp = static_cast<OutT*>(a.dk);
#pragma unroll
  for (int j = 0; j < D / 16; ++j)
#pragma unroll
    for (int h2 = 0; h2 < 2; ++h2) {
      const int r = acc_row(m0, 2 * h2, lane), c = acc_col(n0, j, 0, lane);
      if (r >= at.valid) continue;
      store_pair(dqp + (at.t0 + r) * a.dq_st + at.head * a.dq_sh + c, dq[j][2 * h2], dq[j][2 * h2 + 1]);
      store_pair(dkp + (at.t0 + r) * a.dk_st + at.head * a.dk_sh + c, dk[j][2 * h2], dk[j][2 * h2 + 1]);
    }
}

// Epilogue of dg and dβ (warp 0): dγ_{C−1} gets the state terms; dg = reverse cumulative sum of
// dγ (lane l: rows 2l, 2l+1).
template <int D>
__device__ __forceinline__ void grads_store_dg_dbeta(const GradArgs& a, const GradTiles<D>& sm, const GradPos<D>& at) {
  const int lane = at.lane;
  const float extra = sm.scalar[0] + sm.exp[kC - 1] * sm.scalar[1];
  const float x0 = sm.dgam[2 * lane], x1 = sm.dgam[2 * lane + 1] + (lane == 31 ? extra : 0.0f);
  const float pair = x0 + x1;
  float suffix = pair;  // Σ over lanes ≥ this one
#pragma unroll
  for (int o = 1; o < 32; o *= 2) {
    const float down = __shfl_down_sync(0xffffffffu, suffix, o);
    if (lane + o < 32) suffix += down;
  }
  const float after = suffix - pair;  // Σ over lanes > this one
  const float dg0 = suffix, dg1 = x1 + after;
  for (int h2 = 0; h2 < 2; ++h2) {
    const int r = 2 * lane + h2;
    if (r < at.valid) {
      a.dg[(at.t0 + r) * a.dg_st + at.head * a.dg_sh] = h2 == 0 ? dg0 : dg1;
      a.dbeta[(at.t0 + r) * a.db_st + at.head * a.db_sh] = sm.dbeta[r];
    }
  }
}

// The stages in order; the barriers between them mark where a tile's last reader is done.
template <int D, class OutT>
__global__ void __launch_bounds__(256) gdn_bwd_grads_kernel(const GradArgs a) {
  extern __shared__ __align__(128) unsigned char smem[];
  const GradTiles<D> sm(smem);
  const GradPos<D> at(a);
  grads_load(a, sm, at);
  cuda::cp_async_wait<2>();
  __syncthreads();  // dO, S, Q and the per-row values are in
  float dq[D / 16][4], dk[D / 16][4], dw[D / 16][4];  // a warp's [16][D/2] blocks
  grads_dq_inter(a, sm, at, dq);
  cuda::cp_async_wait<1>();
  __syncthreads();  // V' and K are in
  grads_intra_attention(a, sm, at);
  cuda::cp_async_wait<0>();
  __syncthreads();  // everything is in
  grads_dk_state(sm, at, dk);
  grads_dw(sm, at, dw);
  __syncthreads();  // barrier 1: S and dS are free; dÃ is complete
  grads_wy_operands(sm, at, dw, dq, dk);
  __syncthreads();  // barrier 2: dW, βe^γK, βV complete; dÃ is free
  grads_dv<D, OutT>(a, sm, at);
  grads_tdw(sm, at, dk);
  grads_dt(sm, at);
  __syncthreads();  // barrier 3: dT complete
  grads_x(sm, at);
  __syncthreads();  // barrier 4: X complete, dT is free
  grads_dl(sm, at);
  __syncthreads();  // barrier 5: G complete
  grads_store_dq_dk<D, OutT>(a, sm, at, dq, dk);
  __syncthreads();  // barrier 6: every dγ and dβ term is in
  if (at.warp == 0) grads_store_dg_dbeta(a, sm, at);
}

template <int D, class OutT>
void launch(const GradArgs& args, int chunks) {
  const size_t smem = GradSmem<D>::total;
  HYDRA_CUDA_CHECK(cudaFuncSetAttribute(gdn_bwd_grads_kernel<D, OutT>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  gdn_bwd_grads_kernel<D, OutT><<<dim3(chunks, args.heads), 256, smem, current_stream()>>>(args);
  HYDRA_CUDA_LAUNCH_CHECK();
}

}  // namespace

void launch_chunk_grads(const GradArgs& args, int d, bool bf16_out, int chunks) {
  if (d == 128) {
    bf16_out ? launch<128, bf16_t>(args, chunks) : launch<128, float>(args, chunks);
  } else {
    bf16_out ? launch<64, bf16_t>(args, chunks) : launch<64, float>(args, chunks);
  }
}

}  // namespace hydra::ops::cuda_impl::gdn_bwd
