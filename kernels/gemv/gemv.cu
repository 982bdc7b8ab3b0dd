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
// mlp_down) uses 16 warps a CTA (64 KB in flight). That is the default launch shape; GemvTuning
// (gemv.h) picks others to time: 4, 8 or 16 warps whatever the grid, kAhead = 8 (a ring of 9 stages:
// twice the bytes in flight a lane, fewer CTAs an SM), and the tile prefetch below. K past the last whole slice is the same copy
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
// fusion, SwiGLU); x and out, which those kernels write, are read after the wait. With
// GemvPrefetch::tile, 16 threads instead ask for the CTA's 16 rows of w whole (one
// cp.async.bulk.prefetch.L2 a row): every resident CTA's whole share of the weight starts streaming
// into L2 before the wait, and the ring's copies then find it there or in flight.
//
// The fused input norm (gemv_rms_norm: the decode step's in_proj and the MLP's gate/up read
// rms_norm(h) · γ of the residual stream h): the lanes' rings hold w only (two planes), and their
// first kAhead slices are copied before the wait (w is never written in a decode step, so the copies
// land under the previous kernel's tail as the prefetch does). After the wait each CTA normalises
// the M rows of h into shared memory once (normed_rows_to_shared: h is M × K bf16, a few KB from L2)
// with the arithmetic of the RMSNorm's vector kernel (kernels/rmsnorm/rms_row.cuh, its reduction
// order emulated thread slot by thread slot), rounds them to bf16 there, and the mainloop reads each
// lane's 16 bytes of x from those rows instead of a ring plane. Every CTA computes the same bits, and
// they are the bits ops::rms_norm writes, so the product equals rms_norm → bf16 → this GEMV exactly.
#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/vector.cuh"
#include "kernels/gemv/gemv.h"
#include "kernels/rmsnorm/rms_row.cuh"
#include "kernels/rmsnorm/rms_vector.h"

namespace hydra::ops::cuda_impl {
namespace {

constexpr int kTileRows = 16;  // rows of w per CTA (the mma's M)
constexpr int kSlice = 32;     // k per slice: 4 lanes × 8
constexpr int kMaxWarps = 16;
// A lane's ring (slices in flight, GemvTuning::ahead): Ahead + 1 stages (see the loop).
constexpr int stages(int ahead) { return ahead + 1; }
constexpr int kMaxRows = static_cast<int>(kGemvMaxRows);
// A lane's slice in its ring: 16 bytes of w row g, of w row g + 8, and (unless the norm is fused:
// x then comes from the normed rows in shared memory) of x row g.
constexpr int planes(bool normed) { return normed ? 2 : 3; }

struct GemvArgs {
  bf16_t* out;  // [M, N], row stride out_stride
  int64_t out_stride;
  const bf16_t* x;  // [M, K], rows 16-byte aligned (h itself when the norm is fused)
  int64_t x_stride;
  const bf16_t* w;  // [N, K], rows 16-byte aligned
  int64_t w_stride;
  int m, n, k;
  bool accumulate;
  bool prefetch_tile;  // GemvPrefetch::tile: the CTA's rows of w into L2 before the wait
  // The fused input norm (the normed kernel only): γ [K] fp32, 16-byte aligned; the RMSNorm vector
  // path's G and V for rows of K (rms_vector.h); the normed rows' stride in shared memory.
  const float* gamma;
  float eps;
  int norm_group, norm_runs, xs_stride;
};

// C (rows g, g+8 of w × columns 2c, 2c+1 of xᵀ) += one slice: two mmas over the 8 k of each load.
__device__ __forceinline__ void mma_slice(float (&acc)[4], const uint4& wa, const uint4& wb, const uint4& xv) {
  cuda::mma_bf16(acc, {wa.x, wb.x, wa.y, wb.y}, xv.x, xv.y);
  cuda::mma_bf16(acc, {wa.z, wb.z, wa.w, wb.w}, xv.z, xv.w);
}

// One lane's share of the CTA's stream (the file header): its rows of w and x, its slices of K
// (warp, warp + warps, ...), and its ring, stage st holding the slice's planes with lanes adjacent
// (16-byte accesses, no bank conflict).
template <bool Normed, int Ahead>
struct LaneStream {
  static constexpr int kAhead = Ahead, kStages = stages(Ahead);
  const GemvArgs& a;
  uint4* ring;  // [kStages][planes][threads]
  int threads, warp, warps, g, c, count;
  const bf16_t *wa_row, *wb_row, *x_row;
  int x_bytes;

  __device__ LaneStream(const GemvArgs& args, uint4* ring_) : a(args), ring(ring_) {
    const int lane = threadIdx.x % 32;
    threads = blockDim.x;
    warp = threadIdx.x / 32;
    warps = threads / 32;
    g = lane / 4;
    c = lane % 4;
    const int n0 = blockIdx.x * kTileRows;
    wa_row = a.w + static_cast<int64_t>(min(n0 + g, a.n - 1)) * a.w_stride;
    wb_row = a.w + static_cast<int64_t>(min(n0 + g + 8, a.n - 1)) * a.w_stride;
    // Rows of x past M are zero-filled by the copy (row M − 1's address, never read).
    x_row = a.x + static_cast<int64_t>(min(g, a.m - 1)) * a.x_stride;
    x_bytes = g < a.m ? 16 : 0;
    const int slices = (a.k + kSlice - 1) / kSlice;  // the last one may be partial (zero-filled)
    count = warp < slices ? (slices - warp + warps - 1) / warps : 0;
  }
  __device__ int k_of(int i) const { return (warp + i * warps) * kSlice + 8 * c; }
  __device__ uint4* stage(int i, int plane) const {
    return &ring[((i % kStages) * planes(Normed) + plane) * threads + threadIdx.x];
  }
  // Slice i's copies, as one cp.async group (an empty group past the end keeps the count).
  __device__ void issue(int i) const {
    if (i < count) {
      const int k = k_of(i);
      const int bytes = min(max(2 * (a.k - k), 0), 16);  // the partial slice at the end of K
      cuda::cp_async_16(cuda::smem_addr(stage(i, 0)), wa_row + k, bytes);
      cuda::cp_async_16(cuda::smem_addr(stage(i, 1)), wb_row + k, bytes);
      if (!Normed) cuda::cp_async_16(cuda::smem_addr(stage(i, 2)), x_row + k, min(bytes, x_bytes));
    }
    cuda::cp_async_commit();
  }
  // Before the wait: the w lines of the first kAhead slices into L2, one prefetch per 64 bytes (the
  // four lanes of a row read them together); with prefetch_tile instead the CTA's 16 rows of w whole,
  // one bulk prefetch a row by threads 0-15 (its first 2K bytes rounded down to 16: the bulk copy's
  // unit; rows start 16-byte aligned). Neither reads a value: the product's bits are the same.
  __device__ void prefetch_first() const {
    if (a.prefetch_tile) {
      const int n = blockIdx.x * kTileRows + threadIdx.x;
      const uint32_t bytes = static_cast<uint32_t>(2 * a.k) / 16 * 16;
      if (threadIdx.x < kTileRows && n < a.n && bytes > 0) {
        const size_t address = __cvta_generic_to_global(a.w + static_cast<int64_t>(n) * a.w_stride);
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(address), "r"(bytes) : "memory");
      }
      return;
    }
    if (c != 0) return;
    for (int i = 0; i < min(count, kAhead); ++i) {
      cuda::prefetch_l2(wa_row + k_of(i));
      cuda::prefetch_l2(wb_row + k_of(i));
    }
  }
};

// The fused input norm: xs [M][xs_stride] ← bf16(γ ⊙ h r) for each row of h = a.x, by rms_row.cuh's
// arithmetic in rms_norm_vector_kernel's order, slot j of a row standing for thread j of the row's
// group there; columns K … xs_stride are zeros (the partial slice at the end of K reads them).
// ss: M·G floats of scratch, inv: M. Ends with a barrier: xs is complete.
__device__ void normed_rows_to_shared(const GemvArgs& a, bf16_t* xs, float* ss, float* inv) {
  const int G = a.norm_group, V = a.norm_runs, threads = blockDim.x, lane = threadIdx.x % 32;
  for (int i = threadIdx.x; i < a.m * G; i += threads) {  // each slot: its runs copied in, its Σ x²
    const int m = i / G, j = i % G;
    float sum = 0.0f;
    for (int v = 0; v < V; ++v) {
      const int col = 8 * (v * G + j);
      const uint4 word = cuda::load_bf16_word<8>(a.x + m * a.x_stride + col);
      *reinterpret_cast<uint4*>(xs + m * a.xs_stride + col) = word;
      float x8[8];
      cuda::unpack_bf16<8>(word, x8);
      sum = rms_row::add_squares(sum, x8);
    }
    ss[i] = sum;
  }
  const int pad = a.xs_stride - a.k;
  for (int i = threadIdx.x; i < a.m * pad; i += threads) xs[(i / pad) * a.xs_stride + a.k + i % pad] = bf16_t{};
  __syncthreads();
  for (int m = threadIdx.x / 32; m < a.m; m += threads / 32) {  // a warp a row: the group's sum, in order
    float total = 0.0f;
    for (int j0 = 0; j0 < G; j0 += 32) {
      float s = j0 + lane < G ? ss[m * G + j0 + lane] : 0.0f;
      for (int o = min(G, 32) / 2; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
      total = G <= 32 ? s : total + s;  // above 32: the warps' sums from 0 in warp order
    }
    if (lane == 0) inv[m] = rms_row::inverse_rms(total, rms_row::inverse_length(a.k), a.eps);
  }
  __syncthreads();
  const int eights = a.k / 8;
  for (int i = threadIdx.x; i < a.m * eights; i += threads) {  // in place, eight columns a thread
    const int m = i / eights, col = 8 * (i % eights);
    uint4* p = reinterpret_cast<uint4*>(xs + m * a.xs_stride + col);
    float x8[8], g8[8], y[8];
    cuda::unpack_bf16<8>(*p, x8);
    cuda::load_f32<8>(a.gamma + col, g8);
#pragma unroll
    for (int e = 0; e < 8; ++e) y[e] = rms_row::normed(g8[e], x8[e], inv[m]);
    *p = cuda::pack_bf16_word<8>(y);
  }
  __syncthreads();
}

// The mainloop: the lane's slices through its ring (kAhead of them already issued), two mmas each.
// x comes from the ring, or from the normed rows xs when the norm is fused (zeros for rows g ≥ M).
template <bool Normed, int Ahead>
__device__ __forceinline__ void stream_slices(const LaneStream<Normed, Ahead>& s, const bf16_t* xs, float (&acc)[4]) {
  constexpr int kAhead = Ahead;
  const bf16_t* xs_row = Normed && s.g < s.a.m ? xs + s.g * s.a.xs_stride : nullptr;
  for (int i = 0; i < s.count; ++i) {
    // Committed so far: kAhead + i groups; at most kAhead − 1 pending means slice i has landed
    // (each lane reads back only what it copied itself, so no barrier).
    cuda::cp_async_wait<kAhead - 1>();
    const uint4 wa = *s.stage(i, 0), wb = *s.stage(i, 1);
    uint4 xv;
    if constexpr (Normed) {
      xv = xs_row != nullptr ? *reinterpret_cast<const uint4*>(xs_row + s.k_of(i)) : uint4{0, 0, 0, 0};
    } else {
      xv = *s.stage(i, 2);
    }
    mma_slice(acc, wa, wb, xv);
    // Refill the stage slice i − 1 used: its reads completed before last iteration's mmas issued,
    // so the copy cannot overwrite a value still being read (kStages = kAhead + 1).
    s.issue(i + kAhead);
  }
  cuda::cp_async_wait<0>();  // nothing in flight at exit (the empty groups)
}

// The warps' 16 × 8 tiles summed in warp order through shared memory, then bf16 out (adding the old
// value in fp32 first when accumulating).
__device__ __forceinline__ void store_tile(const GemvArgs& a, int warp, int warps, const float (&acc)[4],
                                           float (&partial)[kMaxWarps][kTileRows][8]) {
  const int g = threadIdx.x % 32 / 4, c = threadIdx.x % 4, n0 = blockIdx.x * kTileRows;
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

template <bool Normed, int Ahead>
__global__ void __launch_bounds__(32 * kMaxWarps) gemv_kernel(const __grid_constant__ GemvArgs a) {
  constexpr int kAhead = Ahead, kStages = stages(Ahead);
  extern __shared__ uint4 ring[];  // [kStages][planes][threads], then (Normed) xs [M][xs_stride] bf16
  __shared__ float partial[kMaxWarps][kTileRows][8];  // the prologue's scratch first (M·G ≤ 2048 floats)
  __shared__ float inv_rms[kMaxRows];
  const LaneStream<Normed, Ahead> s(a, ring);
  bf16_t* xs = reinterpret_cast<bf16_t*>(ring + kStages * planes(Normed) * s.threads);
  if constexpr (Normed) {  // w only in the ring: the first slices copied before the wait
    if (a.prefetch_tile) s.prefetch_first();
#pragma unroll
    for (int i = 0; i < kAhead; ++i) s.issue(i);
  } else {
    s.prefetch_first();
  }
  cuda::wait_for_previous_grid();  // launched through cuda::launch (PDL in a decode step)
  cuda::allow_next_grid();
  if constexpr (Normed) {
    normed_rows_to_shared(a, xs, &partial[0][0][0], inv_rms);
  } else {
#pragma unroll
    for (int i = 0; i < kAhead; ++i) s.issue(i);
  }
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  stream_slices(s, xs, acc);
  store_tile(a, s.warp, s.warps, acc, partial);
}

}  // namespace

void gemv(const TensorView& out, const TensorView& x, const TensorView& w, Accumulate accumulate,
          const GemvInputNorm* norm, const GemvTuning& tuning) {
  HYDRA_ASSERT(gemv_supported(out, x, w), "gemv: the CUDA kernel does not take out {} {}, x {} {}, w {} {}",
               dtype_name(out.dtype()), out.shape_string(), dtype_name(x.dtype()), x.shape_string(),
               dtype_name(w.dtype()), w.shape_string());
  HYDRA_ASSERT(norm == nullptr || gemv_rms_norm_supported(x, norm->gamma, w),
               "gemv: the fused norm does not take x {} {} with gamma {} {}", dtype_name(x.dtype()), x.shape_string(),
               norm ? dtype_name(norm->gamma.dtype()) : "", norm ? norm->gamma.shape_string() : "");
  const int64_t m = x.size(0), k = x.size(1), n = w.size(0);
  HYDRA_ASSERT(n < (int64_t{1} << 31) - kTileRows && k < (int64_t{1} << 31) - kSlice, "gemv: N {} or K {} too large", n, k);
  const int64_t tiles = (n + kTileRows - 1) / kTileRows;
  HYDRA_ASSERT((tuning.warps == 0 || tuning.warps == 4 || tuning.warps == 8 || tuning.warps == 16) &&
                   (tuning.ahead == 4 || tuning.ahead == 8),
               "gemv: tuning warps {} (0, 4, 8 or 16), ahead {} (4 or 8)", tuning.warps, tuning.ahead);
  // By default, fewer than two CTAs per SM: 16 warps each, else 8; never more warps than slices to
  // share. The same with and without the fused norm, so both sum the same products in the same order.
  const int64_t slices = (k + kSlice - 1) / kSlice;
  const int chosen = tuning.warps != 0 ? tuning.warps : tiles < 2 * cuda::sm_count() ? kMaxWarps : 8;
  const int warps = static_cast<int>(std::min<int64_t>(chosen, slices));
  GemvArgs args{.out = out.data_as<bf16_t>(),
                .out_stride = out.stride(0),
                .x = x.data_as<const bf16_t>(),
                .x_stride = x.stride(0),
                .w = w.data_as<const bf16_t>(),
                .w_stride = w.stride(0),
                .m = static_cast<int>(m),
                .n = static_cast<int>(n),
                .k = static_cast<int>(k),
                .accumulate = accumulate == Accumulate::yes,
                .prefetch_tile = tuning.prefetch == GemvPrefetch::tile};
  size_t shared = static_cast<size_t>(stages(tuning.ahead)) * planes(norm != nullptr) * 16 * 32 * warps;
  if (norm != nullptr) {
    const rms_vector::VectorShape shape = rms_vector::vector_shape(k);
    args.gamma = norm->gamma.data_as<const float>();
    args.eps = norm->params.eps;
    args.norm_group = shape.group;
    args.norm_runs = shape.runs;
    // Past K to a whole slice, and to 32 (mod 64) elements: rows g and g + 1 then start 64 bytes
    // apart modulo 128, so a quarter warp's 16-byte reads (two rows, four lanes each) hit distinct banks.
    args.xs_stride = static_cast<int>((k + 63) / 64 * 64 + 32);
    shared += static_cast<size_t>(m) * args.xs_stride * sizeof(bf16_t);
  }
  // 227 KB a CTA on Hopper, less the static partial tiles: 8 lanes ahead at 16 warps is the most.
  HYDRA_ASSERT(shared <= 227 * 1024 - sizeof(float) * (kMaxWarps * kTileRows * 8 + kMaxRows),
               "gemv: {} bytes of shared memory at {} warps, {} slices ahead, K {}", shared, warps, tuning.ahead, k);
  const auto kernel = norm != nullptr ? (tuning.ahead == 8 ? gemv_kernel<true, 8> : gemv_kernel<true, 4>)
                                      : (tuning.ahead == 8 ? gemv_kernel<false, 8> : gemv_kernel<false, 4>);
  HYDRA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared)));
  cuda::launch(kernel, dim3(static_cast<unsigned>(tiles)), dim3(32 * warps), shared, args);
  HYDRA_CUDA_LAUNCH_CHECK();
}

}  // namespace hydra::ops::cuda_impl
