// Hopper (sm_90a) data movement and synchronisation for warp-specialised kernels, the one TMA
// layer every such kernel uses (flash attention forward and backward, the GDN state pass): TMA
// tensor maps (host), TMA tile loads and mbarriers through the toolkit's cuda::ptx wrappers, the
// bulk copies, stores and reductions of the async proxy and their bulk groups, and the three
// instructions those wrappers lack (named barriers, setmaxnreg, the operand fence of wgmma).
//
// Pipeline convention (one producer, several consumers, a ring of shared-memory stages): each
// stage has a `full` mbarrier (1 arrival: the producer's arrive.expect_tx; the TMA's bytes
// complete the phase) and an `empty` mbarrier (one arrival per consumer warp). The n-th fill of a
// stage (n = 0, 1, ...) completes phase n of `full`; consumers wait with parity n & 1, the producer
// waits on `empty` with parity (n & 1) ^ 1, which passes at once for n = 0 (a fresh barrier counts
// its phase "−1" as complete).
#pragma once

#include <cuda.h>  // CUtensorMap and its enums (types only: the encoder comes from the runtime)
#include <cuda/ptx>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/mma.cuh"  // smem_addr
#include "runtime/error.h"

namespace hydra::cuda {

// ---- host: tensor maps ------------------------------------------------------------------------

// cuTensorMapEncodeTiled, looked up in the driver once (the runtime API has no wrapper for it).
using TensorMapEncode = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                     const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                     CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
inline TensorMapEncode tensor_map_encoder() {
  static const TensorMapEncode encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult status{};
    HYDRA_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &status));
    HYDRA_ASSERT(fn != nullptr && status == cudaDriverEntryPointSuccess, "the CUDA driver has no cuTensorMapEncodeTiled");
    return reinterpret_cast<TensorMapEncode>(fn);
  }();
  return encode;
}

// A 3-D bf16 tensor map over rows of a [rows, heads, cols] view (element strides row_stride and
// head_stride, unit column stride), read in boxes of [box_rows][1][64] into 128-byte-swizzled
// shared memory: one box is a [box_rows][64] block whose 16-byte chunk c of row r sits at chunk
// position c ^ (r % 8) — the layout kernels/cuda/wgmma.cuh's descriptors describe. Rows past
// `rows` read as zeros.
inline CUtensorMap make_tma_map_bf16(const void* base, int64_t rows, int64_t heads, int64_t cols, int64_t row_stride,
                                     int64_t head_stride, int box_rows) {
  const TensorMapEncode encode = tensor_map_encoder();
  HYDRA_ASSERT(reinterpret_cast<uintptr_t>(base) % 16 == 0 && row_stride % 8 == 0 && head_stride % 8 == 0 && cols % 64 == 0,
               "TMA needs 16-byte aligned rows and a multiple of 64 columns");
  CUtensorMap map;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(heads),
                              static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(head_stride) * 2, static_cast<cuuint64_t>(row_stride) * 2};
  const cuuint32_t box[3] = {64, 1, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<void*>(base), dims, strides, box,
                            element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  HYDRA_ASSERT(r == CUDA_SUCCESS, "cuTensorMapEncodeTiled failed (error {}) for [{}, {}, {}] strides {}/{}",
               static_cast<int>(r), rows, heads, cols, row_stride, head_stride);
  return map;
}

// ---- device: mbarriers and TMA ----------------------------------------------------------------

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) { ::cuda::ptx::mbarrier_init(bar, count); }

// Makes barrier initialisation visible to the async proxy (TMA); a CTA barrier follows.
__device__ __forceinline__ void mbar_fence_init() {
  ::cuda::ptx::fence_mbarrier_init(::cuda::ptx::sem_release, ::cuda::ptx::scope_cluster);
}

__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  while (!::cuda::ptx::mbarrier_try_wait_parity(bar, parity)) {
  }
}

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) { (void)::cuda::ptx::mbarrier_arrive(bar); }

// The producer's arrival announcing `bytes` of TMA traffic for the current phase.
__device__ __forceinline__ void mbar_expect_bytes(uint64_t* bar, uint32_t bytes) {
  (void)::cuda::ptx::mbarrier_arrive_expect_tx(::cuda::ptx::sem_release, ::cuda::ptx::scope_cta,
                                               ::cuda::ptx::space_shared, bar, bytes);
}

// One box of a 3-D tensor map (coordinates innermost first: column, head, row) into shared memory;
// completion is counted in bytes on `bar`.
__device__ __forceinline__ void tma_load_3d(void* dst, const CUtensorMap* map, int col, int head, int row, uint64_t* bar) {
  const int32_t coords[3] = {col, head, row};
  ::cuda::ptx::cp_async_bulk_tensor(::cuda::ptx::space_cluster, ::cuda::ptx::space_global, dst, map, coords, bar);
}

// A [rows][128] bf16 tile as its two 64-column boxes of a 3-D tensor map (columns 0 and 64), the
// second `box_bytes` after the first; completion counted on `bar`.
__device__ __forceinline__ void tma_load_3d_cols128(void* dst, uint32_t box_bytes, const CUtensorMap* map, int head, int row,
                                                    uint64_t* bar) {
  tma_load_3d(dst, map, 0, head, row, bar);
  tma_load_3d(static_cast<unsigned char*>(dst) + box_bytes, map, 64, head, row, bar);
}

// One box of a 2-D tensor map (coordinates: column 0, row `row`) into shared memory.
__device__ __forceinline__ void tma_load_2d_row(void* dst, const CUtensorMap* map, int row, uint64_t* bar) {
  const int32_t coords[2] = {0, row};
  ::cuda::ptx::cp_async_bulk_tensor(::cuda::ptx::space_cluster, ::cuda::ptx::space_global, dst, map, coords, bar);
}

// Contiguous bytes from global to shared memory, completing on an mbarrier (expect-tx).
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   smem_addr(dst)),
               "l"(src), "r"(bytes), "r"(smem_addr(bar))
               : "memory");
}

__device__ __forceinline__ void tma_prefetch_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(map) : "memory");
}

// ---- device: stores and reductions from shared memory (bulk groups of the issuing thread) ----

// TMA store of one box of a 3-D tensor map from shared memory (byte address src).
__device__ __forceinline__ void tma_store_3d(const CUtensorMap* map, uint32_t src, int col, int head, int row) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%1, %2, %3}], [%4];\n" ::"l"(map), "r"(col),
               "r"(head), "r"(row), "r"(src)
               : "memory");
}
// dst[0 .. bytes/4) += the fp32 values at shared byte address src (bulk reduction).
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, uint32_t src, uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst), "r"(src),
               "r"(bytes)
               : "memory");
}
// The thread's bulk operations so far form a group; wait until all its groups have read shared
// memory (the source may be overwritten), or have completed.
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_read_all() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

// ---- device: named barriers and register reallocation -----------------------------------------

// Named barrier `id` (1..15; 0 is __syncthreads) over `count` threads: sync waits, arrive does not.
__device__ __forceinline__ void named_barrier_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// Register reallocation between warpgroups (all 128 threads of a warpgroup execute it). ptxas
// takes the new limit as the register budget of the code that follows, given __launch_bounds__.
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}

// Pins registers that an asynchronous wgmma reads or writes, so the compiler neither hoists their
// uses above wgmma_wait nor sinks their definitions below the wgmma that consumes them.
template <int N>
__device__ __forceinline__ void fence_operands(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N, int M>
__device__ __forceinline__ void fence_operands(uint32_t (&r)[N][M]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int j = 0; j < M; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
}

}  // namespace hydra::cuda
