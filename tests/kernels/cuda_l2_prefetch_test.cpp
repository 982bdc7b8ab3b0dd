// ops::l2_prefetch on the GPU (kernels/l2_prefetch/): it asks for exactly the bytes of
// l2_prefetch_ranges (tests/kernels/l2_prefetch_test.cpp checks that plan on the CPU), its kernel
// runs to completion without a fault on regions at odd offsets, of sizes the 32 KiB pieces do not
// divide, eight at once, more pieces than SMs, with caps inside a region; and it changes no byte of
// the buffer it prefetches from. Forked onto a side stream (SideWork) inside a CUDA graph capture,
// the graph holds its one kernel and replays. SKIPPED without a GPU.
#include <cstring>
#include <vector>

#include "kernels/l2_prefetch/l2_prefetch.h"
#include "runtime/concurrency.h"
#include "runtime/cuda_graph.h"
#include "tests/common/test_util.h"

namespace hydra::test {
namespace {

TEST(CudaPrefetch, AsksForTheBytesAndChangesNothing) {
  HYDRA_REQUIRE_GPU();
  const int64_t n = int64_t{8} << 20;  // bf16 elements: 16 MiB, 512 pieces
  const Tensor buf = gpu(random_tensor({n}, 1), DType::bf16);
  const Tensor before = host(buf);
  const TensorView all = buf.view();
  const std::vector<TensorView> regions = {
      all.narrow(0, 3, 100000),                  // an odd start (6 bytes in), 200000 bytes
      all.narrow(0, 200001, 5 * 16384 + 7),      // five pieces and 14 bytes
      all.narrow(0, 400000, 5),                  // 10 bytes: nothing aligned inside, dropped
      all.narrow(0, 500000, 3000000),            // 6 MB: 184 pieces
      all.narrow(0, 4000000, 1),                 // 2 bytes
      all.narrow(0, 4100000, 8),                 // exactly 16 bytes
      all.narrow(0, 4200000, n - 4200000 - 9),   // to 18 bytes before the end
      all.narrow(0, n - 8, 8)};                  // the last 16 bytes
  for (const int64_t cap : {int64_t{1} << 30, int64_t{300000}, int64_t{7000000}, int64_t{16}, int64_t{15}, int64_t{0}}) {
    int64_t want = 0;
    for (const ops::L2PrefetchRange& r : ops::l2_prefetch_ranges(regions, cap)) want += r.bytes;
    EXPECT_EQ(ops::l2_prefetch(regions, cap), want) << "cap " << cap;
  }
  const Tensor after = host(buf);  // a device-to-host copy: waits for the prefetches, raises a fault
  EXPECT_EQ(std::memcmp(after.data(), before.data(), before.nbytes()), 0) << "the prefetch changed the buffer";

  // Forked onto a side stream and joined: eagerly, then under capture (one kernel node), replayed twice.
  {
    SideWork side;
    side.start(Device::cuda, Branches::concurrent, [&] { ops::l2_prefetch(regions, int64_t{1} << 30); });
    EXPECT_TRUE(side.started());
    side.join();
  }
  CudaGraph graph;
  graph.capture([&] {
    SideWork side;
    side.start(Device::cuda, Branches::concurrent, [&] { ops::l2_prefetch(regions, int64_t{1} << 30); });
    side.join();
  });
  EXPECT_EQ(graph.kernel_nodes(), 1u);
  graph.launch();
  graph.launch();
  const Tensor replayed = host(buf);
  EXPECT_EQ(std::memcmp(replayed.data(), before.data(), before.nbytes()), 0) << "the replayed prefetch changed the buffer";
}

}  // namespace
}  // namespace hydra::test
