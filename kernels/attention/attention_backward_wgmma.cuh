// Hopper flash attention backward (head dim 128): warpgroup MMA (wgmma) for all five products.
// Included by attention_backward.cu; same parameters, masks, τ and accumulator semantics as the
// mma.sync kernel there (which stays as HYDRA_ATTENTION_BWD_KERNEL=mma and for d = 64).
//
// CTA = 2 warpgroups (256 threads) = one block of 128 keys of one KV head; warpgroup w owns keys
// 64w..64w+63 and their dK, dV (64 × 128 fp32 each, in registers). Per query block of 64 rows
// (FlashAttention-3's tiling for d = 128: 64 × 128, Sᵀ/dPᵀ "swapped" so that Pᵀ and dSᵀ are
// register A operands of the dV/dK products):
//   Sᵀ  = K_w Qᵀ     m64n64k16 SS (K, Q K-major)      dPᵀ = V_w dOᵀ   m64n64k16 SS (both issued, then waited)
//   dV += Pᵀ dO      m64n128k16 RS (dO MN-major)      dK += dSᵀ Q     m64n128k16 RS (Q MN-major)
//   dSᵀ → shared memory as dS [queries][keys] (K-major) with stmatrix.trans; CTA barrier
//   dQ  = dS K[:, 64w..64w+63]  m64n64k16 SS (K MN-major), added to dq with float2 atomics.
// Tiles are 128-byte-swizzled [rows][64] column blocks (kernels/cuda/wgmma.cuh); Q, dO, lse and
// delta stream through a 2-stage cp.async pipeline loaded by all 256 threads (one CTA barrier per
// step plus one for dS). Not warp-specialised: no TMA producer, no ping-pong (see NOTES_backward.md).
#pragma once

#include "kernels/attention/attention_backward.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace hydra::ops::cuda_impl::bwd_wg {

constexpr int kBc = 128, kBr = 64, kD = 128, kThreads = 256;
constexpr uint32_t kKvBlock = 128 * 128;    // one [128 rows][64] column block of K or V
constexpr uint32_t kQBlock = 64 * 128;      // one [64 rows][64] column block of Q, dO or dS
constexpr uint32_t kKvTile = 2 * kKvBlock;  // [128][128]
constexpr uint32_t kQTile = 2 * kQBlock;    // [64][128]
constexpr uint32_t kStatsBytes = 4 * kBr * 4;
constexpr size_t kSmemBytes = 2 * kKvTile + 4 * kQTile + kQTile + 2 * kStatsBytes + 1024;

// Byte offset of 16-byte chunk c (0..15) of row r in a [rows][128] tile stored as two column blocks.
__device__ __forceinline__ uint32_t tile_offset(int rows, int r, int c) {
  return static_cast<uint32_t>((c / 8) * rows * 128 + r * 128 + (((c % 8) ^ (r % 8)) * 16));
}

// D[64×64] (+)= A[64×16] · B[16×64], both from shared memory; TransB = 1: B stored N-contiguous.
template <int TransB>
__device__ __forceinline__ void wgmma_m64n64k16_ss(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "
      "%23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, %35;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(TransB));
}

// Stores four 8×8 bf16 matrices transposed: lane l gives the address of row l % 8 of matrix l / 8;
// each thread's register i holds (row l/4, columns 2(l%4), +1) of matrix i, which lands in memory
// rows 2(l%4), 2(l%4)+1 at column l/4.
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t addr, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r[0]),
               "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}

// After wgmma.wait_group: tells the compiler the accumulators change here, so no read of them is
// scheduled before the wait (CUTLASS's warpgroup_fence_operand). Emits no instruction.
template <int N>
__device__ __forceinline__ void fence_operands(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

__global__ void __launch_bounds__(kThreads, 1) attention_backward_wgmma_kernel(const __grid_constant__ BwdParams p) {
  extern __shared__ unsigned char smem_raw[];
  const uint32_t base = (cuda::smem_addr(smem_raw) + 1023u) & ~1023u;  // swizzle atoms: 1024-byte aligned
  const uint32_t sk = base, sv = base + kKvTile, sq = base + 2 * kKvTile, sdo = sq + 2 * kQTile, sds = sdo + 2 * kQTile;
  float* sstats = reinterpret_cast<float*>(smem_raw + (sds + kQTile - cuda::smem_addr(smem_raw)));

  const int tid = threadIdx.x, wgi = tid / 128, warp = (tid % 128) / 32, lane = tid % 32, g4 = lane / 4, c4 = lane % 4;
  const int kvh = blockIdx.y, k0 = blockIdx.x * kBc;
  const int head_begin = p.group_begin[kvh], n_heads = p.group_begin[kvh + 1] - head_begin;
  const int m_begin = bwd_query_begin(p, k0, kBr);
  if (n_heads == 0 || m_begin >= p.tq) return;
  const int n_qblocks = (p.tq - m_begin + kBr - 1) / kBr;
  const int steps = n_heads * n_qblocks;

  auto load_tile = [&](uint32_t dst, int rows, const bf16_t* src, int64_t row_stride, int row0, int rows_valid) {
    for (int i = tid; i < rows * 16; i += kThreads) {
      const int r = i / 16, c = i % 16;
      const bool ok = row0 + r < rows_valid;
      cuda::cp_async_16(dst + tile_offset(rows, r, c), src + (ok ? (row0 + r) * row_stride : 0) + c * 8, ok ? 16 : 0);
    }
  };
  auto load_step = [&](int step, int stage) {
    const int h = p.heads_by_kv[head_begin + step / n_qblocks];
    const int m0 = m_begin + (step % n_qblocks) * kBr;
    load_tile(sq + stage * kQTile, kBr, p.q + h * p.q_sh, p.q_st, m0, p.tq);
    load_tile(sdo + stage * kQTile, kBr, p.dout + h * p.do_sh, p.do_st, m0, p.tq);
    if (tid < kBr) {
      float* st = sstats + stage * 4 * kBr;
      const int row = m0 + tid;
      const bool ok = row < p.tq;
      bwd_cp_async_4(cuda::smem_addr(st + tid), p.lse + h * p.lse_sh + (ok ? row : 0) * p.lse_st, ok ? 4 : 0);
      bwd_cp_async_4(cuda::smem_addr(st + kBr + tid), p.delta + h * p.delta_sh + (ok ? row : 0) * p.delta_st, ok ? 4 : 0);
      const float tau = bwd_tau(p, p.q_pos0 + row);
      st[2 * kBr + tid] = p.scale_log2 * tau;
      st[3 * kBr + tid] = p.scale * tau;
    }
  };

  load_tile(sk, kBc, p.k + kvh * p.k_sh, p.k_st, k0, p.tk);
  load_tile(sv, kBc, p.v + kvh * p.v_sh, p.v_st, k0, p.tk);
  load_step(0, 0);
  cuda::cp_async_commit();

  float dk[64], dv[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) dk[i] = dv[i] = 0.0f;
  const int key_row0 = wgi * 64 + warp * 16 + g4;  // this lane's key rows in the block: key_row0, key_row0 + 8
  const uint32_t k_rows = static_cast<uint32_t>(wgi * 64 * 128);  // this warpgroup's 64 rows in a column block

  for (int step = 0; step < steps; ++step) {
    const int stage = step % 2;
    const int h = p.heads_by_kv[head_begin + step / n_qblocks];
    const int m0 = m_begin + (step % n_qblocks) * kBr;
    cuda::cp_async_wait<0>();
    cuda::fence_proxy_async();  // this thread's cp.async writes -> visible to wgmma (async proxy)
    __syncthreads();            // the stage landed for all; the other stage and dS are free again
    if (step + 1 < steps) load_step(step + 1, stage ^ 1);
    cuda::cp_async_commit();
    const uint32_t qs = sq + stage * kQTile, dos = sdo + stage * kQTile;
    const float* st_lse = sstats + stage * 4 * kBr;
    const float* st_delta = st_lse + kBr;
    const float* st_qscale = st_lse + 2 * kBr;
    const float* st_dscale = st_lse + 3 * kBr;

    // Sᵀ = K_w Qᵀ and dPᵀ = V_w dOᵀ (64 keys × 64 queries each), two commit groups.
    float s[32], dp[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) s[i] = dp[i] = 0.0f;
    cuda::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      const uint32_t koff = static_cast<uint32_t>((kk / 4) * kKvBlock + (kk % 4) * 32) + k_rows;
      const uint32_t qoff = static_cast<uint32_t>((kk / 4) * kQBlock + (kk % 4) * 32);
      wgmma_m64n64k16_ss<0>(s, cuda::wgmma_desc(sk + koff, 16, 1024), cuda::wgmma_desc(qs + qoff, 16, 1024), kk > 0);
    }
    cuda::wgmma_commit();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      const uint32_t koff = static_cast<uint32_t>((kk / 4) * kKvBlock + (kk % 4) * 32) + k_rows;
      const uint32_t qoff = static_cast<uint32_t>((kk / 4) * kQBlock + (kk % 4) * 32);
      wgmma_m64n64k16_ss<0>(dp, cuda::wgmma_desc(sv + koff, 16, 1024), cuda::wgmma_desc(dos + qoff, 16, 1024), kk > 0);
    }
    cuda::wgmma_commit();
    cuda::wgmma_wait<1>();  // Sᵀ is ready; dPᵀ may still run
    fence_operands(s);

    const bool need_mask = (p.causal && p.k_pos0 + k0 + kBc - 1 > p.q_pos0 + m0) || k0 + kBc > p.tk || m0 + kBr > p.tq;
    uint32_t pa[4][4];  // Pᵀ as bf16 A fragments, one per 16 queries
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = j * 8 + c4 * 2 + (e % 2), key = k0 + key_row0 + (e / 2) * 8;
        const float lse = st_lse[col];
        bool visible = lse != -INFINITY;
        if (need_mask) {
          visible = visible && key < p.tk && m0 + col < p.tq && !(p.causal && p.k_pos0 + key > p.q_pos0 + m0 + col);
        }
        s[4 * j + e] = visible ? exp2f(s[4 * j + e] * st_qscale[col] - lse * 1.4426950408889634f) : 0.0f;
      }
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      pa[kk][0] = cuda::pack_bf16(s[8 * kk + 0], s[8 * kk + 1]);
      pa[kk][1] = cuda::pack_bf16(s[8 * kk + 2], s[8 * kk + 3]);
      pa[kk][2] = cuda::pack_bf16(s[8 * kk + 4], s[8 * kk + 5]);
      pa[kk][3] = cuda::pack_bf16(s[8 * kk + 6], s[8 * kk + 7]);
    }
    cuda::wgmma_wait<0>();  // dPᵀ is ready
    fence_operands(dp);
    uint32_t dsa[4][4];  // dSᵀ = Pᵀ (dPᵀ − delta) · scale·τ as bf16 A fragments
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = j * 8 + c4 * 2 + (e % 2);
        dp[4 * j + e] = s[4 * j + e] * (dp[4 * j + e] - st_delta[col]) * st_dscale[col];
      }
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      dsa[kk][0] = cuda::pack_bf16(dp[8 * kk + 0], dp[8 * kk + 1]);
      dsa[kk][1] = cuda::pack_bf16(dp[8 * kk + 2], dp[8 * kk + 3]);
      dsa[kk][2] = cuda::pack_bf16(dp[8 * kk + 4], dp[8 * kk + 5]);
      dsa[kk][3] = cuda::pack_bf16(dp[8 * kk + 6], dp[8 * kk + 7]);
    }
    // dV += Pᵀ dO and dK += dSᵀ Q (B = dO, Q [queries][d], read N-contiguous), one commit group.
    cuda::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      cuda::wgmma_m64n128k16_rs<1>(dv, pa[kk], cuda::wgmma_desc(dos + static_cast<uint32_t>(kk * 16 * 128), kQBlock, 1024), 1);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      cuda::wgmma_m64n128k16_rs<1>(dk, dsa[kk], cuda::wgmma_desc(qs + static_cast<uint32_t>(kk * 16 * 128), kQBlock, 1024), 1);
    cuda::wgmma_commit();
    // dSᵀ to shared memory as dS [64 queries][128 keys]: this warp's 16 keys × 16 queries per kk.
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const int m = lane / 8, r = lane % 8;
      const int query = kk * 16 + (m / 2) * 8 + r;
      const int chunk = wgi * 8 + warp * 2 + (m % 2);  // 16-byte chunk of the 128 keys
      stmatrix_x4_trans(sds + tile_offset(kBr, query, chunk), dsa[kk]);
    }
    cuda::fence_proxy_async();  // the stmatrix writes -> visible to the dQ wgmma
    __syncthreads();            // both warpgroups' dS are in place
    // dQ[64 queries × 64 columns 64w..] = dS K[:, 64w..64w+63] (K read N-contiguous).
    float dq[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) dq[i] = 0.0f;
    cuda::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBc / 16; ++kk) {
      const uint32_t aoff = static_cast<uint32_t>((kk / 4) * kQBlock + (kk % 4) * 32);
      const uint32_t boff = static_cast<uint32_t>(wgi * kKvBlock + kk * 16 * 128);
      wgmma_m64n64k16_ss<1>(dq, cuda::wgmma_desc(sds + aoff, 16, 1024), cuda::wgmma_desc(sk + boff, kKvBlock, 1024), kk > 0);
    }
    cuda::wgmma_commit();
    cuda::wgmma_wait<0>();  // dQ, and the dV/dK group before it
    fence_operands(dq);
    fence_operands(dk);
    fence_operands(dv);
    const int qa = m0 + warp * 16 + g4, qb = qa + 8;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int col = wgi * 64 + j * 8 + c4 * 2;
      if (qa < p.tq) atomicAdd(reinterpret_cast<float2*>(p.dq + qa * p.dq_st + h * p.dq_sh + col), make_float2(dq[4 * j], dq[4 * j + 1]));
      if (qb < p.tq) atomicAdd(reinterpret_cast<float2*>(p.dq + qb * p.dq_st + h * p.dq_sh + col), make_float2(dq[4 * j + 2], dq[4 * j + 3]));
    }
  }
  cuda::cp_async_wait<0>();

  // dK, dV += this block's sums (one CTA owns these key rows of this KV head).
#pragma unroll
  for (int h2 = 0; h2 < 2; ++h2) {
    const int key = k0 + key_row0 + h2 * 8;
    if (key >= p.tk) continue;
    float* dkr = p.dk + key * p.dk_st + kvh * p.dk_sh;
    float* dvr = p.dv + key * p.dv_st + kvh * p.dv_sh;
#pragma unroll
    for (int j = 0; j < kD / 8; ++j) {
      float2* a = reinterpret_cast<float2*>(dkr + j * 8 + c4 * 2);
      float2* b = reinterpret_cast<float2*>(dvr + j * 8 + c4 * 2);
      float2 x = *a, y = *b;
      x.x += dk[4 * j + 2 * h2];
      x.y += dk[4 * j + 2 * h2 + 1];
      y.x += dv[4 * j + 2 * h2];
      y.y += dv[4 * j + 2 * h2 + 1];
      *a = x;
      *b = y;
    }
  }
}

}  // namespace hydra::ops::cuda_impl::bwd_wg
