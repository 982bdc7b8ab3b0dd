// The device world of the multi-rank GPU suites (test_parallel_gpu): every rank on a GPU of its
// node. With a GPU per rank the ranks talk over NCCL, as in production; with fewer GPUs than ranks
// they share them (GpuSharing::allowed, what HYDRA_SHARE_GPUS=1 gives hydra) and talk over
// host-staged MPI (parallel/staged_communicator.h), so the suites run at P = 2, 3, 4 and 8 on one
// GPU. Without a GPU every test reports SKIPPED. The CPU ranks of the same job (world()) compute the
// P-rank CPU reference.
#pragma once

#include <cstdio>

#include "parallel/device_world.h"
#include "tests/common/test_util.h"
#include "tests/parallel/parallel_test_util.h"

namespace hydra::test {

struct Gpus {
  DeviceWorld device;
  bool ok = false;
};

inline Gpus& gpus() {
  static Gpus g;
  static const bool initialised = [] {
    int argc = 0;
    char** argv = nullptr;
    MpiRuntime runtime(&argc, &argv);  // MPI is up (test main): this only reads the local rank
    int have = cuda_devices() > 0 ? 1 : 0, all = 0;
    MPI_Allreduce(&have, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!all) return true;
    g.device = make_device_world("cuda", runtime, world(), GpuSharing::allowed, 300.0);
    g.ok = true;
    if (world().rank() == 0) {
      std::printf("[ gpus ] %d ranks, device communicator %s, %d rank(s) on GPU %d\n", world().size(),
                  g.device.comm->name().c_str(), g.device.ranks_on_gpu, g.device.gpu);
    }
    return true;
  }();
  (void)initialised;
  return g;
}

inline Communicator& gpu_comm() { return *gpus().device.comm; }

#define REQUIRE_GPUS()                                                             \
  do {                                                                             \
    if (!::hydra::test::gpus().ok) GTEST_SKIP() << "no CUDA device: GPU test skipped"; \
  } while (0)

// Host f32 copy of the rows of `global` (host or device) that this rank owns.
inline Tensor local_host_rows(const SequenceLayout& layout, const TensorView& global) {
  return host(layout.local_rows(global));
}

// Held to a bound: NaN/Inf first, then the RMS ratio ‖a − b‖/‖b‖ ≤ rms and max|a − b|/max|b| ≤ max.
// Rank 0 prints the measured pair so the results folder records how far inside the bound it is.
inline void expect_within(const TensorView& actual, const TensorView& expected, double rms, double max,
                          const std::string& what) {
  ASSERT_EQ(count_non_finite(actual), 0) << what;
  const double r = norm_rel_error(actual, expected), m = max_rel_error(actual, expected);
  EXPECT_LE(r, rms) << what << ": RMS ratio";
  EXPECT_LE(m, max) << what << ": max ratio";
  if (world().rank() == 0) std::printf("  %-58s P=%d rms %.2e (<= %.0e) max %.2e (<= %.0e)\n", what.c_str(), world().size(), r, rms, m, max);
}

}  // namespace hydra::test
