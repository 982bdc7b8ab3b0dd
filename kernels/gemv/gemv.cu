// CUDA GEMV for the decode step (gemv.h): out [M, N] (+)= x [M, K] · wᵀ with M ≤ 8, bf16 in and
// out, fp32 accumulation on the tensor cores.
//
// Why tensor cores for a GEMV: at M = 8 a CUDA-core loop does 8 FMAs (plus conversions) per 2-byte
// weight, about 40% of the fp32 peak at 3 TB/s; one mma.sync m16n8k16 does 16 rows of w × 16 k ×
// the 8 rows of x, so the arithmetic vanishes beside the loads at every M ≤ 8 (rows of x past M are
// zeros; their columns of C are dropped).
//
// Layout (the "swapped" product: w is the mma's A, 16 rows of w per CTA; xᵀ its B, the 8 columns):
// each lane (g = lane / 4, c = lane % 4) takes 16 bytes (8 consecutive k) of w row g, 16 of w row
// g + 8 and 16 of x row g (zeros for g ≥ M), at k = 32 s + 8 c for a slice s of 32 k. The sum over
// k does not care which k sits in which slot of the mma's fragment, only that A and B agree: lane
// (g, c) holds A's slots 2c, 2c+1, 8+2c, 8+2c+1 of rows g and g+8 and B's same slots of column g,
// so with the words of its own 16 bytes in them (two mmas a slice: words 0,1 then 2,3) every slot
// of A and B holds the same physical k. No ldmatrix, no exchange between lanes: the four lanes of a
// row read 64 contiguous bytes.
//
// The stream: the CTA's warps split the slices of K (warp w takes slices w, w + warps, ...), and
// each lane copies its three 16-byte pieces of a slice into its own ring in shared memory with
// cp.async (L2 only), kAhead slices ahead of its mmas: one commit group a slice, a wait for all but
// the last kAhead − 1, and the freed stage refilled after the mmas. Plain loads would not do: ptxas
// sinks them to their mmas (one or two slices in flight, SASS of the first version), while the copy
// groups keep kAhead slices (a lane 4 × 32 bytes of w) in flight whatever the schedule. A lane reads
// back only what it copied, so no barrier is needed. 8 warps a CTA (60 KB of ring, 39 registers: 3
// CTAs an SM, 96 KB of w in flight); a grid of fewer than two CTAs per SM (N ≤ ~4K: o_proj,
// mlp_down) uses 16 warps a CTA (64 KB in flight). K past the last whole slice is the same copy
// with fewer bytes (zero-filled); rows of w past N are clamped (read, never written).
//
// The CTA's 16 × 8 partial tiles are summed over the warps in warp order through shared memory (no
// atomics: the same bits every run), then the epilogue writes bf16, or first adds the old value in
// fp32 (the residual's o_proj and mlp_down, as cuBLAS's beta = 1 does).
//
// Programmatic dependent launch: before griddepcontrol.wait each lane prefetches into L2 the w
// lines of its first kAhead slices (prefetch.global.L2: nothing is read into a register or shared
// memory). A decode step never writes a weight, and L2 is the point of coherence, so this only moves
// the first DRAM round trip of the weights under the previous kernel's tail (an rms norm, the
// fusion, SwiGLU); x and out, which those kernels write, are read after the wait.
#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/gemv/gemv.h"

namespace hydra::ops::cuda_impl {
namespace {

constexpr int kTileRows = 16;  // rows of w per CTA (the mma's M)
constexpr int kSlice = 32;     // k per slice: 4 lanes × 8
constexpr int kAhead = 4;      // slices a lane has in flight (cp.async groups)
constexpr int kStages = kAhead + 1;  // its ring in shared memory (see the loop)
constexpr int kMaxWarps = 16;
constexpr int kStageBytes = 3 * 16;  // a lane's slice: 16 bytes of w row g, of w row g + 8, of x row g

struct GemvArgs {
  bf16_t* out;  // [M, N], row stride out_stride
  int64_t out_stride;
  const bf16_t* x;  // [M, K], rows 16-byte aligned
  int64_t x_stride;
  const bf16_t* w;  // [N, K], rows 16-byte aligned
  int64_t w_stride;
  int m, n, k;
  bool accumulate;
};

// C (rows g, g+8 of w × columns 2c, 2c+1 of xᵀ) += one slice: two mmas over the 8 k of each load.
__device__ __forceinline__ void mma_slice(float (&acc)[4], const uint4& wa, const uint4& wb, const uint4& xv) {
  cuda::mma_bf16(acc, {wa.x, wb.x, wa.y, wb.y}, xv.x, xv.y);
  cuda::mma_bf16(acc, {wa.z, wb.z, wa.w, wb.w}, xv.z, xv.w);
}

__global__ void __launch_bounds__(32 * kMaxWarps) gemv_kernel(const __grid_constant__ GemvArgs a) {
  // Each lane's ring: stage st holds [w row g | w row g + 8 | x row g] of one slice, 16 bytes each,
  // in three planes with lanes adjacent (16-byte accesses, no bank conflict).
  extern __shared__ uint4 ring[];  // [kStages][3][threads]
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  const int g = lane / 4, c = lane % 4;
  const int n0 = blockIdx.x * kTileRows;
  const bf16_t* wa_row = a.w + static_cast<int64_t>(min(n0 + g, a.n - 1)) * a.w_stride;
  const bf16_t* wb_row = a.w + static_cast<int64_t>(min(n0 + g + 8, a.n - 1)) * a.w_stride;
  // Rows of x past M are zero-filled by the copy (row M − 1's address, never read).
  const bf16_t* x_row = a.x + static_cast<int64_t>(min(g, a.m - 1)) * a.x_stride;
  const int x_bytes = g < a.m ? 16 : 0;
  const int slices = (a.k + kSlice - 1) / kSlice;  // the last one may be partial (zero-filled)
  // This warp's slices: warp, warp + warps, ...
  const int count = warp < slices ? (slices - warp + warps - 1) / warps : 0;
  const auto k_of = [&](int i) { return (warp + i * warps) * kSlice + 8 * c; };

  if (c == 0) {  // one prefetch per 64 bytes: the four lanes of a row read them together
    for (int i = 0; i < min(count, kAhead); ++i) {
      cuda::prefetch_l2(wa_row + k_of(i));
      cuda::prefetch_l2(wb_row + k_of(i));
    }
  }
  cuda::wait_for_previous_grid();  // launched through cuda::launch (PDL in a decode step)
  cuda::allow_next_grid();

  const int threads = blockDim.x;
  const auto stage = [&](int i, int plane) { return cuda::smem_addr(&ring[((i % kStages) * 3 + plane) * threads + threadIdx.x]); };
  // Slice i's three copies, as one cp.async group (an empty group past the end keeps the count).
  const auto issue = [&](int i) {
    if (i < count) {
      const int k = k_of(i);
      const int bytes = min(max(2 * (a.k - k), 0), 16);  // the partial slice at the end of K
      cuda::cp_async_16(stage(i, 0), wa_row + k, bytes);
      cuda::cp_async_16(stage(i, 1), wb_row + k, bytes);
      cuda::cp_async_16(stage(i, 2), x_row + k, min(bytes, x_bytes));
    }
    cuda::cp_async_commit();
  };
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int i = 0; i < kAhead; ++i) issue(i);
  for (int i = 0; i < count; ++i) {
    // Committed so far: kAhead + i groups; at most kAhead − 1 pending means slice i has landed
    // (each lane reads back only what it copied itself, so no barrier).
    cuda::cp_async_wait<kAhead - 1>();
    const uint4 wa = ring[((i % kStages) * 3 + 0) * threads + threadIdx.x];
    const uint4 wb = ring[((i % kStages) * 3 + 1) * threads + threadIdx.x];
    const uint4 xv = ring[((i % kStages) * 3 + 2) * threads + threadIdx.x];
    mma_slice(acc, wa, wb, xv);
    // Refill the stage slice i − 1 used: its reads completed before last iteration's mmas issued,
    // so the copy cannot overwrite a value still being read (kStages = kAhead + 1).
    issue(i + kAhead);
  }
  cuda::cp_async_wait<0>();  // nothing in flight at exit (the empty groups)

  // The warps' tiles, summed in warp order.
  __shared__ float partial[kMaxWarps][kTileRows][8];
  partial[warp][g][2 * c] = acc[0];
  partial[warp][g][2 * c + 1] = acc[1];
  partial[warp][g + 8][2 * c] = acc[2];
  partial[warp][g + 8][2 * c + 1] = acc[3];
  __syncthreads();
  for (int i = threadIdx.x; i < kTileRows * 8; i += blockDim.x) {
    const int row = i % kTileRows, col = i / kTileRows;  // consecutive threads: consecutive n
    const int n = n0 + row;
    if (col < a.m && n < a.n) {
      float sum = 0.0f;
      for (int j = 0; j < warps; ++j) sum += partial[j][row][col];
      bf16_t* o = a.out + static_cast<int64_t>(col) * a.out_stride + n;
      if (a.accumulate) sum += __bfloat162float(*o);
      *o = __float2bfloat16_rn(sum);
    }
  }
}

}  // namespace

void gemv(const TensorView& out, const TensorView& x, const TensorView& w, Accumulate accumulate) {
  HYDRA_ASSERT(gemv_supported(out, x, w), "gemv: the CUDA kernel does not take out {} {}, x {} {}, w {} {}",
               dtype_name(out.dtype()), out.shape_string(), dtype_name(x.dtype()), x.shape_string(),
               dtype_name(w.dtype()), w.shape_string());
  const int64_t m = x.size(0), k = x.size(1), n = w.size(0);
  HYDRA_ASSERT(n < (int64_t{1} << 31) - kTileRows && k < (int64_t{1} << 31) - kSlice, "gemv: N {} or K {} too large", n, k);
  const int64_t tiles = (n + kTileRows - 1) / kTileRows;
  // Fewer than two CTAs per SM: 16 warps each; never more warps than slices to share.
  const int64_t slices = (k + kSlice - 1) / kSlice;
  const int warps = static_cast<int>(std::min<int64_t>(tiles < 2 * cuda::sm_count() ? kMaxWarps : 8, slices));
  const GemvArgs args{.out = out.data_as<bf16_t>(),
                      .out_stride = out.stride(0),
                      .x = x.data_as<const bf16_t>(),
                      .x_stride = x.stride(0),
                      .w = w.data_as<const bf16_t>(),
                      .w_stride = w.stride(0),
                      .m = static_cast<int>(m),
                      .n = static_cast<int>(n),
                      .k = static_cast<int>(k),
                      .accumulate = accumulate == Accumulate::yes};
  const size_t shared = static_cast<size_t>(kStages) * kStageBytes * 32 * warps;
  HYDRA_CUDA_CHECK(cudaFuncSetAttribute(gemv_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared)));
  cuda::launch(gemv_kernel, dim3(static_cast<unsigned>(tiles)), dim3(32 * warps), shared, args);
  HYDRA_CUDA_LAUNCH_CHECK();
}

}  // namespace hydra::ops::cuda_impl
