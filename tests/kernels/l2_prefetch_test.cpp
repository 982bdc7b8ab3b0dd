// The L2 prefetch's plan (kernels/l2_prefetch/l2_prefetch.h) without a GPU: which byte ranges a call
// asks for, on views of made-up device addresses (nothing is read): the regions in order, each
// whole before the next, the last cut at the cap; 16-byte-aligned interiors (the bulk prefetch's
// rule); empty and tiny regions dropped; non-contiguous views and too many regions refused. And the
// op itself on host and shape-only views: nothing to do, 0 bytes.
#include <vector>

#include "kernels/l2_prefetch/l2_prefetch.h"
#include "runtime/error.h"
#include "tests/common/test_util.h"

namespace hydra::test {
namespace {

// A bf16 view of `elements` at a made-up device address (never dereferenced).
TensorView device_view(uintptr_t address, int64_t elements) {
  return TensorView(reinterpret_cast<void*>(address), DType::bf16, Device::cuda, {elements});
}

TEST(L2Prefetch, RangesFollowTheRegionsUpToTheCap) {
  const uintptr_t a = 0x7f0000000000, b = 0x7f0000100000, c = 0x7f0000200000;
  const TensorView regions[] = {device_view(a, 4096), device_view(b, 2048), device_view(c, 1 << 20)};  // 8 KiB, 4 KiB, 2 MiB
  // Everything: three ranges, whole.
  auto r = ops::l2_prefetch_ranges(regions, int64_t{1} << 30);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].begin, a);
  EXPECT_EQ(r[0].bytes, 8192);
  EXPECT_EQ(r[1].begin, b);
  EXPECT_EQ(r[1].bytes, 4096);
  EXPECT_EQ(r[2].begin, c);
  EXPECT_EQ(r[2].bytes, 2 << 20);
  // A cap inside the second region: the first whole, the second cut (to a multiple of 16), no third.
  r = ops::l2_prefetch_ranges(regions, 8192 + 1000 + 7);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].bytes, 8192);
  EXPECT_EQ(r[1].begin, b);
  EXPECT_EQ(r[1].bytes, 992);  // the cap 9199 rounded down to 9184, less the first 8192
  // A cap inside the first region, and a cap of 0.
  r = ops::l2_prefetch_ranges(regions, 100);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].bytes, 96);
  EXPECT_TRUE(ops::l2_prefetch_ranges(regions, 0).empty());
  EXPECT_TRUE(ops::l2_prefetch_ranges(regions, 15).empty());
  EXPECT_TRUE(ops::l2_prefetch_ranges({}, 1 << 20).empty());
}

TEST(L2Prefetch, RangesAreSixteenByteAlignedInteriors) {
  const uintptr_t base = 0x7f0000000000;
  // bf16 elements 3 .. 3 + 1000: bytes [6, 2006) → [16, 2000).
  const TensorView odd = device_view(base + 6, 1000);
  auto r = ops::l2_prefetch_ranges(std::vector<TensorView>{odd}, int64_t{1} << 20);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].begin, base + 16);
  EXPECT_EQ(r[0].bytes, 2000 - 16);
  // Fewer than 16 aligned bytes inside: dropped, and the next region still taken.
  const TensorView tiny = device_view(base + 2, 10), empty = device_view(base + 64, 0), next = device_view(base + 4096, 64);
  r = ops::l2_prefetch_ranges(std::vector<TensorView>{tiny, empty, TensorView(), next}, int64_t{1} << 20);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].begin, base + 4096);
  EXPECT_EQ(r[0].bytes, 128);
  for (const auto& range : ops::l2_prefetch_ranges(std::vector<TensorView>{odd, next}, 1000)) {
    EXPECT_EQ(range.begin % 16, 0u);
    EXPECT_EQ(range.bytes % 16, 0);
    EXPECT_GT(range.bytes, 0);
  }
}

TEST(L2Prefetch, RefusesViewsItCannotTake) {
  const uintptr_t base = 0x7f0000000000;
  // Every other column of a [64, 64] matrix: not one contiguous range.
  const TensorView matrix(reinterpret_cast<void*>(base), DType::bf16, Device::cuda, {64, 64});
  const TensorView columns = matrix.narrow(1, 0, 32);
  EXPECT_THROW(ops::l2_prefetch_ranges(std::vector<TensorView>{columns}, 1 << 20), Error);
  std::vector<TensorView> many(ops::kL2PrefetchMaxRanges + 1, device_view(base, 64));
  EXPECT_THROW(ops::l2_prefetch_ranges(many, 1 << 20), Error);
  EXPECT_THROW(ops::l2_prefetch_ranges(std::vector<TensorView>{matrix}, -1), Error);
}

TEST(L2Prefetch, HostAndShapeOnlyViewsAskForNothing) {
  const Tensor host = random_tensor({1000}, 1);
  const Tensor before = clone(host);
  EXPECT_EQ(ops::l2_prefetch(std::vector<TensorView>{host.view()}, int64_t{1} << 20), 0);
  expect_close(host, before, 0.0, "a host prefetch changes nothing");
  // A shape-only run's device tensors (meta addresses): nothing launched, even on a machine with a GPU.
  const TensorView meta = device_view(kMetaAddress + 4096, 1 << 20);
  ASSERT_TRUE(meta.is_meta());
  EXPECT_EQ(ops::l2_prefetch(std::vector<TensorView>{meta}, int64_t{1} << 20), 0);
}

}  // namespace
}  // namespace hydra::test
