// Flash attention backward (CUDA): delta = rowsum(dO ⊙ O) and the gradients of one (query block,
// key block) pair, accumulated in fp32 (+=) so ring attention can sum key blocks (attention.h).
//
// Structure (FlashAttention-2's backward; tensor cores through mma.sync m16n8k16 bf16 -> fp32):
//   CTA = 8 warps = one block of kBc = 128 keys of one KV head; warp w owns keys 16w..16w+15 and
//   keeps their dK and dV in registers. The CTA loops over every query head of its KV head (GQA:
//   dK/dV sum them without atomics) and over the query blocks of kBr = 64 rows that can see its
//   keys (causal: from the block holding the first key's position), streaming Q, dO, lse and delta
//   through a 2-stage cp.async pipeline. Per query block, with the transposed products so that
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
// this mma.sync kernel for every shape. (A non-warp-specialised wgmma kernel was removed: without a
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
// delta[h, t] = Σ_c d_out[t, h, c] · out[t, h, c]: one warp per (t, h) row.
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

// ---------------------------------------------------------------------------------------------
// The mma.sync backward kernel (d = 64 or 128).
constexpr int kBc = 128, kBr = 64, kThreads = 256;

template <int D>
struct MmaSmem {
  static constexpr size_t kv_bytes = size_t(kBc) * D * 2;  // K or V (swizzled rows)
  static constexpr size_t q_bytes = size_t(kBr) * D * 2;   // one stage of Q or dO
  static constexpr size_t ds_bytes = size_t(kBc) * kBr * 2;  // dSᵀ [keys][queries] bf16
  static constexpr size_t stats_bytes = 4 * kBr * 4;       // lse, delta, τ-scales of one stage
  static constexpr size_t total = 2 * kv_bytes + 4 * q_bytes + ds_bytes + 2 * stats_bytes;
};

// Shared memory of the mma.sync kernel: K, V (swizzled rows), Q and dO (2 stages each), dSᵀ, and per
// stage the row statistics (lse, delta, qscale, dscale) and each query row's first visible key.
template <int D>
struct MmaTiles {
  unsigned char *k, *v, *q, *dout, *ds;
  float* stats;        // per stage: lse, delta, qscale, dscale [4][kBr]
  int (*first)[kBr];   // [2][kBr]
};

// cp.async of rows [row0, row0 + rows) of a [T][D] bf16 view (rows ≥ rows_valid: zeros) into a
// swizzled tile, all threads of the CTA.
template <int D>
__device__ __forceinline__ void mma_load_rows(unsigned char* dst, const bf16_t* src, int64_t row_stride, int row0,
                                              int rows_valid, int rows, int tid) {
  constexpr int kChunks = D / 8;
  for (int i = tid; i < rows * kChunks; i += kThreads) {
    const int r = i / kChunks, c = i % kChunks;
    const bool ok = row0 + r < rows_valid;
    const bf16_t* gp = src + (ok ? (row0 + r) * row_stride : 0) + c * 8;
    cuda::cp_async_16(cuda::smem_addr(dst) + cuda::swizzled<kChunks>(r, c), gp, ok ? 16 : 0);
  }
}

// Load of step `step` into `stage`: its Q and dO rows, lse and delta (cp.async), the τ scales and,
// with packed documents, each row's first visible key as an index into k (clamped).
template <int D>
__device__ __forceinline__ void mma_load_step(const BwdParams& p, const BwdSteps<kBr>& st, const MmaTiles<D>& sm, int step,
                                              int stage, int tid) {
  using S = MmaSmem<D>;
  const int h = st.head(p, step);
  const int m0 = st.m0(step);
  mma_load_rows<D>(sm.q + stage * S::q_bytes, p.q + h * p.q_sh, p.q_st, m0, p.tq, kBr, tid);
  mma_load_rows<D>(sm.dout + stage * S::q_bytes, p.dout + h * p.do_sh, p.do_st, m0, p.tq, kBr, tid);
  if (tid < kBr) {
    float* stt = sm.stats + stage * 4 * kBr;
    const int row = m0 + tid;
    const bool ok = row < p.tq;
    bwd_cp_async_4(cuda::smem_addr(stt + tid), p.lse + h * p.lse_sh + (ok ? row : 0) * p.lse_st, ok ? 4 : 0);
    bwd_cp_async_4(cuda::smem_addr(stt + kBr + tid), p.delta + h * p.delta_sh + (ok ? row : 0) * p.delta_st, ok ? 4 : 0);
    const int64_t doc = p.q_doc_start ? p.q_doc_start[ok ? row : p.tq - 1] : 0;
    const float tau = bwd_tau(p, mask::tau_position(p.q_pos0 + row, doc));
    stt[2 * kBr + tid] = p.scale_log2 * tau;
    stt[3 * kBr + tid] = p.scale * tau;
    const int64_t first = doc - p.k_pos0;
    sm.first[stage][tid] = first < 0 ? 0 : (first > (1 << 30) ? (1 << 30) : static_cast<int>(first));
  }
}

// dQ[64 × D] (+)= dS K: warp w computes query rows 16·(w % 4).., columns (w / 4)·D/2.., and adds
// them to the fp32 dq accumulator with float2 atomics (rows past tq skipped).
template <int D>
__device__ __forceinline__ void mma_dq_atomic(const BwdParams& p, const unsigned char* sds, const unsigned char* sk, int h,
                                              int m0, int warp, int lane) {
  constexpr int kChunks = D / 8;
  constexpr int kNt = D / 16;  // 8-column tiles in D/2 columns
  const int g4 = lane / 4, c4 = lane % 4;
  const int qr0 = (warp % 4) * 16, cb = (warp / 4) * (D / 16);  // cb: first 16-byte chunk
  float acc[kNt][4];
#pragma unroll
  for (int j = 0; j < kNt; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < kBc / 16; ++kk) {
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

// The stages per step: Sᵀ and Pᵀ, dV, dPᵀ and dSᵀ, dK, dSᵀ to shared memory, dQ (mma_dq_atomic);
// loads by mma_load_rows / mma_load_step one step ahead; the dK/dV epilogue (bwd_add_dk_dv).
template <int D>
__global__ void __launch_bounds__(kThreads, 1) attention_backward_mma_kernel(const __grid_constant__ BwdParams p) {
  using S = MmaSmem<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ int sfirst[2][kBr];  // packed documents: per stage, each query row's first visible key
  MmaTiles<D> sm;
  sm.k = smem;
  sm.v = sm.k + S::kv_bytes;
  sm.q = sm.v + S::kv_bytes;          // 2 stages
  sm.dout = sm.q + 2 * S::q_bytes;    // 2 stages
  sm.ds = sm.dout + 2 * S::q_bytes;
  sm.stats = reinterpret_cast<float*>(sm.ds + S::ds_bytes);
  sm.first = sfirst;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g4 = lane / 4, c4 = lane % 4;
  const int kvh = blockIdx.y, k0 = blockIdx.x * kBc;  // block 0 holds the most causal work: it starts first
  BwdSteps<kBr> st(p, kvh, k0);
  if (!st.plan(bwd_query_end(p, k0, kBc))) return;  // packed documents: the last query that sees these keys
  mma_load_rows<D>(sm.k, p.k + kvh * p.k_sh, p.k_st, k0, p.tk, kBc, tid);
  mma_load_rows<D>(sm.v, p.v + kvh * p.v_sh, p.v_st, k0, p.tk, kBc, tid);
  mma_load_step<D>(p, st, sm, 0, 0, tid);
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
    if (step + 1 < st.count) mma_load_step<D>(p, st, sm, step + 1, stage ^ 1, tid);
    cuda::cp_async_commit();
    const unsigned char* qs = sm.q + stage * S::q_bytes;
    const unsigned char* dos = sm.dout + stage * S::q_bytes;
    const float* st_lse = sm.stats + stage * 4 * kBr;
    const float* st_delta = st_lse + kBr;
    const float* st_qscale = st_lse + 2 * kBr;
    const float* st_dscale = st_lse + 3 * kBr;

    // Sᵀ = K Qᵀ (16 keys × 64 queries per warp), then Pᵀ in place.
    float s[kBr / 8][4];
    bwd_mma_rows_by_rows<D, kBr>(s, sm.k, qs, warp * 16, 0, lane);
    const bool doc_mask = p.q_doc_start && sfirst[stage][kBr - 1] > k0;  // some row's document starts after key k0
    const bool need_mask =
        (p.causal && p.k_pos0 + k0 + kBc - 1 > p.q_pos0 + m0) || k0 + kBc > p.tk || m0 + kBr > p.tq || doc_mask;
#pragma unroll
    for (int j = 0; j < kBr / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = j * 8 + c4 * 2 + (e % 2), key = k0 + key_row0 + (e / 2) * 8;
        const float lse = st_lse[col];
        bool visible = lse != -INFINITY;
        if (need_mask) {
          visible = visible && key < p.tk && m0 + col < p.tq &&
                    !(p.causal && p.k_pos0 + key > p.q_pos0 + m0 + col) && !(doc_mask && key < sfirst[stage][col]);
        }
        s[j][e] = visible ? exp2f(s[j][e] * st_qscale[col] - lse * 1.4426950408889634f) : 0.0f;
      }
    // dV += Pᵀ dO (A = Pᵀ from the accumulators, B = dO read transposed).
    bwd_mma_acc_times_rows<D, kBr>(dv, s, dos, lane);
    // dPᵀ = V dOᵀ, dSᵀ = Pᵀ (dPᵀ − delta) · scale·τ.
    {
      float dp[kBr / 8][4];
      bwd_mma_rows_by_rows<D, kBr>(dp, sm.v, dos, warp * 16, 0, lane);
#pragma unroll
      for (int j = 0; j < kBr / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int col = j * 8 + c4 * 2 + (e % 2);
          s[j][e] = s[j][e] * (dp[j][e] - st_delta[col]) * st_dscale[col];
        }
    }
    // dK += dSᵀ Q.
    bwd_mma_acc_times_rows<D, kBr>(dk, s, qs, lane);
    // dSᵀ (bf16) to shared memory for dQ: [128 keys][64 queries], 16-byte chunks swizzled.
#pragma unroll
    for (int j = 0; j < kBr / 8; ++j)
#pragma unroll
      for (int h2 = 0; h2 < 2; ++h2) {
        const int r = key_row0 + h2 * 8;
        *reinterpret_cast<uint32_t*>(sm.ds + cuda::swizzled<kBr / 8>(r, j) + c4 * 4) =
            cuda::pack_bf16(s[j][2 * h2], s[j][2 * h2 + 1]);
      }
    __syncthreads();
    mma_dq_atomic<D>(p, sm.ds, sm.k, h, m0, warp, lane);
  }
  cuda::cp_async_wait<0>();  // no copy may be in flight at exit
  bwd_add_dk_dv<D>(p, kvh, k0 + key_row0, c4, [&](int j, int e) { return dk[j][e]; }, [&](int j, int e) { return dv[j][e]; });
}

template <int D>
void launch_mma(const BwdParams& p, int hk) {
  const size_t smem = MmaSmem<D>::total;
  HYDRA_CUDA_CHECK(cudaFuncSetAttribute(attention_backward_mma_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const dim3 grid(static_cast<unsigned>((p.tk + kBc - 1) / kBc), static_cast<unsigned>(hk));
  attention_backward_mma_kernel<D><<<grid, kThreads, smem, current_stream()>>>(p);
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

// Which kernel runs d = 128 (AttentionParams::backward_kernel): ws (warp-specialised, the default
// on compute capability 9.x) or mma (mma.sync, any GPU).
enum class BwdKernel { mma, ws };
BwdKernel backward_kernel_d128(AttentionBackwardKernel choice) {
  static const bool hopper = [] {
    int device = 0, major = 0;
    HYDRA_CUDA_CHECK(cudaGetDevice(&device));
    HYDRA_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    return major == 9;
  }();
  return choice == AttentionBackwardKernel::mma || !hopper ? BwdKernel::mma : BwdKernel::ws;
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
  const int blocks = cuda::capped_grid((rows + 7) / 8);
  auto launch = [&](auto* o_ptr, auto* d_ptr) {
    attention_delta_kernel<<<blocks, 256, 0, current_stream()>>>(delta.data_as<float>(), delta.stride(0), delta.stride(1),
                                                                d_ptr, d_out.stride(0), d_out.stride(1), o_ptr,
                                                                out.stride(0), out.stride(1), rows, static_cast<int>(hq),
                                                                static_cast<int>(dv));
  };
  const bool o_bf16 = out.dtype() == DType::bf16, d_bf16 = d_out.dtype() == DType::bf16;
  HYDRA_ASSERT((o_bf16 || out.dtype() == DType::f32) && (d_bf16 || d_out.dtype() == DType::f32),
               "attention_backward_prepare: d_out and out must be bf16 or f32");
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
  // Packed documents run on the mma.sync kernel (the only one that takes them).
  const BwdKernel kernel = d == 128 && !p.q_doc_start ? backward_kernel_d128(params.backward_kernel) : BwdKernel::mma;
  if (kernel == BwdKernel::ws && ws_supports(dq, d_out, q, k, v)) {
    launch_ws(p, q, k, v, d_out);
  } else if (d == 128) {
    launch_mma<128>(p, static_cast<int>(hk));
  } else {
    launch_mma<64>(p, static_cast<int>(hk));
  }
}

}  // namespace hydra::ops::cuda_impl
