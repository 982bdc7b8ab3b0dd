// What the gated-delta-rule backward kernels share (delta_rule_backward*.cu): a warp-level
// product on shared-memory tiles, a tile loader, and the arguments of the per-chunk gradients.
//
// Tiles in shared memory are bf16, row-major with rows padded by 8 elements (ld = cols + 8), so
// the 8 row addresses of an ldmatrix fall into 8 different 16-byte bank groups and every row is
// 16-byte aligned. warp_mma multiplies such tiles with mma.sync m16n8k16 (fp32 accumulation); a
// transposed operand is read with ldmatrix .trans, so no tile is ever transposed in memory.
#pragma once

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/delta_rule/delta_rule.h"
#include "runtime/tensor.h"

namespace hydra::ops::cuda_impl::gdn_bwd {

constexpr int kC = static_cast<int>(kDeltaRuleChunk);  // chunk

// acc[NW/8][4] += op(A)[m0 .. m0+16, 0 .. K) · op(B)[0 .. K, n0 .. n0+NW), one warp.
//   TA = false: A stored [M][K] (element (m, k) at a[m·lda + k]);  TA = true: A stored [K][M].
//   TB = false: B stored [K][N] (element (k, n) at b[k·ldb + n]);  TB = true: B stored [N][K].
// acc[j][e] is element (m0 + lane/4 + 8·(e/2), n0 + 8j + 2·(lane%4) + e%2) (the mma C layout).
template <int NW, int K, bool TA, bool TB>
__device__ __forceinline__ void warp_mma(float (&acc)[NW / 8][4], const bf16_t* a, int lda, const bf16_t* b, int ldb,
                                         int m0, int n0, int lane) {
  static_assert(NW % 16 == 0 && K % 16 == 0, "warp_mma tiles are multiples of 16");
#pragma unroll
  for (int k0 = 0; k0 < K; k0 += 16) {
    uint32_t af[4];
    if constexpr (!TA) {
      cuda::ldmatrix_x4(af, cuda::smem_addr(a + (m0 + lane % 16) * lda + k0 + (lane / 16) * 8));
    } else {
      cuda::ldmatrix_x4_trans(af, cuda::smem_addr(a + (k0 + lane % 8 + (lane / 16) * 8) * lda + m0 + ((lane / 8) % 2) * 8));
    }
#pragma unroll
    for (int j = 0; j < NW / 8; j += 2) {
      uint32_t bf[4];
      if constexpr (TB) {
        cuda::ldmatrix_x4(bf, cuda::smem_addr(b + (n0 + j * 8 + lane % 8 + (lane / 16) * 8) * ldb + k0 + ((lane / 8) % 2) * 8));
      } else {
        cuda::ldmatrix_x4_trans(bf, cuda::smem_addr(b + (k0 + lane % 8 + ((lane / 8) % 2) * 8) * ldb + n0 + j * 8 + (lane / 16) * 8));
      }
      cuda::mma_bf16(acc[j], af, bf[0], bf[1]);
      cuda::mma_bf16(acc[j + 1], af, bf[2], bf[3]);
    }
  }
}

template <int NT>
__device__ __forceinline__ void zero(float (&acc)[NT][4]) {
#pragma unroll
  for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
}

// Row and column of accumulator element (j, e) for lane `lane` of a warp tile at (m0, n0).
__device__ __forceinline__ int acc_row(int m0, int e, int lane) { return m0 + lane / 4 + (e / 2) * 8; }
__device__ __forceinline__ int acc_col(int n0, int j, int e, int lane) { return n0 + j * 8 + (lane % 4) * 2 + (e % 2); }

// Copies a [ROWS][COLS] bf16 tile (global rows src_stride elements apart; rows ≥ rows_valid are
// zero-filled) into a padded tile (ld LD) with THREADS threads: thread t copies 16-byte chunk
// t % (COLS/8) of rows t / (COLS/8) + k·(THREADS / (COLS/8)), so every address is one per-thread
// base plus a compile-time offset (a loop over a runtime shape spent ~15 integer instructions per
// copy, which a sequential pass pays on every chunk step); cp.async, the caller commits and waits.
template <int ROWS, int COLS, int LD, int THREADS>
__device__ __forceinline__ void load_tile_async(bf16_t* dst, const bf16_t* src, int64_t src_stride, int tid,
                                                int rows_valid = ROWS) {
  constexpr int kChunks = COLS / 8, kRowStep = THREADS / kChunks;
  static_assert(THREADS % kChunks == 0 && ROWS % kRowStep == 0, "load_tile_async: the threads must tile the rows");
  const int r = tid / kChunks, c = (tid % kChunks) * 8;
  const uint32_t d = cuda::smem_addr(dst + r * LD + c);
  const bf16_t* g = src + r * src_stride + c;
#pragma unroll
  for (int k = 0; k < ROWS / kRowStep; ++k) {
    const bool ok = r + k * kRowStep < rows_valid;
    cuda::cp_async_16(d + k * kRowStep * LD * 2, ok ? g + k * kRowStep * src_stride : src, ok ? 16 : 0);
  }
}

struct SeqRows {  // [T, H, D] bf16 rows (or [T, H] f32 gates: ptr is then float)
  const void* ptr;
  int64_t st, sh;
};

// Inputs of the per-chunk gradient kernel (delta_rule_backward_grads.cu).
struct GradArgs {
  SeqRows q, k, v, dout, beta;
  const float* gamma;
  const bf16_t* t;
  const bf16_t* states;   // [N, H, D, D] bf16: state at the start of each chunk
  const bf16_t* dstates;  // [N, H, D, D] bf16: gradient w.r.t. the state at the end of each chunk
  const bf16_t* vnew;     // [N, H, C, D] bf16: V'
  const bf16_t* dvnew;    // [N, H, C, D] bf16: dV'
  void* dq;
  void* dk;
  void* dv;
  int64_t dq_st, dq_sh, dk_st, dk_sh, dv_st, dv_sh;
  float* dg;
  float* dbeta;
  int64_t dg_st, dg_sh, db_st, db_sh;
  int t_len, heads;
  float scale;
};

// Launches the per-chunk gradient kernel; dq/dk/dv are bf16 when `bf16_out`, else f32.
void launch_chunk_grads(const GradArgs& args, int d, bool bf16_out, int chunks);

}  // namespace hydra::ops::cuda_impl::gdn_bwd
