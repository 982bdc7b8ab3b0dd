// CUDA row arg-max (argmax.h): a cluster of kParts CTAs per row, each scanning its contiguous part of
// the row with 16-byte loads (four in flight a thread), a block reduction of (value, index) that keeps
// the lower index on ties and ORs a flag for non-finite values, then CTA 0 of the cluster reducing the
// parts' results from their shared memory (distributed shared memory), in part order.
//
// Why a cluster: one CTA per row read the 600 KB of a 151936-wide row from one SM at ~10 GB/s (64 µs a
// decode step at batch 1, issue 57's profile); spread over 8 SMs the row is a few µs, and the cluster
// combines the parts without a workspace, a second launch or atomics (no state to reset between CUDA
// graph replays; the same bits every run).
//
// The result equals the CPU reference's whatever the split: within a thread the indices rise, so a
// strict > keeps the first of equal values; across threads and parts `better` orders (value, index)
// pairs totally for finite values (−0 == +0, the lower index first), so the maximum is unique. A
// non-finite value anywhere in the row makes the row's id −1.
#include <cooperative_groups.h>

#include <climits>

#include "kernels/argmax/argmax.h"
#include "kernels/cuda/common.cuh"

namespace hydra::ops::cuda_impl {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 512;
constexpr int kParts = 8;   // CTAs per row: the cluster (portable size)
constexpr int kUnroll = 4;  // 16-byte loads in flight a thread
constexpr int kNone = INT_MAX;  // no element seen (the value is then −inf)

struct Best {
  float value;
  int index;
};

__device__ __forceinline__ bool better(const Best& a, const Best& b) {
  return a.value > b.value || (a.value == b.value && a.index < b.index);
}

__device__ __forceinline__ void take(Best& best, float x, int i, int& bad) {
  bad |= !isfinite(x);
  if (x > best.value) best = {x, i};  // rising i: the first of equal values stays
}

// The CTA's part [begin, end) of the row; `vec`: the row and begin are 16-byte aligned.
__device__ Best scan_part(const float* row, int begin, int end, bool vec, int& bad) {
  Best best{-INFINITY, kNone};
  if (vec) {
    const float4* row4 = reinterpret_cast<const float4*>(row + begin);
    const int n4 = (end - begin) / 4;
    for (int j0 = threadIdx.x; j0 < n4; j0 += kThreads * kUnroll) {
      float4 q[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int j = j0 + u * kThreads;
        q[u] = j < n4 ? __ldcs(row4 + j) : make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int j = j0 + u * kThreads;
        if (j < n4) {
          const int i = begin + 4 * j;
          take(best, q[u].x, i, bad);
          take(best, q[u].y, i + 1, bad);
          take(best, q[u].z, i + 2, bad);
          take(best, q[u].w, i + 3, bad);
        }
      }
    }
    begin += 4 * n4;  // the last part's tail of fewer than 4
  }
  for (int i = begin + static_cast<int>(threadIdx.x); i < end; i += kThreads) take(best, row[i], i, bad);
  return best;
}

__device__ __forceinline__ Best warp_best(Best b) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) {
    const Best other{__shfl_xor_sync(0xffffffffu, b.value, o), __shfl_xor_sync(0xffffffffu, b.index, o)};
    if (better(other, b)) b = other;
  }
  return b;
}

// grid (kParts, B): blockIdx.x the part (the CTA's rank in its cluster), blockIdx.y the row.
__global__ void __cluster_dims__(kParts, 1, 1) __launch_bounds__(kThreads)
    row_argmax_kernel(int32_t* ids, const float* logits, int64_t stride, int v, int chunk, bool vec) {
  cuda::wait_for_previous_grid();  // launched through cuda::launch (PDL in a decode step)
  cuda::allow_next_grid();
  cg::cluster_group cluster = cg::this_cluster();
  const float* row = logits + static_cast<int64_t>(blockIdx.y) * stride;
  const int begin = min(static_cast<int>(blockIdx.x) * chunk, v), end = min(begin + chunk, v);
  int bad = 0;
  Best best = warp_best(scan_part(row, begin, end, vec, bad));
  bad = __syncthreads_or(bad);
  __shared__ Best warps[kThreads / 32];
  __shared__ Best part;  // this CTA's result, read by CTA 0 of the cluster
  __shared__ int part_bad;
  if (threadIdx.x % 32 == 0) warps[threadIdx.x / 32] = best;
  __syncthreads();
  if (threadIdx.x < 32) {
    best = warp_best(threadIdx.x < kThreads / 32 ? warps[threadIdx.x] : Best{-INFINITY, kNone});
    if (threadIdx.x == 0) {
      part = best;
      part_bad = bad;
    }
  }
  cluster.sync();  // every part's result written (release/acquire across the cluster)
  if (blockIdx.x == 0 && threadIdx.x < 32) {
    const int p = threadIdx.x;
    Best b{-INFINITY, kNone};
    int any_bad = 0;
    if (p < kParts) {
      b = *cluster.map_shared_rank(&part, p);
      any_bad = *cluster.map_shared_rank(&part_bad, p);
    }
    b = warp_best(b);
    any_bad = __any_sync(0xffffffffu, any_bad);
    if (p == 0) ids[blockIdx.y] = any_bad ? -1 : (b.index == kNone ? v : b.index);
  }
  cluster.sync();  // no CTA leaves while CTA 0 may still read its shared memory
}

}  // namespace

void row_argmax(const TensorView& ids, const TensorView& logits) {
  HYDRA_ASSERT(logits.stride(1) == 1 && ids.stride(0) == 1, "argmax: unit strides needed");
  const int64_t rows = logits.size(0), v = logits.size(1);
  if (rows == 0) return;
  HYDRA_ASSERT(v < INT_MAX - 4 * kParts && rows <= 65535, "argmax: [{}, {}] logits too large", rows, v);
  // Parts of whole 16-byte words when every row starts 16-byte aligned.
  const bool vec = reinterpret_cast<uintptr_t>(logits.data()) % 16 == 0 && logits.stride(0) % 4 == 0;
  const int64_t chunk = vec ? (v + 4 * kParts - 1) / (4 * kParts) * 4 : (v + kParts - 1) / kParts;
  cuda::launch(row_argmax_kernel, dim3(kParts, static_cast<unsigned>(rows)), kThreads, 0,
               static_cast<int32_t*>(ids.data()), static_cast<const float*>(logits.data()), logits.stride(0),
               static_cast<int>(v), static_cast<int>(std::max<int64_t>(chunk, 1)), vec);
  HYDRA_CUDA_LAUNCH_CHECK();
}

}  // namespace hydra::ops::cuda_impl
