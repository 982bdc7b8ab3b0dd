#include "kernels/l2_prefetch/l2_prefetch.h"

#include <algorithm>

#include "runtime/error.h"

namespace hydra::ops {

std::vector<L2PrefetchRange> l2_prefetch_ranges(std::span<const TensorView> regions, int64_t max_bytes) {
  HYDRA_ASSERT(max_bytes >= 0, "L2 prefetch: a cap of {} bytes", max_bytes);
  HYDRA_ASSERT(regions.size() <= static_cast<size_t>(kL2PrefetchMaxRanges), "L2 prefetch: {} regions (at most {})",
               regions.size(), kL2PrefetchMaxRanges);
  std::vector<L2PrefetchRange> out;
  int64_t left = max_bytes / 16 * 16;
  for (const TensorView& r : regions) {
    if (left == 0) break;
    if (!r.defined() || r.numel() == 0) continue;
    HYDRA_ASSERT(r.is_contiguous(), "L2 prefetch: a region {} that is not contiguous", r.shape_string());
    const uintptr_t start = reinterpret_cast<uintptr_t>(r.data());
    const uintptr_t begin = (start + 15) / 16 * 16, end = (start + r.nbytes()) / 16 * 16;
    if (end <= begin) continue;
    const int64_t bytes = std::min(static_cast<int64_t>(end - begin), left);
    out.push_back({.begin = begin, .bytes = bytes});
    left -= bytes;
  }
  return out;
}

int64_t l2_prefetch(std::span<const TensorView> regions, int64_t max_bytes) {
  const TensorView* first = nullptr;
  for (const TensorView& r : regions) {
    if (!r.defined()) continue;
    if (r.is_meta()) return 0;  // a shape-only run: nothing to fetch
    if (first == nullptr) first = &r;
    HYDRA_ASSERT(r.device() == first->device(), "L2 prefetch: regions on {} and {}", device_name(first->device()),
                 device_name(r.device()));
  }
  if (first == nullptr || first->device() != Device::cuda || max_bytes == 0) return 0;  // the host has no L2 to fill
  const std::vector<L2PrefetchRange> ranges = l2_prefetch_ranges(regions, max_bytes);
  int64_t bytes = 0;
  for (const L2PrefetchRange& r : ranges) bytes += r.bytes;
  if (bytes == 0) return 0;
#if HYDRA_CUDA
  cuda_impl::l2_prefetch(ranges);
#endif
  return bytes;
}

}  // namespace hydra::ops
