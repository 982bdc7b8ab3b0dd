// Backward of the chunked gated delta rule on the GPU (chunk C = 64, dk = dv = D ∈ {64, 128}),
// flash-linear-attention's scheme (chunk_gated_delta_rule_bwd): nothing from the forward is kept
// but its inputs, so the chunk quantities and states are recomputed, then the state gradient runs
// backward over the chunks, then every chunk's gradients are formed in parallel.
//
// Notation of delta_rule.h: γ cumulative log-decay in the chunk, L_ij = β_i (k_i·k_j) e^{γ_i−γ_j}
// (j < i), T = (I + L)⁻¹, W = T(β e^γ K), U = T(β V), V' = U − W S, K̃ = e^{γ_C−γ} K,
// O = scale·(e^γ Q) S + Ã V' with Ã = scale·(Q Kᵀ) ⊙ D (D_ij = e^{γ_i−γ_j}, j ≤ i),
// S_next = e^{γ_C} S + K̃ᵀ V'. Stages (one launch each):
//  1. prepare (chunks × heads, parallel): γ, T (blocked 16×16 forward substitution in fp32), Ã, W, U,
//     K̃ and Q̂ = scale·e^γ Q, written chunk-major (bf16; γ fp32).
//  2. states (value-column tiles × heads, sequential over chunks): S at the start of every chunk
//     (bf16) and V' — the forward's state pass, the tile of S in registers (fp32).
//  3. state gradient (tiles × heads, sequential, last chunk first), dS = gradient w.r.t. the state
//     at the END of the chunk, starting from d_state:
//       dV' = Ãᵀ dO + K̃ dS  (stored fp32),   dS ← e^{γ_C} dS + Q̂ᵀ dO − Wᵀ dV'
//     leaving the gradient w.r.t. the initial state in d_state. It needs no state and no v, so
//     delta_rule_state_backward is stages 1 (without U) and 3 alone; in the full backward it runs
//     concurrently with stage 2 on a second stream (chunked_backward explains the synchronisation).
//  4. chunk gradients (chunks × heads, parallel; delta_rule_backward_grads.cu): dq, dk, dv, dβ
//     and dg from the chunk's S, dS, V', dV' (WY backward included), dg by a reverse cumulative
//     sum of dγ inside the chunk.
// Rows past the end of the sequence are zero with g = β = 0 (identity steps), as in the forward.
// The sequential stages have heads × D/BV CTAs; splitting them into segments (the forward's
// in-GPU split scan, with the transposed maps for stage 3) is the next step for long sequences.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "kernels/delta_rule/delta_rule.h"
#include "kernels/delta_rule/delta_rule_backward.cuh"
#include "kernels/matmul/matmul.h"

namespace hydra::ops::cuda_impl {
namespace gdn_bwd {
namespace {

// ---------------------------------------------------------------------------------------------
// Stage 1: per-chunk preparation.
struct PrepOut {
  float* gamma;
  bf16_t* t;
  bf16_t* a;
  bf16_t* w;
  bf16_t* u;  // null: no U (state backward)
  bf16_t* kt;
  bf16_t* qh;
};

template <int D>
struct PrepSmem {
  static constexpr int kLd = D + 8, kLc = kC + 8, kLf = kC + 4;
  static constexpr size_t rows_bytes = size_t(kC) * kLd * 2;  // one [C][D] tile
  static constexpr size_t total = 3 * rows_bytes + 2 * size_t(kC) * kLf * 4 + size_t(kC) * kLc * 2 + 6 * kC * 4 + 4 * 256 * 4;
};

template <int D>
__global__ void __launch_bounds__(256) gdn_bwd_prepare_kernel(SeqRows q, SeqRows k, SeqRows v, SeqRows g, SeqRows beta,
                                                              int t_len, int heads, float scale, PrepOut out) {
  using S = PrepSmem<D>;
  constexpr int kLd = S::kLd, kLc = S::kLc, kLf = S::kLf;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16_t* sk = reinterpret_cast<bf16_t*>(smem);
  bf16_t* sq = reinterpret_cast<bf16_t*>(smem + S::rows_bytes);
  bf16_t* sv = reinterpret_cast<bf16_t*>(smem + 2 * S::rows_bytes);
  float* sl = reinterpret_cast<float*>(smem + 3 * S::rows_bytes);  // L, fp32
  float* st = sl + kC * kLf;                                      // T, fp32
  bf16_t* stb = reinterpret_cast<bf16_t*>(st + kC * kLf);         // T, bf16
  float* sraw = reinterpret_cast<float*>(stb + kC * kLc);
  float* sbeta = sraw + kC;
  float* sgam = sbeta + kC;
  float* sexp = sgam + kC;   // e^{γ_i}
  float* stail = sexp + kC;  // e^{γ_C − γ_i}
  float* sscratch = stail + 2 * kC;  // 4 × [16][16] for the blocked inverse
  const int chunk = blockIdx.x, head = blockIdx.y, t0 = chunk * kC;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int valid = min(kC, t_len - t0);
  const int64_t base_cd = (int64_t(chunk) * heads + head) * kC;  // row index of this chunk-head

  auto rows_of = [&](const SeqRows& x) { return static_cast<const bf16_t*>(x.ptr) + t0 * x.st + head * x.sh; };
  load_rows_async(sk, kLd, rows_of(k), k.st, kC, valid, D, tid, 256);
  load_rows_async(sq, kLd, rows_of(q), q.st, kC, valid, D, tid, 256);
  if (out.u) load_rows_async(sv, kLd, rows_of(v), v.st, kC, valid, D, tid, 256);
  cuda::cp_async_commit();
  if (tid < kC) {
    const bool ok = tid < valid;
    sraw[tid] = ok ? static_cast<const float*>(g.ptr)[(t0 + tid) * g.st + head * g.sh] : 0.0f;
    sbeta[tid] = ok ? static_cast<const float*>(beta.ptr)[(t0 + tid) * beta.st + head * beta.sh] : 0.0f;
  }
  __syncthreads();
  if (warp == 0) {  // inclusive prefix sum of g over the chunk (two values per lane)
    float x0 = sraw[2 * lane], x1 = x0 + sraw[2 * lane + 1];
    for (int o = 1; o < 32; o *= 2) {
      const float up = __shfl_up_sync(0xffffffffu, x1, o);
      if (lane >= o) {
        x0 += up;
        x1 += up;
      }
    }
    sgam[2 * lane] = x0;
    sgam[2 * lane + 1] = x1;
  }
  cuda::cp_async_wait<0>();
  __syncthreads();

  // L (fp32) and Ã (bf16, to memory): warp w owns rows 16·(w % 4), columns 32·(w / 4).
  {
    const int m0 = (warp % 4) * 16, n0 = (warp / 4) * 32;
    float kk[4][4], qk[4][4];
    zero(kk);
    zero(qk);
    warp_mma<32, D, false, true>(kk, sk, kLd, sk, kLd, m0, n0, lane);
    warp_mma<32, D, false, true>(qk, sq, kLd, sk, kLd, m0, n0, lane);
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = acc_row(m0, e, lane), c = acc_col(n0, j, e, lane);
        const float decay = c <= i ? expf(sgam[i] - sgam[c]) : 0.0f;
        sl[i * kLf + c] = c < i ? sbeta[i] * kk[j][e] * decay : 0.0f;
        out.a[(base_cd + i) * kC + c] = __float2bfloat16_rn(c <= i ? scale * qk[j][e] * decay : 0.0f);
      }
  }
  __syncthreads();
  // T = (I + L)⁻¹ (unit lower triangular) by 16×16 blocks, as the forward's prepare does it:
  //  1. warp b inverts diagonal block b by forward substitution (warp-synchronous, no CTA barrier):
  //     T_ic = −(L_ic + Σ_{c<j<i} L_ij T_jc) for c < i;
  //  2. off-diagonal blocks by distance d = i − j: T_ij = −T_ii Σ_{k=j}^{i−1} L_ik T_kj, all blocks of
  //     one distance in parallel (one warp each), a CTA barrier between distances.
  {
    for (int i = tid; i < kC * kC; i += 256) st[(i / kC) * kLf + i % kC] = (i / kC == i % kC) ? 1.0f : 0.0f;
    __syncthreads();
    if (warp < 4) {
      const int r0 = warp * 16, c = lane;
      for (int i = 1; i < 16; ++i) {
        float acc = 0.0f;
        if (c < i) {
          acc = sl[(r0 + i) * kLf + r0 + c];
          for (int j = c + 1; j < i; ++j) acc += sl[(r0 + i) * kLf + r0 + j] * st[(r0 + j) * kLf + r0 + c];
        }
        __syncwarp();
        if (c < i) st[(r0 + i) * kLf + r0 + c] = -acc;
        __syncwarp();
      }
    }
    __syncthreads();
    for (int dist = 1; dist < 4; ++dist) {
      if (warp < 4 - dist) {
        const int bj = warp, bi = warp + dist;
        float* y = sscratch + warp * 256;
        for (int e = lane; e < 256; e += 32) {  // Y = Σ_k L_ik T_kj
          const int r = e / 16, cc = e % 16;
          float acc = 0.0f;
          for (int bk = bj; bk < bi; ++bk)
            for (int t = 0; t < 16; ++t) acc += sl[(bi * 16 + r) * kLf + bk * 16 + t] * st[(bk * 16 + t) * kLf + bj * 16 + cc];
          y[e] = acc;
        }
        __syncwarp();
        for (int e = lane; e < 256; e += 32) {  // T_ij = −T_ii Y
          const int r = e / 16, cc = e % 16;
          float acc = 0.0f;
          for (int t = 0; t <= r; ++t) acc += st[(bi * 16 + r) * kLf + bi * 16 + t] * y[t * 16 + cc];
          st[(bi * 16 + r) * kLf + bj * 16 + cc] = -acc;
        }
      }
      __syncthreads();
    }
  }
  for (int idx = tid; idx < kC * kC; idx += 256) {
    const int i = idx / kC, c = idx % kC;
    const bf16_t x = __float2bfloat16_rn(st[i * kLf + c]);
    stb[i * kLc + c] = x;
    out.t[(base_cd + i) * kC + c] = x;
  }
  if (tid < kC) {
    out.gamma[base_cd + tid] = sgam[tid];
    sexp[tid] = expf(sgam[tid]);
    stail[tid] = expf(sgam[kC - 1] - sgam[tid]);
  }
  __syncthreads();
  // K̃ and Q̂ to memory; β e^γ K and β V in place of K and V (the right-hand sides of W and U).
  for (int idx = tid; idx < kC * D; idx += 256) {
    const int r = idx / D, c = idx % D;
    const int64_t o = (base_cd + r) * D + c;
    const float kv = __bfloat162float(sk[r * kLd + c]);
    out.kt[o] = __float2bfloat16_rn(kv * stail[r]);
    sk[r * kLd + c] = __float2bfloat16_rn(kv * sbeta[r] * sexp[r]);
    out.qh[o] = __float2bfloat16_rn(scale * sexp[r] * __bfloat162float(sq[r * kLd + c]));
    if (out.u) sv[r * kLd + c] = __float2bfloat16_rn(__bfloat162float(sv[r * kLd + c]) * sbeta[r]);
  }
  __syncthreads();
  // W = T (β e^γ K), U = T (β V): warp w owns rows 16·(w % 4), columns (w / 4)·D/2.
  const int m0 = (warp % 4) * 16, n0 = (warp / 4) * (D / 2);
  for (int which = 0; which < (out.u ? 2 : 1); ++which) {
    float acc[D / 16][4];
    zero(acc);
    warp_mma<D / 2, kC, false, false>(acc, stb, kLc, which == 0 ? sk : sv, kLd, m0, n0, lane);
    bf16_t* dst = which == 0 ? out.w : out.u;
#pragma unroll
    for (int j = 0; j < D / 16; ++j)
#pragma unroll
      for (int h2 = 0; h2 < 2; ++h2) {
        const int r = acc_row(m0, 2 * h2, lane), c = acc_col(n0, j, 0, lane);
        *reinterpret_cast<uint32_t*>(dst + (base_cd + r) * D + c) = cuda::pack_bf16(acc[j][2 * h2], acc[j][2 * h2 + 1]);
      }
  }
}

// ---------------------------------------------------------------------------------------------
// Stages 2 and 3: the sequential passes over chunks for one (head, BV-column tile). The tile of the
// state (or of its gradient) lives in registers: warp w owns rows [w·D/4, (w+1)·D/4), all BV columns.
struct PassArgs {
  const bf16_t* w;
  const bf16_t* u;
  const bf16_t* kt;
  const bf16_t* qh;
  const bf16_t* a;
  const float* gamma;
  SeqRows dout;
  int t_len, chunks, heads;
  float* state;       // [H, D, D]: stage 2 reads the initial state; stage 3 reads dS_final, writes dS_initial
  bf16_t* states;     // stage 2: [N, H, D, D] state at each chunk's start; stage 3: gradient at each chunk's end (or null)
  bf16_t* vnew;       // stage 2: [N, H, C, D] V'
  float* dvnew;       // stage 3: [N, H, C, D] dV' (or null)
};

template <int D, int BV>
struct PassSmem {
  static constexpr int kLd = D + 8, kLv = BV + 8, kLc = kC + 8;
  static constexpr size_t rows_bytes = size_t(kC) * kLd * 2;
  static constexpr size_t narrow_bytes = size_t(kC) * kLv * 2;
  // Stage 2 per pipeline stage: W, K̃, U tile. Stage 3: Q̂, K̃, W, Ã, dO tile.
  static constexpr size_t fwd_stage = 2 * rows_bytes + narrow_bytes;
  static constexpr size_t bwd_stage = 3 * rows_bytes + size_t(kC) * kLc * 2 + narrow_bytes;
  static constexpr size_t state_bytes = size_t(D) * kLv * 2;  // the state tile as a bf16 operand
  static constexpr size_t fwd_total = 2 * fwd_stage + state_bytes + narrow_bytes + 16;
  static constexpr size_t bwd_total = 2 * bwd_stage + state_bytes + narrow_bytes + 16;
};

template <int D, int BV>
__device__ __forceinline__ void store_state_tile(const float (&s)[D / 64][BV / 8][4], bf16_t* tile, bf16_t* global,
                                                 int warp, int lane) {
  constexpr int kLv = BV + 8;
#pragma unroll
  for (int mt = 0; mt < D / 64; ++mt)
#pragma unroll
    for (int nt = 0; nt < BV / 8; ++nt)
#pragma unroll
      for (int h2 = 0; h2 < 2; ++h2) {
        const int r = acc_row(warp * (D / 4) + mt * 16, 2 * h2, lane), c = acc_col(0, nt, 0, lane);
        const uint32_t packed = cuda::pack_bf16(s[mt][nt][2 * h2], s[mt][nt][2 * h2 + 1]);
        *reinterpret_cast<uint32_t*>(tile + r * kLv + c) = packed;
        if (global) *reinterpret_cast<uint32_t*>(global + r * D + c) = packed;
      }
}

template <int D, int BV>
__device__ __forceinline__ void state_tile_io(float (&s)[D / 64][BV / 8][4], float* state, bool load, int warp, int lane) {
#pragma unroll
  for (int mt = 0; mt < D / 64; ++mt)
#pragma unroll
    for (int nt = 0; nt < BV / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = acc_row(warp * (D / 4) + mt * 16, e, lane), c = acc_col(0, nt, e, lane);
        if (load) {
          s[mt][nt][e] = state[r * D + c];
        } else {
          state[r * D + c] = s[mt][nt][e];
        }
      }
}

// Stage 2: S at the start of every chunk and V' = U − W S, S ← e^{γ_C} S + K̃ᵀ V'.
template <int D, int BV>
__global__ void __launch_bounds__(128) gdn_bwd_states_kernel(const PassArgs a) {
  using S = PassSmem<D, BV>;
  constexpr int kLd = S::kLd, kLv = S::kLv;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16_t* ss = reinterpret_cast<bf16_t*>(smem + 2 * S::fwd_stage);
  bf16_t* svn = reinterpret_cast<bf16_t*>(smem + 2 * S::fwd_stage + S::state_bytes);
  float* sdecay = reinterpret_cast<float*>(smem + 2 * S::fwd_stage + S::state_bytes + S::narrow_bytes);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int head = blockIdx.y, col0 = blockIdx.x * BV;
  auto stage_ptr = [&](int stage, int which) {
    return reinterpret_cast<bf16_t*>(smem + stage * S::fwd_stage + which * S::rows_bytes);
  };
  auto load_chunk = [&](int chunk, int stage) {
    const int64_t off = (int64_t(chunk) * a.heads + head) * kC * D;
    load_rows_async(stage_ptr(stage, 0), kLd, a.w + off, D, kC, kC, D, tid, 128);
    load_rows_async(stage_ptr(stage, 1), kLd, a.kt + off, D, kC, kC, D, tid, 128);
    load_rows_async(stage_ptr(stage, 2), kLv, a.u + off + col0, D, kC, kC, BV, tid, 128);
    if (tid == 0) sdecay[stage] = expf(a.gamma[(int64_t(chunk) * a.heads + head) * kC + kC - 1]);
  };

  float s[D / 64][BV / 8][4];
  state_tile_io<D, BV>(s, a.state + int64_t(head) * D * D + col0, true, warp, lane);
  load_chunk(0, 0);
  cuda::cp_async_commit();
  for (int chunk = 0; chunk < a.chunks; ++chunk) {
    const int stage = chunk % 2;
    store_state_tile<D, BV>(s, ss, a.states + (int64_t(chunk) * a.heads + head) * D * D + col0, warp, lane);
    cuda::cp_async_wait<0>();
    __syncthreads();
    if (chunk + 1 < a.chunks) load_chunk(chunk + 1, stage ^ 1);
    cuda::cp_async_commit();
    const bf16_t* sw = stage_ptr(stage, 0);
    const bf16_t* skt = stage_ptr(stage, 1);
    const bf16_t* su = stage_ptr(stage, 2);
    {  // V' = U − W S: warp w owns chunk rows 16w.
      float p[BV / 8][4];
      zero(p);
      warp_mma<BV, D, false, false>(p, sw, kLd, ss, kLv, warp * 16, 0, lane);
      bf16_t* vg = a.vnew + (int64_t(chunk) * a.heads + head) * kC * D + col0;
#pragma unroll
      for (int j = 0; j < BV / 8; ++j)
#pragma unroll
        for (int h2 = 0; h2 < 2; ++h2) {
          const int r = acc_row(warp * 16, 2 * h2, lane), c = acc_col(0, j, 0, lane);
          const float v0 = __bfloat162float(su[r * kLv + c]) - p[j][2 * h2];
          const float v1 = __bfloat162float(su[r * kLv + c + 1]) - p[j][2 * h2 + 1];
          const uint32_t packed = cuda::pack_bf16(v0, v1);
          *reinterpret_cast<uint32_t*>(svn + r * kLv + c) = packed;
          *reinterpret_cast<uint32_t*>(vg + r * D + c) = packed;
        }
    }
    __syncthreads();
    const float decay = sdecay[stage];
#pragma unroll
    for (int mt = 0; mt < D / 64; ++mt) {
#pragma unroll
      for (int nt = 0; nt < BV / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mt][nt][e] *= decay;
      warp_mma<BV, kC, true, false>(s[mt], skt, kLd, svn, kLv, warp * (D / 4) + mt * 16, 0, lane);
    }
    __syncthreads();  // ss and svn are rewritten next chunk
  }
  cuda::cp_async_wait<0>();
}

// Stage 3: the state gradient, last chunk first.
template <int D, int BV>
__global__ void __launch_bounds__(128) gdn_bwd_dstate_kernel(const PassArgs a) {
  using S = PassSmem<D, BV>;
  constexpr int kLd = S::kLd, kLv = S::kLv, kLc = S::kLc;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16_t* sds = reinterpret_cast<bf16_t*>(smem + 2 * S::bwd_stage);
  bf16_t* sdv = reinterpret_cast<bf16_t*>(smem + 2 * S::bwd_stage + S::state_bytes);  // −dV' (bf16)
  float* sdecay = reinterpret_cast<float*>(smem + 2 * S::bwd_stage + S::state_bytes + S::narrow_bytes);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int head = blockIdx.y, col0 = blockIdx.x * BV;
  auto rows_ptr = [&](int stage, int which) {  // 0: Q̂, 1: K̃, 2: W, 3: Ã, 4: dO tile
    unsigned char* base = smem + stage * S::bwd_stage;
    if (which < 3) return reinterpret_cast<bf16_t*>(base + which * S::rows_bytes);
    if (which == 3) return reinterpret_cast<bf16_t*>(base + 3 * S::rows_bytes);
    return reinterpret_cast<bf16_t*>(base + 3 * S::rows_bytes + size_t(kC) * kLc * 2);
  };
  auto load_chunk = [&](int chunk, int stage) {
    const int64_t off = (int64_t(chunk) * a.heads + head) * kC * D;
    load_rows_async(rows_ptr(stage, 0), kLd, a.qh + off, D, kC, kC, D, tid, 128);
    load_rows_async(rows_ptr(stage, 1), kLd, a.kt + off, D, kC, kC, D, tid, 128);
    load_rows_async(rows_ptr(stage, 2), kLd, a.w + off, D, kC, kC, D, tid, 128);
    load_rows_async(rows_ptr(stage, 3), kLc, a.a + (int64_t(chunk) * a.heads + head) * kC * kC, kC, kC, kC, kC, tid, 128);
    const int t0 = chunk * kC;
    const bf16_t* dop = static_cast<const bf16_t*>(a.dout.ptr) + t0 * a.dout.st + head * a.dout.sh + col0;
    load_rows_async(rows_ptr(stage, 4), kLv, dop, a.dout.st, kC, min(kC, a.t_len - t0), BV, tid, 128);
    if (tid == 0) sdecay[stage] = expf(a.gamma[(int64_t(chunk) * a.heads + head) * kC + kC - 1]);
  };

  float s[D / 64][BV / 8][4];
  float* state = a.state + int64_t(head) * D * D + col0;
  state_tile_io<D, BV>(s, state, true, warp, lane);
  load_chunk(a.chunks - 1, 0);
  cuda::cp_async_commit();
  for (int idx = 0; idx < a.chunks; ++idx) {
    const int chunk = a.chunks - 1 - idx, stage = idx % 2;
    store_state_tile<D, BV>(s, sds, a.states ? a.states + (int64_t(chunk) * a.heads + head) * D * D + col0 : nullptr,
                            warp, lane);
    cuda::cp_async_wait<0>();
    __syncthreads();
    if (chunk > 0) load_chunk(chunk - 1, stage ^ 1);
    cuda::cp_async_commit();
    const bf16_t* sqh = rows_ptr(stage, 0);
    const bf16_t* skt = rows_ptr(stage, 1);
    const bf16_t* sw = rows_ptr(stage, 2);
    const bf16_t* sa = rows_ptr(stage, 3);
    const bf16_t* sdo = rows_ptr(stage, 4);
    {  // dV' = Ãᵀ dO + K̃ dS: warp w owns chunk rows 16w.
      float p[BV / 8][4];
      zero(p);
      warp_mma<BV, kC, true, false>(p, sa, kLc, sdo, kLv, warp * 16, 0, lane);
      warp_mma<BV, D, false, false>(p, skt, kLd, sds, kLv, warp * 16, 0, lane);
      float* dvg = a.dvnew ? a.dvnew + (int64_t(chunk) * a.heads + head) * kC * D + col0 : nullptr;
#pragma unroll
      for (int j = 0; j < BV / 8; ++j)
#pragma unroll
        for (int h2 = 0; h2 < 2; ++h2) {
          const int r = acc_row(warp * 16, 2 * h2, lane), c = acc_col(0, j, 0, lane);
          *reinterpret_cast<uint32_t*>(sdv + r * kLv + c) = cuda::pack_bf16(-p[j][2 * h2], -p[j][2 * h2 + 1]);
          if (dvg) *reinterpret_cast<float2*>(dvg + r * D + c) = make_float2(p[j][2 * h2], p[j][2 * h2 + 1]);
        }
    }
    __syncthreads();
    // dS ← e^{γ_C} dS + Q̂ᵀ dO + Wᵀ (−dV').
    const float decay = sdecay[stage];
#pragma unroll
    for (int mt = 0; mt < D / 64; ++mt) {
#pragma unroll
      for (int nt = 0; nt < BV / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mt][nt][e] *= decay;
      const int m0 = warp * (D / 4) + mt * 16;
      warp_mma<BV, kC, true, false>(s[mt], sqh, kLd, sdo, kLv, m0, 0, lane);
      warp_mma<BV, kC, true, false>(s[mt], sw, kLd, sdv, kLv, m0, 0, lane);
    }
    __syncthreads();  // sds and sdv are rewritten next chunk
  }
  cuda::cp_async_wait<0>();
  state_tile_io<D, BV>(s, state, false, warp, lane);
}

// ---------------------------------------------------------------------------------------------
// Host side.

// HYDRA_GDN_PROFILE=1 prints each stage's time (events on the current stream), for tuning.
struct StageTimes {
  bool on = std::getenv("HYDRA_GDN_PROFILE") != nullptr;
  std::vector<std::pair<const char*, std::unique_ptr<CudaEvent>>> marks;
  void mark(const char* name) {
    if (!on) return;
    marks.emplace_back(name, std::make_unique<CudaEvent>(true));
    marks.back().second->record(current_stream());
  }
  ~StageTimes() {
    if (!on || marks.size() < 2) return;
    marks.back().second->synchronize();
    std::string line = "gdn backward stages:";
    for (size_t i = 1; i < marks.size(); ++i)
      line += fmt::format(" {} {:.3f} ms", marks[i].first, marks[i].second->elapsed_ms_since(*marks[i - 1].second));
    std::fprintf(stderr, "%s\n", line.c_str());
  }
};
SeqRows rows_of(const TensorView& x) { return SeqRows{x.data(), x.stride(0), x.stride(1)}; }

void check_rows(const TensorView& x, const char* what) {
  cuda::expect_cuda(x, what, DType::bf16);
  HYDRA_ASSERT(x.rank() == 3 && x.stride(2) == 1 && x.stride(0) % 8 == 0 && x.stride(1) % 8 == 0 &&
                   reinterpret_cast<uintptr_t>(x.data()) % 16 == 0,
               "CUDA delta rule backward: {} rows must be 16-byte aligned", what);
}

template <int D>
Prepared prepare(const TensorView& q, const TensorView& k, const TensorView* v, const TensorView& g,
                 const TensorView& beta, float scale) {
  const int t_len = static_cast<int>(k.size(0)), heads = static_cast<int>(k.size(1));
  const int chunks = (t_len + kC - 1) / kC;
  auto rows = [&](DType dtype) { return Tensor::empty({chunks, heads, kC, D}, dtype, Device::cuda); };
  Prepared p{Tensor::empty({chunks, heads, kC}, DType::f32, Device::cuda),
             Tensor::empty({chunks, heads, kC, kC}, DType::bf16, Device::cuda),
             Tensor::empty({chunks, heads, kC, kC}, DType::bf16, Device::cuda),
             rows(DType::bf16), v ? rows(DType::bf16) : Tensor(), rows(DType::bf16), rows(DType::bf16)};
  PrepOut out{p.gamma.data_as<float>(), p.t.data_as<bf16_t>(), p.a.data_as<bf16_t>(), p.w.data_as<bf16_t>(),
              v ? p.u.data_as<bf16_t>() : nullptr, p.kt.data_as<bf16_t>(), p.qh.data_as<bf16_t>()};
  const size_t smem = PrepSmem<D>::total;
  HYDRA_CUDA_CHECK(cudaFuncSetAttribute(gdn_bwd_prepare_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  gdn_bwd_prepare_kernel<D><<<dim3(chunks, heads), 256, smem, current_stream()>>>(
      rows_of(q), rows_of(k), v ? rows_of(*v) : SeqRows{nullptr, 0, 0}, SeqRows{g.data(), g.stride(0), g.stride(1)},
      SeqRows{beta.data(), beta.stride(0), beta.stride(1)}, t_len, heads, scale, out);
  HYDRA_CUDA_LAUNCH_CHECK();
  return p;
}

// Value tiles of 16 columns when few CTAs would otherwise leave SMs idle, else 32 (as the forward).
template <int D, bool Backward>
void run_pass(const PassArgs& args) {
  auto launch = [&](auto kernel, size_t smem, int bv) {
    HYDRA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    kernel<<<dim3(D / bv, args.heads), 128, smem, current_stream()>>>(args);
    HYDRA_CUDA_LAUNCH_CHECK();
  };
  const bool narrow = args.heads * (D / 32) < 200;
  if constexpr (Backward) {
    if (narrow) {
      launch(gdn_bwd_dstate_kernel<D, 16>, PassSmem<D, 16>::bwd_total, 16);
    } else {
      launch(gdn_bwd_dstate_kernel<D, 32>, PassSmem<D, 32>::bwd_total, 32);
    }
  } else {
    if (narrow) {
      launch(gdn_bwd_states_kernel<D, 16>, PassSmem<D, 16>::fwd_total, 16);
    } else {
      launch(gdn_bwd_states_kernel<D, 32>, PassSmem<D, 32>::fwd_total, 32);
    }
  }
}

template <int D>
void chunked_backward(const TensorView& dq, const TensorView& dk, const TensorView& dv, const TensorView& dg,
                      const TensorView& dbeta, const TensorView& d_state, const TensorView& d_out, const TensorView& q,
                      const TensorView& k, const TensorView& v, const TensorView& g, const TensorView& beta,
                      const TensorView& state0, float scale) {
  const int t_len = static_cast<int>(k.size(0)), heads = static_cast<int>(k.size(1));
  const int chunks = (t_len + kC - 1) / kC;
  StageTimes times;
  times.mark("start");
  const Prepared p = prepare<D>(q, k, &v, g, beta, scale);
  times.mark("prepare");
  Tensor state = clone(state0);  // the pass reads it; a contiguous fp32 copy
  Tensor states = Tensor::empty({chunks, heads, D, D}, DType::bf16, Device::cuda);
  Tensor vnew = Tensor::empty({chunks, heads, kC, D}, DType::bf16, Device::cuda);
  PassArgs fwd{p.w.data_as<bf16_t>(), p.u.data_as<bf16_t>(), p.kt.data_as<bf16_t>(), nullptr, nullptr,
               p.gamma.data_as<float>(), {}, t_len, chunks, heads, state.data_as<float>(), states.data_as<bf16_t>(),
               vnew.data_as<bf16_t>(), nullptr};
  Tensor dstate = clone(d_state);
  Tensor dstates = Tensor::empty({chunks, heads, D, D}, DType::bf16, Device::cuda);
  Tensor dvnew = Tensor::empty({chunks, heads, kC, D}, DType::f32, Device::cuda);
  PassArgs bwd{p.w.data_as<bf16_t>(), nullptr, p.kt.data_as<bf16_t>(), p.qh.data_as<bf16_t>(), p.a.data_as<bf16_t>(),
               p.gamma.data_as<float>(), rows_of(d_out), t_len, chunks, heads, dstate.data_as<float>(),
               dstates.data_as<bf16_t>(), nullptr, dvnew.data_as<float>()};
  // Stages 2 and 3 are independent (both read only stage 1's tiles, d_out and their own inputs), and
  // each is a sequential pass of D/16 × H CTAs that leaves most of the GPU idle at 14 heads, so they
  // run concurrently: stage 3 on this file's side stream, which first waits for everything queued so
  // far (stage 1, the allocations above); the current stream waits for it before stage 4. Every
  // tensor either touches is allocated before the fork and freed after the join, in stream order.
  // (A stage-2 and a stage-3 CTA fit on one SM together: 85 KB + 138 KB of shared memory at D = 128.)
  {
    thread_local CudaStream side;
    CudaEvent forked, joined;
    forked.record(current_stream());
    forked.wait_on(side.get());
    {
      StreamGuard guard(side.get());
      run_pass<D, true>(bwd);
      copy_into(d_state, dstate);
      joined.record(side.get());
    }
    run_pass<D, false>(fwd);
    joined.wait_on(current_stream());
  }
  times.mark("states+state-gradient");
  GradArgs ga{rows_of(q), rows_of(k), rows_of(v), rows_of(d_out), SeqRows{beta.data(), beta.stride(0), beta.stride(1)},
              p.gamma.data_as<float>(), p.t.data_as<bf16_t>(), states.data_as<bf16_t>(), dstates.data_as<bf16_t>(),
              vnew.data_as<bf16_t>(), dvnew.data_as<float>(), dq.data(), dk.data(), dv.data(),
              dq.stride(0), dq.stride(1), dk.stride(0), dk.stride(1), dv.stride(0), dv.stride(1),
              dg.data_as<float>(), dbeta.data_as<float>(), dg.stride(0), dg.stride(1), dbeta.stride(0), dbeta.stride(1),
              t_len, heads, scale};
  launch_chunk_grads(ga, D, dq.dtype() == DType::bf16, chunks);
  times.mark("chunk-gradients");
}

template <int D>
void state_backward(const TensorView& d_state, const TensorView& d_out, const TensorView& q, const TensorView& k,
                    const TensorView& g, const TensorView& beta, float scale) {
  const int t_len = static_cast<int>(k.size(0)), heads = static_cast<int>(k.size(1));
  const int chunks = (t_len + kC - 1) / kC;
  const Prepared p = prepare<D>(q, k, nullptr, g, beta, scale);
  Tensor dstate = clone(d_state);
  PassArgs bwd{p.w.data_as<bf16_t>(), nullptr, p.kt.data_as<bf16_t>(), p.qh.data_as<bf16_t>(), p.a.data_as<bf16_t>(),
               p.gamma.data_as<float>(), rows_of(d_out), t_len, chunks, heads, dstate.data_as<float>(), nullptr,
               nullptr, nullptr};
  run_pass<D, true>(bwd);
  copy_into(d_state, dstate);
}

void check_common(const TensorView& d_state, const TensorView& d_out, const TensorView& q, const TensorView& k,
                  const TensorView& g, const TensorView& beta, const DeltaRuleParams& params) {
  check_rows(q, "q");
  check_rows(k, "k");
  check_rows(d_out, "d_out");
  cuda::expect_cuda(g, "g", DType::f32);
  cuda::expect_cuda(beta, "beta", DType::f32);
  cuda::expect_cuda(d_state, "d_state", DType::f32);
  const int64_t d = k.size(2);
  HYDRA_ASSERT((d == 64 || d == 128) && q.size(2) == d && d_out.size(2) == d,
               "CUDA delta rule backward supports dk = dv in {{64, 128}}, got {}/{}", d, d_out.size(2));
  HYDRA_ASSERT(params.chunk == kC, "CUDA delta rule backward uses chunks of {}", kC);
  HYDRA_ASSERT(d_state.rank() == 3 && d_state.size(0) == k.size(1) && d_state.size(1) == d && d_state.size(2) == d,
               "d_state must be [H, {}, {}]", d, d);
}

}  // namespace
}  // namespace gdn_bwd

void delta_rule_chunked_backward(const TensorView& dq, const TensorView& dk, const TensorView& dv, const TensorView& dg,
                                 const TensorView& dbeta, const TensorView& d_state, const TensorView& d_out,
                                 const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g,
                                 const TensorView& beta, const TensorView& state0, const DeltaRuleParams& params) {
  gdn_bwd::check_common(d_state, d_out, q, k, g, beta, params);
  gdn_bwd::check_rows(v, "v");
  cuda::expect_cuda(state0, "state0", DType::f32);
  cuda::expect_cuda(dg, "dg", DType::f32);
  cuda::expect_cuda(dbeta, "dbeta", DType::f32);
  const DType out_type = dq.dtype();
  HYDRA_ASSERT((out_type == DType::bf16 || out_type == DType::f32) && dk.dtype() == out_type && dv.dtype() == out_type,
               "CUDA delta rule backward: dq, dk, dv must all be bf16 or all f32");
  for (const TensorView* t : {&dq, &dk, &dv}) {
    HYDRA_ASSERT(t->device() == Device::cuda && t->rank() == 3 && t->stride(2) == 1 && t->stride(0) % 2 == 0 &&
                     t->stride(1) % 2 == 0 && reinterpret_cast<uintptr_t>(t->data()) % 8 == 0,
                 "CUDA delta rule backward: dq/dk/dv rows must be 8-byte aligned");
  }
  if (k.size(0) == 0) return;  // no tokens: d_state passes through, nothing else to write
  const float scale = params.scale > 0 ? params.scale : 1.0f / std::sqrt(static_cast<float>(k.size(2)));
  if (k.size(2) == 128) {
    gdn_bwd::chunked_backward<128>(dq, dk, dv, dg, dbeta, d_state, d_out, q, k, v, g, beta, state0, scale);
  } else {
    gdn_bwd::chunked_backward<64>(dq, dk, dv, dg, dbeta, d_state, d_out, q, k, v, g, beta, state0, scale);
  }
}

void delta_rule_state_backward(const TensorView& d_state, const TensorView& d_out, const TensorView& q,
                               const TensorView& k, const TensorView& g, const TensorView& beta,
                               const DeltaRuleParams& params) {
  gdn_bwd::check_common(d_state, d_out, q, k, g, beta, params);
  if (k.size(0) == 0) return;
  const float scale = params.scale > 0 ? params.scale : 1.0f / std::sqrt(static_cast<float>(k.size(2)));
  if (k.size(2) == 128) {
    gdn_bwd::state_backward<128>(d_state, d_out, q, k, g, beta, scale);
  } else {
    gdn_bwd::state_backward<64>(d_state, d_out, q, k, g, beta, scale);
  }
}

void delta_rule_apply_map_transposed(const TensorView& d_state, const TensorView& m, const TensorView& d_loc) {
  // d_state ← Mᵀ d_state + d_loc per head: one batched fp32 GEMM (all heads).
  for (const auto& [t, name] : {std::pair{d_state, "d_state"}, {m, "m"}, {d_loc, "d_loc"}}) {
    cuda::expect_cuda(t, name, DType::f32);
  }
  Tensor next = clone(d_loc);
  gemm_batched(next, m, d_state, GemmParams{.transpose_a = Transpose::yes, .beta = 1.0f});
  copy_into(d_state, next);
}

}  // namespace hydra::ops::cuda_impl
