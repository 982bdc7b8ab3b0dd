// CUDA L2 prefetch (l2_prefetch.h): TMA bulk prefetches of fixed-size pieces, spread over one
// 32-thread CTA per SM.
//
// The kernel is launched without programmatic dependent launch (it never calls
// griddepcontrol.wait): it starts once everything before it on its stream has completed, reads no
// value and writes nothing, so no kernel has to wait for it either; and with the greatest stream
// priority, so that its CTAs are placed before lower-priority work waiting for an SM.
#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/l2_prefetch/l2_prefetch.h"

namespace hydra::ops::cuda_impl {
namespace {

struct PrefetchArgs {
  int n;                                       // ranges
  const char* begin[kL2PrefetchMaxRanges];     // device pointers, 16-byte aligned
  int64_t bytes[kL2PrefetchMaxRanges];         // multiples of 16
  int64_t piece_end[kL2PrefetchMaxRanges];     // pieces of ranges 0..r, cumulative
};

__global__ void __launch_bounds__(32) l2_prefetch_kernel(const __grid_constant__ PrefetchArgs a) {
  const int64_t pieces = a.piece_end[a.n - 1];
  for (int64_t p = blockIdx.x + int64_t{threadIdx.x} * gridDim.x; p < pieces; p += int64_t{gridDim.x} * 32) {
    int r = 0;
    while (a.piece_end[r] <= p) ++r;
    const int64_t q = p - (r > 0 ? a.piece_end[r - 1] : 0);  // piece q of range r
    const size_t address = __cvta_generic_to_global(a.begin[r] + q * kL2PrefetchPiece);
    const uint32_t bytes = static_cast<uint32_t>(min(kL2PrefetchPiece, a.bytes[r] - q * kL2PrefetchPiece));
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(address), "r"(bytes) : "memory");
#endif
  }
}

// The greatest (numerically lowest) stream priority of the current device, queried once.
int greatest_priority() {
  static const int priority = [] {
    int least = 0, greatest = 0;
    HYDRA_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    return greatest;
  }();
  return priority;
}

}  // namespace

void l2_prefetch(std::span<const L2PrefetchRange> ranges) {
  HYDRA_ASSERT(!ranges.empty() && ranges.size() <= static_cast<size_t>(kL2PrefetchMaxRanges),
               "L2 prefetch: {} ranges", ranges.size());
  PrefetchArgs a{};
  a.n = static_cast<int>(ranges.size());
  int64_t pieces = 0;
  for (size_t i = 0; i < ranges.size(); ++i) {
    const L2PrefetchRange& r = ranges[i];
    HYDRA_ASSERT(r.begin % 16 == 0 && r.bytes > 0 && r.bytes % 16 == 0, "L2 prefetch: range at {:#x} of {} bytes",
                 r.begin, r.bytes);
    a.begin[i] = reinterpret_cast<const char*>(r.begin);
    a.bytes[i] = r.bytes;
    pieces += (r.bytes + kL2PrefetchPiece - 1) / kL2PrefetchPiece;
    a.piece_end[i] = pieces;
  }
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributePriority;
  attribute.val.priority = greatest_priority();
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(std::min<int64_t>(pieces, cuda::sm_count())));
  config.blockDim = dim3(32);
  config.stream = current_stream();
  config.attrs = &attribute;
  config.numAttrs = 1;
  HYDRA_CUDA_CHECK(cudaLaunchKernelEx(&config, l2_prefetch_kernel, a));
}

}  // namespace hydra::ops::cuda_impl
