// Bringing weights into the GPU's L2 cache ahead of the kernels that read them. In a decode step at
// batch 1 about 40 of a layer's ~95 µs are latency-bound kernels (the FA decode, the GDN step, the
// fusion, norms) that leave DRAM mostly idle, while the projections after them stream their weights
// at ~2.1 TB/s (issue 57's profile, cluster/results/h100-2026-12-07-session3). The decode step
// (model_forward.cpp, the kernel option decode_prefetch_bytes) asks for the layer's o_proj and MLP
// weights here, on a side stream, once its input projection is done, so the GEMVs after the attention
// part find part of their weights in L2 (an H100 has 50 MB).
//
// A prefetch reads nothing into any result and writes nothing: a step with it computes the same bits
// as without (tests/model/cuda_generate_test.cpp holds the tokens equal, eager and graph). Host
// tensors and shape-only runs do nothing.
//
// CUDA (l2_prefetch.cu, sm_90): each region's 16-byte-aligned interior (a TMA bulk prefetch needs a
// 16-byte-aligned address and a multiple of 16 bytes; the up to 15 bytes at either end are left
// out) is cut into pieces of kL2PrefetchPiece bytes, one `cp.async.bulk.prefetch.L2.global` each,
// issued by one 32-thread CTA per SM (piece p by CTA p mod grid, so the first pieces leave from
// every SM at once). Nothing waits for the data: a prefetch has no completion, and the CTAs exit
// once their prefetches are issued. The launch has the greatest stream priority the device offers,
// so its CTAs are placed ahead of other waiting work.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "runtime/tensor.h"

namespace hydra::ops {

inline constexpr int64_t kL2PrefetchPiece = 32 * 1024;  // bytes per bulk prefetch instruction
inline constexpr int kL2PrefetchMaxRanges = 8;          // regions of one call

// One contiguous byte range to prefetch: begin 16-byte aligned, bytes a positive multiple of 16.
struct L2PrefetchRange {
  uintptr_t begin = 0;
  int64_t bytes = 0;
};

// The ranges l2_prefetch asks for: the regions in the order given, each whole before the next, the
// last one cut so that the total stays within max_bytes (rounded down to 16 bytes); each region's
// start rounded up and its end rounded down to 16 bytes; empty ranges dropped. Every region must be
// a contiguous tensor (an error otherwise); at most kL2PrefetchMaxRanges of them. Pure arithmetic on
// the regions' addresses (host or device), so the plan is tested without a GPU.
std::vector<L2PrefetchRange> l2_prefetch_ranges(std::span<const TensorView> regions, int64_t max_bytes);

// Asks the GPU to bring l2_prefetch_ranges(regions, max_bytes) into L2, on the current stream, and
// returns the bytes asked for (0: nothing launched: host or meta tensors, max_bytes = 0, no regions).
int64_t l2_prefetch(std::span<const TensorView> regions, int64_t max_bytes);

#if HYDRA_CUDA
namespace cuda_impl {  // l2_prefetch.cu
void l2_prefetch(std::span<const L2PrefetchRange> ranges);
}  // namespace cuda_impl
#endif

}  // namespace hydra::ops
