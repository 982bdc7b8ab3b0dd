// Hopper flash attention forward (head dim 128): warpgroup MMA (wgmma) for both products.
// The previous default kernel, replaced by the warp-specialised one in attention_hopper.cu; kept
// (HYDRA_ATTENTION_KERNEL=wgmma) only as the proven fallback until that kernel has passed its tests
// on an H200, then deleted. Left byte-for-byte as validated (its softmax predates flash_softmax.cuh).
//
// CTA = 2 warpgroups (256 threads) = 128 query rows, each warpgroup owning 64 rows. Key/value
// tiles of 128 rows stream through a 2-stage cp.async pipeline into 128-byte-swizzled shared
// memory laid out as wgmma expects (kernels/cuda/wgmma.cuh). Per tile:
//   S = Q Kᵀ:  8 × wgmma m64n128k16, Q and K from shared memory (both K-major);
//   softmax:   online, base 2, fp32 statistics, τ and masking as in the mma.sync kernel;
//   O += P V:  8 × wgmma m64n128k16, P from registers (the accumulator layout of S, converted to
//              bf16, is wgmma's A-register layout), V from shared memory read transposed.
// The two warpgroups run their softmax while the other's MMAs are in flight (no explicit
// ping-pong schedule). Same parameters, masking rules and merge epilogue as the mma.sync kernel.
#pragma once

#include "kernels/attention/flash_common.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace hydra::ops::cuda_impl {
namespace wg {

constexpr int kM = 128, kN = 128, kThreads = 256, kD = 128;
constexpr uint32_t kBlockBytes = 128 * 128;       // one [128 rows][64] bf16 block
constexpr uint32_t kTileBytes = 2 * kBlockBytes;  // a [128][128] tile as two column blocks
constexpr size_t kSmemBytes = 5 * kTileBytes + 1024;  // Q, K×2, V×2 and alignment slack

// Byte offset of 16-byte chunk `c` (0..15) of row `r` in a [128][128] tile.
__device__ __forceinline__ uint32_t tile_offset(int r, int c) {
  return static_cast<uint32_t>((c / 8) * kBlockBytes + r * 128 + (((c % 8) ^ (r % 8)) * 16));
}

__global__ void __launch_bounds__(kThreads, 1) flash_forward_wgmma_kernel(const __grid_constant__ FlashParams p) {
  extern __shared__ unsigned char smem_raw[];
  const uint32_t base = (cuda::smem_addr(smem_raw) + 1023u) & ~1023u;  // swizzle atoms: 1024-byte aligned
  const uint32_t sq = base, sk = base + kTileBytes, sv = base + 3 * kTileBytes;

  const int tid = threadIdx.x, wgi = tid / 128, warp = (tid % 128) / 32, lane = tid % 32;
  const int head = blockIdx.y;
  const int q0 = (gridDim.x - 1 - blockIdx.x) * kM;  // longest-first
  const int kvh = p.kv_of[head];
  const bf16_t* qg = p.q + head * p.q_sh;
  const bf16_t* kg = p.k + kvh * p.k_sh;
  const bf16_t* vg = p.v + kvh * p.v_sh;

  const int k_end = flash_key_end(p, q0, kM);  // keys any row of this block may see
  const int n_blocks = (k_end + kN - 1) / kN;

  auto load_tile = [&](uint32_t dst, const bf16_t* src, int64_t row_stride, int row0, int rows_valid) {
    for (int i = tid; i < 128 * 16; i += kThreads) {
      const int r = i / 16, c = i % 16;
      const bool ok = row0 + r < rows_valid;
      cuda::cp_async_16(dst + tile_offset(r, c), src + (ok ? (row0 + r) * row_stride : 0) + c * 8, ok ? 16 : 0);
    }
  };
  load_tile(sq, qg, p.q_st, q0, p.tq);
  if (n_blocks > 0) {
    load_tile(sk, kg, p.k_st, 0, p.tk);
    load_tile(sv, vg, p.v_st, 0, p.tk);
  }
  cuda::cp_async_commit();

  const int g4 = lane / 4, c4 = lane % 4;
  const int row0 = q0 + wgi * 64 + warp * 16 + g4, row1 = row0 + 8;
  const float row_scale[2] = {flash_row_scale(p, row0), flash_row_scale(p, row1)};
  float o[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

  for (int kb = 0; kb < n_blocks; ++kb) {
    cuda::cp_async_wait<0>();
    cuda::fence_proxy_async();  // this thread's cp.async writes -> visible to wgmma (async proxy)
    __syncthreads();
    if (kb + 1 < n_blocks) {
      const uint32_t stage = static_cast<uint32_t>((kb + 1) % 2) * kTileBytes;
      load_tile(sk + stage, kg, p.k_st, (kb + 1) * kN, p.tk);
      load_tile(sv + stage, vg, p.v_st, (kb + 1) * kN, p.tk);
    }
    cuda::cp_async_commit();
    const uint32_t ks = sk + static_cast<uint32_t>(kb % 2) * kTileBytes;
    const uint32_t vs = sv + static_cast<uint32_t>(kb % 2) * kTileBytes;

    // S = Q Kᵀ for this warpgroup's 64 rows and the tile's 128 keys.
    float s[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) s[i] = 0.0f;
    cuda::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      const uint32_t koff = static_cast<uint32_t>((kk / 4) * kBlockBytes + (kk % 4) * 32);
      const uint64_t da = cuda::wgmma_desc(sq + koff + static_cast<uint32_t>(wgi * 64 * 128), 16, 1024);
      const uint64_t db = cuda::wgmma_desc(ks + koff, 16, 1024);
      cuda::wgmma_m64n128k16_ss(s, da, db, kk > 0 ? 1 : 0);
    }
    cuda::wgmma_commit();
    cuda::wgmma_wait<0>();

    const int key0 = kb * kN;
    const bool need_mask = key0 + kN > p.tk || (p.causal && p.k_pos0 + key0 + kN - 1 > p.q_pos0 + q0);
    float row_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < kN / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e / 2;
        float x = s[4 * j + e] * row_scale[r];
        if (need_mask) {
          const int key = key0 + j * 8 + c4 * 2 + (e % 2);
          const int64_t qpos = p.q_pos0 + (r == 0 ? row0 : row1);
          if (key >= p.tk || (p.causal && p.k_pos0 + key > qpos)) x = -INFINITY;
        }
        s[4 * j + e] = x;
        row_max[r] = fmaxf(row_max[r], x);
      }
    }
    float corr[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      row_max[r] = fmaxf(row_max[r], __shfl_xor_sync(0xffffffffu, row_max[r], 1));
      row_max[r] = fmaxf(row_max[r], __shfl_xor_sync(0xffffffffu, row_max[r], 2));
      const float m_new = fmaxf(m[r], row_max[r]);
      const float b = m_new == -INFINITY ? 0.0f : m_new;
      corr[r] = exp2f(m[r] - b);
      m[r] = m_new;
      row_max[r] = b;
    }
    float row_sum[2] = {0.0f, 0.0f};
    uint32_t pa[kN / 16][4];
#pragma unroll
    for (int j = 0; j < kN / 8; ++j) {
      const float p0 = exp2f(s[4 * j + 0] - row_max[0]), p1 = exp2f(s[4 * j + 1] - row_max[0]);
      const float p2 = exp2f(s[4 * j + 2] - row_max[1]), p3 = exp2f(s[4 * j + 3] - row_max[1]);
      row_sum[0] += p0 + p1;
      row_sum[1] += p2 + p3;
      pa[j / 2][(j % 2) * 2 + 0] = cuda::pack_bf16(p0, p1);
      pa[j / 2][(j % 2) * 2 + 1] = cuda::pack_bf16(p2, p3);
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) l[r] = l[r] * corr[r] + row_sum[r];
#pragma unroll
    for (int j = 0; j < kD / 8; ++j) {
      o[4 * j + 0] *= corr[0];
      o[4 * j + 1] *= corr[0];
      o[4 * j + 2] *= corr[1];
      o[4 * j + 3] *= corr[1];
    }
    // O += P V: V [keys][d] is read transposed (MN-major B); d spans two 64-column blocks.
    cuda::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kN / 16; ++kk) {
      const uint64_t db = cuda::wgmma_desc(vs + static_cast<uint32_t>(kk * 16 * 128), kBlockBytes, 1024);
      cuda::wgmma_m64n128k16_rs<1>(o, pa[kk], db, 1);
    }
    cuda::wgmma_commit();
    cuda::wgmma_wait<0>();
  }
  cuda::cp_async_wait<0>();

  flash_epilogue<kD>(p, head, row0, row1, c4, o, m, l);
}

}  // namespace wg
}  // namespace hydra::ops::cuda_impl
