// Warp-level tensor-core primitives (sm_80+ instructions, used on Hopper too): ldmatrix,
// mma.sync m16n8k16 bf16 with fp32 accumulation, and cp.async global->shared copies.
//
// Fragment conventions of mma.m16n8k16 (lane = threadIdx.x % 32, g = lane / 4, c = lane % 4):
//   A (16×16, row-major): a0 = A[g][2c..2c+1], a1 = A[g+8][2c..], a2 = A[g][8+2c..], a3 = A[g+8][8+2c..]
//   B (16×8, "col"):      b0 = B[2c..2c+1][g], b1 = B[8+2c..8+2c+1][g]
//   C (16×8, fp32):       c0,c1 = C[g][2c..2c+1], c2,c3 = C[g+8][2c..2c+1]
// so two adjacent C tiles (n = 0..15) converted to bf16 pairs form one A fragment: the
// FlashAttention trick for using P as the A operand of P·V without a trip through memory.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace hydra::cuda {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// C += A·B for one 16×8×16 tile.
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// 16-byte asynchronous copy; src_bytes < 16 zero-fills the rest (0: all zeros, src not read).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Byte offset of 16-byte chunk `chunk` of row `row` in a tile whose rows are `chunks` chunks
// long, XOR-swizzled so that ldmatrix's 8 row addresses hit 8 different bank groups.
template <int Chunks>
__device__ __forceinline__ uint32_t swizzled(int row, int chunk) {
  return static_cast<uint32_t>((row * Chunks + (chunk ^ (row & 7))) * 16);
}

}  // namespace hydra::cuda
