// Flash attention backward (CUDA): delta = rowsum(dO ⊙ O) and the gradients of one (query block,
// key block) pair, accumulated in fp32 (+=) so ring attention can sum key blocks (attention.h).
//
// Structure (FlashAttention-2's backward; tensor cores through mma.sync m16n8k16 bf16 -> fp32):
//   CTA = Bc / 16 warps = one block of Bc keys (128, or 64 for d = 64 with packed documents:
//   choose_backward_kernel says why) of one KV head; warp w owns keys 16w..16w+15 and keeps their
//   dK and dV in registers. The CTA loops over every query head of its KV head (GQA: dK/dV sum them
//   without atomics) and over the query blocks of kBr = 64 rows that can see its keys (causal: from
//   the block holding the first key's position), streaming Q and dO through a 2-stage cp.async
//   pipeline and each next step's lse, delta and document starts through registers (loaded when a
//   step starts, stored for the next after its products). Per query block, with the transposed products so that
//   every operand of dV and dK is already in registers:
//     Sᵀ = K Qᵀ,  Pᵀ = exp2(Sᵀ · scale·τ_q·log2 e − lse_q·log2 e)     (recomputed, never stored)
//     dV += Pᵀ dO,  dPᵀ = V dOᵀ,  dSᵀ = Pᵀ ⊙ (dPᵀ − delta_q) · scale·τ_q,  dK += dSᵀ Q
//     dQ (+)= dS K: dSᵀ goes through shared memory (bf16), each warp computes a 16 × d/2 slice and
//     adds it to the fp32 dq accumulator with float2 atomics (red.global.add.v2.f32).
//   Why atomics for dQ rather than a separate dQ pass: the separate pass recomputes S and dP (two
//   more of the five GEMMs, +40% FLOPs); the atomics cost 64·d fp32 reductions per 128-key block,
//   which the L2 absorbs (FlashAttention-2 and -3 make the same choice). dq is not deterministic in
//   its last bits because of the order of the atomics.
// For d = 128 on Hopper the default is the warp-specialised TMA/wgmma kernel of
// attention_backward_ws.cuh (same parameters and results; for views TMA can describe and
// 16-byte-aligned dq rows, other shapes run this kernel); HYDRA_ATTENTION_BWD_KERNEL=mma selects
// this mma.sync kernel with 128-key blocks for every shape, mma-k64 the 64-key blocks at d = 64. (A non-warp-specialised wgmma kernel was removed: without a
// producer warp its loads and softmax left the tensor cores idle, and it was slower than the
// warp-specialised one in the same job: cluster/results/h200-2026-12-01.)
// Masking: key j (position k_pos0 + j) contributes to query i (q_pos0 + i) iff k ≤ q when causal;
// the per-element mask runs only on blocks that touch the diagonal or the ends. A query whose final
// lse is −inf (no visible key anywhere) gets P = 0.
#include <cmath>
#include <cstdlib>
#include <string>

#include "kernels/attention/attention.h"
#include "kernels/attention/attention_backward.cuh"
#include "kernels/attention/attention_backward_ws.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma.cuh"

namespace hydra::ops::cuda_impl {
namespace {

// ---------------------------------------------------------------------------------------------
// delta[h, t] = Σ_c d_out[t, h, c] · out[t, h, c]: one warp per (t, h) row (any dtype mix, any dv).
template <class TO, class TD>
__global__ void attention_delta_kernel(float* delta, int64_t delta_sh, int64_t delta_st, const TD* dout, int64_t do_st,
                                       int64_t do_sh, const TO* out, int64_t o_st, int64_t o_sh, int64_t rows,
                                       int heads, int dv) {
  const int lane = threadIdx.x % 32;
  for (int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32; row < rows;
       row += int64_t(gridDim.x) * blockDim.x / 32) {
    const int64_t t = row / heads;
    const int h = static_cast<int>(row % heads);
    const TD* d = dout + t * do_st + h * do_sh;
    const TO* o = out + t * o_st + h * o_sh;
    float acc = 0.0f;
    for (int c = lane; c < dv; c += 32) acc += cuda::to_float(d[c]) * cuda::to_float(o[c]);
#pragma unroll
    for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (lane == 0) delta[h * delta_sh + t * delta_st] = acc;
  }
}

// The same for bf16 d_out and out whose rows are L 16-byte chunks (dv = 8·L, L = 8 or 16) at 16-byte
// aligned addresses: L lanes a row, one 16-byte load of each tensor a lane. The warp-a-row kernel's
// 2-byte loads keep too few bytes in flight to reach the memory bandwidth (32 µs for the small model's
// 16K × 8 × 64, ~11 µs at bandwidth); here a resident warp has 1 KB in flight instead of 128 B.
template <int L>
__global__ void attention_delta_bf16_kernel(float* delta, int64_t delta_sh, int64_t delta_st, const bf16_t* dout,
                                            int64_t do_st, int64_t do_sh, const bf16_t* out, int64_t o_st, int64_t o_sh,
                                            int64_t rows, int heads) {
  constexpr int kRowsPerWarp = 32 / L;
  const int lane = threadIdx.x % 32, sub = lane % L;
  const int64_t warps = int64_t(gridDim.x) * blockDim.x / 32;
  // The loop bound depends on the warp only, so every lane reaches the shuffles.
  for (int64_t base = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32 * kRowsPerWarp; base < rows;
       base += warps * kRowsPerWarp) {
    const int64_t row = base + lane / L;
    float acc = 0.0f;
    if (row < rows) {
      const int64_t t = row / heads;
      const int h = static_cast<int>(row % heads);
      const uint4 dd = *reinterpret_cast<const uint4*>(dout + t * do_st + h * do_sh + sub * 8);
      const uint4 oo = *reinterpret_cast<const uint4*>(out + t * o_st + h * o_sh + sub * 8);
      const uint32_t dw[4] = {dd.x, dd.y, dd.z, dd.w}, ow[4] = {oo.x, oo.y, oo.z, oo.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float2 df = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&dw[i]));
        const float2 of = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&ow[i]));
        acc += df.x * of.x + df.y * of.y;
      }
    }
#pragma unroll
    for (int off = L / 2; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (row < rows && sub == 0) delta[(row % heads) * delta_sh + (row / heads) * delta_st] = acc;
  }
}

// ---------------------------------------------------------------------------------------------
// The mma.sync backward kernel: D = 64 or 128, Bc = 128 or 64 keys a CTA (Bc / 16 warps, 16 keys each).
constexpr int kBr = 64;

template <int D, int Bc>
struct MmaSmem {
  static constexpr int threads = 2 * Bc;                   // Bc / 16 warps
  static constexpr size_t kv_bytes = size_t(Bc) * D * 2;   // K or V (swizzled rows)
  static constexpr size_t q_bytes = size_t(kBr) * D * 2;   // one stage of Q or dO
  static constexpr size_t ds_bytes = size_t(Bc) * kBr * 2;  // dSᵀ [keys][queries] bf16
  static constexpr size_t stats_bytes = 4 * kBr * 4;       // lse2, delta, τ-scales of one stage
  static constexpr size_t total = 2 * kv_bytes + 4 * q_bytes + ds_bytes + 2 * stats_bytes;
};

// Shared memory of the mma.sync kernel: K, V (swizzled rows), Q and dO (2 stages each), dSᵀ, and per
// stage the row statistics and each query row's first visible key.
struct MmaTiles {
  unsigned char *k, *v, *q, *dout, *ds;
  float* stats;       // per stage [4][kBr]: lse2 = lse·log2 e (+∞ for a row that sees no key), delta, qscale, dscale
  int (*first)[kBr];  // [2][kBr]
};

// cp.async of rows [row0, row0 + rows) of a [T][D] bf16 view (rows ≥ rows_valid: zeros) into a
// swizzled tile, all Threads threads of the CTA.
template <int D, int Threads>
__device__ __forceinline__ void mma_load_rows(unsigned char* dst, const bf16_t* src, int64_t row_stride, int row0,
                                              int rows_valid, int rows, int tid) {
  constexpr int kChunks = D / 8;
  for (int i = tid; i < rows * kChunks; i += Threads) {
    const int r = i / kChunks, c = i % kChunks;
    const bool ok = row0 + r < rows_valid;
    const bf16_t* gp = src + (ok ? (row0 + r) * row_stride : 0) + c * 8;
    cuda::cp_async_16(cuda::smem_addr(dst) + cuda::swizzled<kChunks>(r, c), gp, ok ? 16 : 0);
  }
}

// One query row's statistics for a later step, read into registers by thread `row` < kBr when the
// step before it starts and written to shared memory (mma_store_row) only after that step's
// products, so the loads' latency hides behind them instead of stalling the step.
struct MmaRow {
  float lse = 0.0f, delta = 0.0f;
  int64_t doc = 0;  // the row's document start (packed documents), else 0
};

__device__ __forceinline__ MmaRow mma_fetch_row(const BwdParams& p, int h, int m0, int tid) {
  MmaRow r;
  const int row = m0 + tid;
  const bool ok = row < p.tq;
  r.lse = ok ? p.lse[h * p.lse_sh + row * p.lse_st] : -INFINITY;  // rows past tq see nothing
  r.delta = ok ? p.delta[h * p.delta_sh + row * p.delta_st] : 0.0f;
  if (p.q_doc_start) r.doc = p.q_doc_start[ok ? row : p.tq - 1];
  return r;
}

// The τ scales, lse2 and the first visible key (an index into k, clamped) of row tid of a stage.
__device__ __forceinline__ void mma_store_row(const BwdParams& p, const MmaTiles& sm, int stage, int m0, int tid,
                                              const MmaRow& r) {
  float* stt = sm.stats + stage * 4 * kBr;
  const float tau = bwd_tau(p, mask::tau_position(p.q_pos0 + m0 + tid, r.doc));
  stt[tid] = r.lse == -INFINITY ? INFINITY : r.lse * 1.4426950408889634f;
  stt[kBr + tid] = r.delta;
  stt[2 * kBr + tid] = p.scale_log2 * tau;
  stt[3 * kBr + tid] = p.scale * tau;
  const int64_t first = r.doc - p.k_pos0;
  sm.first[stage][tid] = first < 0 ? 0 : (first > (1 << 30) ? (1 << 30) : static_cast<int>(first));
}

// Pᵀ = exp2(Sᵀ·qscale − lse2) in place of Sᵀ (16 keys × kBr queries per warp) without a branch per
// element: a row that sees no key has lse2 = +∞, a hidden entry gets an exponent of −∞, and ex2 of −∞
// is +0. Key row key0 + 8h (h = e / 2, key0 = k0 + this lane's first key row) is hidden from query
// column c when it is past tk, c is past the queries (c ≥ q_limit), (causal) its position exceeds
// the query's (lag + 8h > c, lag = the position difference at c = 0, clamped into int range: c < 64),
// or (packed documents) it lies before the query's document (key0 + 8h < first[c]).
template <bool Masked>
__device__ __forceinline__ void mma_form_p(float (&s)[kBr / 8][4], const float* st_lse2, const float* st_qscale,
                                           const int* first, const BwdParams& p, int k0, int m0, int key_row0,
                                           bool docs, int c4) {
  int lag = 0, q_limit = 0;
  const int key0 = k0 + key_row0;
  bool key_ok[2] = {true, true};
  if constexpr (Masked) {
    const int64_t lag64 = p.k_pos0 + key0 - (p.q_pos0 + m0);
    lag = p.causal ? static_cast<int>(lag64 > (1 << 20) ? (1 << 20) : lag64 < -(1 << 20) ? -(1 << 20) : lag64) : -(1 << 20);
    q_limit = p.tq - m0;
    key_ok[0] = key0 < p.tk;
    key_ok[1] = key0 + 8 < p.tk;
  }
#pragma unroll
  for (int j = 0; j < kBr / 8; ++j) {
    const int col0 = j * 8 + c4 * 2;
    const float2 lse2 = *reinterpret_cast<const float2*>(st_lse2 + col0);
    const float2 qsc = *reinterpret_cast<const float2*>(st_qscale + col0);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float x = s[j][e] * (e % 2 ? qsc.y : qsc.x) - (e % 2 ? lse2.y : lse2.x);
      if constexpr (Masked) {
        const int col = col0 + (e % 2), h = e / 2;
        const bool visible = key_ok[h] && col < q_limit && lag + 8 * h <= col && (!docs || key0 + 8 * h >= first[col]);
        x = visible ? x : -INFINITY;
      }
      s[j][e] = cuda::fast_exp2(x);
    }
  }
}

// dQ[64 × D] (+)= dS K over the CTA's Bc keys: 8 warps split it as 4 row blocks of 16 × 2 column
// halves, 4 warps as 4 row blocks of 16 × all D columns; each adds its slice to the fp32 dq
// accumulator with float2 atomics (rows past tq skipped).
template <int D, int Bc>
__device__ __forceinline__ void mma_dq_atomic(const BwdParams& p, const unsigned char* sds, const unsigned char* sk, int h,
                                              int m0, int warp, int lane) {
  constexpr int kChunks = D / 8;
  constexpr int kSplit = Bc / 64;            // column parts: 2 with 8 warps, 1 with 4
  constexpr int kNt = D / 8 / kSplit;        // 8-column tiles of this warp
  const int g4 = lane / 4, c4 = lane % 4;
  const int qr0 = (warp % 4) * 16, cb = (warp / 4) * kNt;  // cb: first 16-byte chunk
  float acc[kNt][4];
#pragma unroll
  for (int j = 0; j < kNt; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < Bc / 16; ++kk) {
    uint32_t a[4];  // A = dS [queries][keys] through a transposing load of dSᵀ [keys][queries]
    cuda::ldmatrix_x4_trans(a, cuda::smem_addr(sds) + cuda::swizzled<kBr / 8>(kk * 16 + (lane % 8) + (lane / 16) * 8,
                                                                              qr0 / 8 + (lane / 8) % 2));
#pragma unroll
    for (int j = 0; j < kNt; j += 2) {
      uint32_t b[4];  // B = K [keys][d] read transposed
      const int row = kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8, c = cb + j + lane / 16;
      cuda::ldmatrix_x4_trans(b, cuda::smem_addr(sk) + cuda::swizzled<kChunks>(row, c));
      cuda::mma_bf16(acc[j], a, b[0], b[1]);
      cuda::mma_bf16(acc[j + 1], a, b[2], b[3]);
    }
  }
  const int qa = m0 + qr0 + g4, qb = qa + 8;
#pragma unroll
  for (int j = 0; j < kNt; ++j) {
    const int col = cb * 8 + j * 8 + c4 * 2;
    if (qa < p.tq) atomicAdd(reinterpret_cast<float2*>(p.dq + qa * p.dq_st + h * p.dq_sh + col), make_float2(acc[j][0], acc[j][1]));
    if (qb < p.tq) atomicAdd(reinterpret_cast<float2*>(p.dq + qb * p.dq_st + h * p.dq_sh + col), make_float2(acc[j][2], acc[j][3]));
  }
}

// CTAs a multiprocessor should hold: Bc = 64 (D = 64) is for short documents, where a CTA has few
// steps and the SM needs several CTAs to hide each one's serial chain: 3 fit (168 registers a thread,
// 58 KB of shared memory each).
template <int D, int Bc>
constexpr int kMmaMinBlocks = Bc == 64 ? 3 : 1;

// The stages per step: Sᵀ and Pᵀ, dV, dPᵀ and dSᵀ, dK, dSᵀ to shared memory, dQ (mma_dq_atomic);
// Q and dO by cp.async one step ahead, the next step's row statistics into registers at the start of
// a step and to shared memory before its dQ barrier; the dK/dV epilogue (bwd_add_dk_dv).
template <int D, int Bc>
__global__ void __launch_bounds__(2 * Bc, (kMmaMinBlocks<D, Bc>)) attention_backward_mma_kernel(const __grid_constant__ BwdParams p) {
  using S = MmaSmem<D, Bc>;
  constexpr int kThreads = S::threads;
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ int sfirst[2][kBr];  // packed documents: per stage, each query row's first visible key
  MmaTiles sm;
  sm.k = smem;
  sm.v = sm.k + S::kv_bytes;
  sm.q = sm.v + S::kv_bytes;          // 2 stages
  sm.dout = sm.q + 2 * S::q_bytes;    // 2 stages
  sm.ds = sm.dout + 2 * S::q_bytes;
  sm.stats = reinterpret_cast<float*>(sm.ds + S::ds_bytes);
  sm.first = sfirst;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g4 = lane / 4, c4 = lane % 4;
  const int kvh = blockIdx.y, k0 = blockIdx.x * Bc;  // block 0 holds the most causal work: it starts first
  BwdSteps<kBr> st(p, kvh, k0);
  if (!st.plan(bwd_query_end(p, k0, Bc))) return;  // packed documents: the last query that sees these keys
  mma_load_rows<D, kThreads>(sm.k, p.k + kvh * p.k_sh, p.k_st, k0, p.tk, Bc, tid);
  mma_load_rows<D, kThreads>(sm.v, p.v + kvh * p.v_sh, p.v_st, k0, p.tk, Bc, tid);
  {
    const int h = st.head(p, 0), m0 = st.m0(0);
    mma_load_rows<D, kThreads>(sm.q, p.q + h * p.q_sh, p.q_st, m0, p.tq, kBr, tid);
    mma_load_rows<D, kThreads>(sm.dout, p.dout + h * p.do_sh, p.do_st, m0, p.tq, kBr, tid);
    if (tid < kBr) mma_store_row(p, sm, 0, m0, tid, mma_fetch_row(p, h, m0, tid));
  }
  cuda::cp_async_commit();

  float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
  for (int j = 0; j < D / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[j][e] = dv[j][e] = 0.0f;
  const int key_row0 = warp * 16 + g4;  // this lane's key rows in the block: key_row0, key_row0 + 8

  for (int step = 0; step < st.count; ++step) {
    const int stage = step % 2;
    const int h = st.head(p, step);
    const int m0 = st.m0(step);
    cuda::cp_async_wait<0>();
    __syncthreads();  // this stage landed for every thread; the other stage and sds are free again
    const bool has_next = step + 1 < st.count;
    const int h_next = has_next ? st.head(p, step + 1) : 0, m0_next = has_next ? st.m0(step + 1) : 0;
    MmaRow next;
    if (has_next) {
      mma_load_rows<D, kThreads>(sm.q + (stage ^ 1) * S::q_bytes, p.q + h_next * p.q_sh, p.q_st, m0_next, p.tq, kBr, tid);
      mma_load_rows<D, kThreads>(sm.dout + (stage ^ 1) * S::q_bytes, p.dout + h_next * p.do_sh, p.do_st, m0_next, p.tq,
                                 kBr, tid);
      if (tid < kBr) next = mma_fetch_row(p, h_next, m0_next, tid);  // consumed after this step's products
    }
    cuda::cp_async_commit();
    const unsigned char* qs = sm.q + stage * S::q_bytes;
    const unsigned char* dos = sm.dout + stage * S::q_bytes;
    const float* st_lse2 = sm.stats + stage * 4 * kBr;
    const float* st_delta = st_lse2 + kBr;
    const float* st_qscale = st_lse2 + 2 * kBr;
    const float* st_dscale = st_lse2 + 3 * kBr;

    // Sᵀ = K Qᵀ (16 keys × 64 queries per warp), then Pᵀ in place.
    float s[kBr / 8][4];
    bwd_mma_rows_by_rows<D, kBr>(s, sm.k, qs, warp * 16, 0, lane);
    const bool docs = p.q_doc_start && sfirst[stage][kBr - 1] > k0;  // some row's document starts after key k0
    const bool need_mask =
        (p.causal && p.k_pos0 + k0 + Bc - 1 > p.q_pos0 + m0) || k0 + Bc > p.tk || m0 + kBr > p.tq || docs;
    if (need_mask) {
      mma_form_p<true>(s, st_lse2, st_qscale, sfirst[stage], p, k0, m0, key_row0, docs, c4);
    } else {
      mma_form_p<false>(s, st_lse2, st_qscale, sfirst[stage], p, k0, m0, key_row0, docs, c4);
    }
    // dV += Pᵀ dO (A = Pᵀ from the accumulators, B = dO read transposed).
    bwd_mma_acc_times_rows<D, kBr>(dv, s, dos, lane);
    // dPᵀ = V dOᵀ, dSᵀ = Pᵀ (dPᵀ − delta) · scale·τ.
    {
      float dp[kBr / 8][4];
      bwd_mma_rows_by_rows<D, kBr>(dp, sm.v, dos, warp * 16, 0, lane);
#pragma unroll
      for (int j = 0; j < kBr / 8; ++j) {
        const int col0 = j * 8 + c4 * 2;
        const float2 dl = *reinterpret_cast<const float2*>(st_delta + col0);
        const float2 ds = *reinterpret_cast<const float2*>(st_dscale + col0);
#pragma unroll
        for (int e = 0; e < 4; ++e) s[j][e] = s[j][e] * (dp[j][e] - (e % 2 ? dl.y : dl.x)) * (e % 2 ? ds.y : ds.x);
      }
    }
    // dK += dSᵀ Q.
    bwd_mma_acc_times_rows<D, kBr>(dk, s, qs, lane);
    // dSᵀ (bf16) to shared memory for dQ: [Bc keys][64 queries], 16-byte chunks swizzled.
#pragma unroll
    for (int j = 0; j < kBr / 8; ++j)
#pragma unroll
      for (int h2 = 0; h2 < 2; ++h2) {
        const int r = key_row0 + h2 * 8;
        *reinterpret_cast<uint32_t*>(sm.ds + cuda::swizzled<kBr / 8>(r, j) + c4 * 4) =
            cuda::pack_bf16(s[j][2 * h2], s[j][2 * h2 + 1]);
      }
    // The next step's row statistics into the other stage: its readers (step − 1) are past the barrier
    // at this step's start, and step + 1 reads them after the next one.
    if (has_next && tid < kBr) mma_store_row(p, sm, stage ^ 1, m0_next, tid, next);
    __syncthreads();
    mma_dq_atomic<D, Bc>(p, sm.ds, sm.k, h, m0, warp, lane);
  }
  cuda::cp_async_wait<0>();  // no copy may be in flight at exit
  bwd_add_dk_dv<D>(p, kvh, k0 + key_row0, c4, [&](int j, int e) { return dk[j][e]; }, [&](int j, int e) { return dv[j][e]; });
}

template <int D, int Bc>
void launch_mma(const BwdParams& p, int hk) {
  using S = MmaSmem<D, Bc>;
  HYDRA_CUDA_CHECK(cudaFuncSetAttribute(attention_backward_mma_kernel<D, Bc>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(S::total)));
  const dim3 grid(static_cast<unsigned>((p.tk + Bc - 1) / Bc), static_cast<unsigned>(hk));
  attention_backward_mma_kernel<D, Bc><<<grid, S::threads, S::total, current_stream()>>>(p);
  HYDRA_CUDA_LAUNCH_CHECK();
}

void launch_ws(const BwdParams& p, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& d_out) {
  bwd_ws::WsParams wp{};
  wp.p = p;
  wp.q_map = cuda::make_tma_map_bf16(q.data(), q.size(0), q.size(1), bwd_ws::kD, q.stride(0), q.stride(1), bwd_ws::kBr);
  wp.do_map = cuda::make_tma_map_bf16(d_out.data(), d_out.size(0), d_out.size(1), bwd_ws::kD, d_out.stride(0),
                                      d_out.stride(1), bwd_ws::kBr);
  wp.k_map = cuda::make_tma_map_bf16(k.data(), k.size(0), k.size(1), bwd_ws::kD, k.stride(0), k.stride(1), bwd_ws::kBc);
  wp.v_map = cuda::make_tma_map_bf16(v.data(), v.size(0), v.size(1), bwd_ws::kD, v.stride(0), v.stride(1), bwd_ws::kBc);
  auto kernel = bwd_ws::attention_backward_ws_kernel;
  HYDRA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(bwd_ws::kSmemBytes)));
  const dim3 grid(static_cast<unsigned>((p.tk + bwd_ws::kBc - 1) / bwd_ws::kBc), static_cast<unsigned>(k.size(1)));
  kernel<<<grid, bwd_ws::kThreads, bwd_ws::kSmemBytes, current_stream()>>>(wp);
  HYDRA_CUDA_LAUNCH_CHECK();
}

// The warp-specialised kernel reads q, k, v, d_out through TMA tensor maps (rows that nest: stride(0)
// ≥ heads · stride(1), stride(1) ≥ d) and adds whole 512-byte dq rows with bulk reductions (16-byte
// aligned rows).
bool ws_supports(const TensorView& dq, const TensorView& d_out, const TensorView& q, const TensorView& k,
                 const TensorView& v) {
  auto nested = [](const TensorView& t) { return t.stride(0) >= t.size(1) * t.stride(1) && t.stride(1) >= t.size(2); };
  return nested(q) && nested(k) && nested(v) && nested(d_out) && dq.stride(0) % 4 == 0 && dq.stride(1) % 4 == 0 &&
         reinterpret_cast<uintptr_t>(dq.data()) % 16 == 0;
}

// Which kernel runs a call (AttentionParams::backward_kernel, attention.h):
//   d = 128: ws (the default on compute capability 9.x, for views ws_supports and one document) or
//            the mma.sync kernel with 128-key blocks (mma, mma-k64, other GPUs, packed documents);
//   d = 64:  the mma.sync kernel with 64-key blocks (mma-k64; the default with packed documents) or
//            with 128-key blocks (mma; the default for one document).
// Why 64-key blocks for packed documents: with documents of 256 tokens a 128-key CTA has at most 8
// steps of 64 queries (GQA 2 heads × 4 blocks), 1 CTA a multiprocessor fits (255 registers × 256
// threads), and its serial chain (loads, 5 products, 2 barriers a step) leaves the tensor cores idle;
// 64-key CTAs of 4 warps fit 3 a multiprocessor (12 warps instead of 8), compute 17% fewer masked
// products on the causal diagonal (10 instead of 12 64 × 64 tiles a document and head), and spread
// the same work over twice the CTAs. For one long sequence the 128-key CTA reads each Q/dO tile for
// twice the keys; which wins there is for `hydra bench --op attention-bwd` to say (it times both).
enum class BwdKernel { mma, mma_k64, ws };
BwdKernel choose_backward_kernel(AttentionBackwardKernel choice, int64_t d, bool documents) {
  static const bool hopper = [] {
    int device = 0, major = 0;
    HYDRA_CUDA_CHECK(cudaGetDevice(&device));
    HYDRA_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    return major == 9;
  }();
  if (d == 64) {
    if (choice == AttentionBackwardKernel::mma_k64) return BwdKernel::mma_k64;
    if (choice == AttentionBackwardKernel::mma) return BwdKernel::mma;
    return documents ? BwdKernel::mma_k64 : BwdKernel::mma;
  }
  const bool ws = (choice == AttentionBackwardKernel::automatic || choice == AttentionBackwardKernel::ws) && hopper;
  return ws && !documents ? BwdKernel::ws : BwdKernel::mma;
}

void check_rows(const TensorView& t, const char* what, DType dtype, int align_elems) {
  cuda::expect_cuda(t, what, dtype);
  HYDRA_ASSERT(t.rank() == 3 && t.stride(2) == 1 && t.stride(0) % align_elems == 0 && t.stride(1) % align_elems == 0 &&
                   reinterpret_cast<uintptr_t>(t.data()) % (align_elems * t.element_size()) == 0,
               "CUDA attention backward: {} needs unit last stride and {}-element aligned rows", what, align_elems);
}

}  // namespace

void attention_backward_prepare(const TensorView& delta, const TensorView& d_out, const TensorView& out) {
  cuda::expect_cuda(delta, "attention delta", DType::f32);
  HYDRA_ASSERT(d_out.device() == Device::cuda && out.device() == Device::cuda && d_out.stride(2) == 1 && out.stride(2) == 1,
               "attention_backward_prepare: CUDA d_out and out with unit last stride");
  const int64_t tq = out.size(0), hq = out.size(1), dv = out.size(2), rows = tq * hq;
  if (rows == 0) return;
  const bool o_bf16 = out.dtype() == DType::bf16, d_bf16 = d_out.dtype() == DType::bf16;
  HYDRA_ASSERT((o_bf16 || out.dtype() == DType::f32) && (d_bf16 || d_out.dtype() == DType::f32),
               "attention_backward_prepare: d_out and out must be bf16 or f32");
  auto chunked = [](const TensorView& t) {
    return t.stride(0) % 8 == 0 && t.stride(1) % 8 == 0 && reinterpret_cast<uintptr_t>(t.data()) % 16 == 0;
  };
  if (o_bf16 && d_bf16 && (dv == 64 || dv == 128) && chunked(d_out) && chunked(out)) {
    const int64_t rows_per_block = 256 / (dv / 8);  // 256 threads, dv / 8 a row
    const int blocks = cuda::capped_grid((rows + rows_per_block - 1) / rows_per_block);
    auto run = [&](auto kernel) {
      kernel<<<blocks, 256, 0, current_stream()>>>(delta.data_as<float>(), delta.stride(0), delta.stride(1),
                                                   d_out.data_as<const bf16_t>(), d_out.stride(0), d_out.stride(1),
                                                   out.data_as<const bf16_t>(), out.stride(0), out.stride(1), rows,
                                                   static_cast<int>(hq));
    };
    if (dv == 64) run(attention_delta_bf16_kernel<8>);
    if (dv == 128) run(attention_delta_bf16_kernel<16>);
    HYDRA_CUDA_LAUNCH_CHECK();
    return;
  }
  const int blocks = cuda::capped_grid((rows + 7) / 8);
  auto launch = [&](auto* o_ptr, auto* d_ptr) {
    attention_delta_kernel<<<blocks, 256, 0, current_stream()>>>(delta.data_as<float>(), delta.stride(0), delta.stride(1),
                                                                d_ptr, d_out.stride(0), d_out.stride(1), o_ptr,
                                                                out.stride(0), out.stride(1), rows, static_cast<int>(hq),
                                                                static_cast<int>(dv));
  };
  if (o_bf16 && d_bf16) launch(out.data_as<const bf16_t>(), d_out.data_as<const bf16_t>());
  if (o_bf16 && !d_bf16) launch(out.data_as<const bf16_t>(), d_out.data_as<const float>());
  if (!o_bf16 && d_bf16) launch(out.data_as<const float>(), d_out.data_as<const bf16_t>());
  if (!o_bf16 && !d_bf16) launch(out.data_as<const float>(), d_out.data_as<const float>());
  HYDRA_CUDA_LAUNCH_CHECK();
}

void attention_backward(const TensorView& dq, const TensorView& dk, const TensorView& dv, const TensorView& d_out,
                        const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& lse,
                        const TensorView& delta, const AttentionParams& params) {
  check_rows(q, "q", DType::bf16, 8);
  check_rows(k, "k", DType::bf16, 8);
  check_rows(v, "v", DType::bf16, 8);
  check_rows(d_out, "d_out", DType::bf16, 8);
  check_rows(dq, "dq", DType::f32, 2);
  check_rows(dk, "dk", DType::f32, 2);
  check_rows(dv, "dv", DType::f32, 2);
  cuda::expect_cuda(lse, "attention lse", DType::f32);
  cuda::expect_cuda(delta, "attention delta", DType::f32);
  const int64_t d = q.size(2), hq = q.size(1), hk = k.size(1);
  HYDRA_ASSERT((d == 64 || d == 128) && v.size(2) == d, "CUDA attention backward supports d = dv in {{64, 128}}, got {}/{}",
               d, v.size(2));
  HYDRA_ASSERT(hq <= kBwdMaxHeads, "CUDA attention backward: {} query heads > {}", hq, kBwdMaxHeads);
  if (q.size(0) == 0 || k.size(0) == 0) return;
  BwdParams p = make_bwd_params(dq, dk, dv, d_out, q, k, v, lse, delta, params);
  if (p.q_doc_start) cuda::expect_cuda(params.q_document_start, "attention q_document_start", DType::i64);
  if (p.k_doc_end) cuda::expect_cuda(params.k_document_end, "attention k_document_end", DType::i64);
  // Packed documents run on the mma.sync kernels (the only ones that take them).
  const BwdKernel kernel = choose_backward_kernel(params.backward_kernel, d, p.q_doc_start != nullptr);
  if (kernel == BwdKernel::ws && ws_supports(dq, d_out, q, k, v)) {
    launch_ws(p, q, k, v, d_out);
  } else if (d == 128) {
    launch_mma<128, 128>(p, static_cast<int>(hk));
  } else if (kernel == BwdKernel::mma_k64) {
    launch_mma<64, 64>(p, static_cast<int>(hk));
  } else {
    launch_mma<64, 128>(p, static_cast<int>(hk));
  }
}

}  // namespace hydra::ops::cuda_impl
