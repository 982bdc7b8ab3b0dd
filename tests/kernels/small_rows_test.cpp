// The host side of the small-row kernels (HYDRA_SMALL_ROWS, kernels/small_rows.h): which RMSNorm rows
// take them and how the backward cuts its rows into CTAs (rms_vector.h, plain C++ the launcher
// reads), the per-thread scope that switches them, and that host tensors never see the switch (the
// CPU reference runs either way, bit for bit). The kernels themselves are held to the CPU reference
// by the GPU tests CudaBackward.RmsNormSmallRows and CudaTraining.CrossEntropySmallVocab.
#include <cstring>
#include <string>

#include "kernels/loss/loss.h"
#include "kernels/rmsnorm/rms_vector.h"
#include "kernels/rmsnorm/rmsnorm.h"
#include "kernels/small_rows.h"
#include "tests/common/test_util.h"

namespace hydra::test {
namespace {

using ops::rms_vector::kSmallBackwardRuns;
using ops::rms_vector::kSmallForwardRuns;
using ops::rms_vector::small_backward_blocks;
using ops::rms_vector::small_shape;
using ops::rms_vector::vector_shape;

TEST(SmallRows, RmsNormRowsTheyTake) {
  // n ≤ 256: G = n/8 threads (a power of two), one run each: the vector path's own shape.
  for (const int64_t n : {8, 16, 32, 64, 128, 256}) {
    const auto s = small_shape(n, kSmallForwardRuns);
    EXPECT_EQ(s.group, n / 8) << n;
    EXPECT_EQ(s.runs, 1) << n;
    EXPECT_EQ(s.group, vector_shape(n).group) << n;
    EXPECT_EQ(s.runs, vector_shape(n).runs) << n;
    EXPECT_EQ(small_shape(n, kSmallBackwardRuns).group, n / 8) << n;
  }
  // 512 and 1024: one warp, 2 or 4 runs a lane; the backward stops at 2 runs.
  EXPECT_EQ(small_shape(512, kSmallForwardRuns).group, 32);
  EXPECT_EQ(small_shape(512, kSmallForwardRuns).runs, 2);
  EXPECT_EQ(small_shape(512, kSmallBackwardRuns).runs, 2);
  EXPECT_EQ(small_shape(1024, kSmallForwardRuns).group, 32);
  EXPECT_EQ(small_shape(1024, kSmallForwardRuns).runs, 4);
  EXPECT_EQ(small_shape(1024, kSmallBackwardRuns).group, 0);
  // Not taken: wider rows, widths not 8·2^k (below 256) or 256·2^k (above), empty rows.
  for (const int64_t n : {0, -8, 4, 12, 24, 200, 264, 768, 2048, 4096}) {
    EXPECT_EQ(small_shape(n, kSmallForwardRuns).group, 0) << n;
    EXPECT_EQ(small_shape(n, kSmallBackwardRuns).group, 0) << n;
  }
}

TEST(SmallRows, BackwardBlocksDependOnTheRowsAlone) {
  // qwen3-synth's step: 16384 rows of 256 (8 groups a CTA), its q and k norms' head rows of 64 (32 groups).
  EXPECT_EQ(small_backward_blocks(16384, 32).per_block, 32);
  EXPECT_EQ(small_backward_blocks(16384, 32).blocks, 512);
  EXPECT_EQ(small_backward_blocks(131072, 8).per_block, 256);
  EXPECT_EQ(small_backward_blocks(131072, 8).blocks, 512);
  // Few rows: at least two rows a group, so one CTA.
  EXPECT_EQ(small_backward_blocks(37, 8).per_block, 64);
  EXPECT_EQ(small_backward_blocks(37, 8).blocks, 1);
  EXPECT_EQ(small_backward_blocks(0, 8).blocks, 0);
  // Every row in exactly one CTA, never more than 512 CTAs, none empty.
  for (const int64_t rows : {1, 15, 16, 17, 511, 4097, 100003, 1 << 20}) {
    for (const int group : {1, 8, 32}) {
      const auto b = small_backward_blocks(rows, group);
      EXPECT_LE(b.blocks, ops::rms_vector::kSmallBackwardBlocks) << rows << " " << group;
      EXPECT_GE(b.per_block * b.blocks, rows) << rows << " " << group;
      EXPECT_LT(b.per_block * (b.blocks - 1), rows) << rows << " " << group;
    }
  }
}

TEST(SmallRows, ScopeSetsAndRestoresTheSwitch) {
  EXPECT_FALSE(ops::small_row_kernels_enabled());
  {
    const ops::SmallRowKernelsScope on(true);
    EXPECT_TRUE(ops::small_row_kernels_enabled());
    {
      const ops::SmallRowKernelsScope off(false);
      EXPECT_FALSE(ops::small_row_kernels_enabled());
    }
    EXPECT_TRUE(ops::small_row_kernels_enabled());
  }
  EXPECT_FALSE(ops::small_row_kernels_enabled());
}

void expect_same_bits(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.nbytes(), b.nbytes()) << what;
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.nbytes()), 0) << what;
}

TEST(SmallRows, HostTensorsIgnoreTheSwitch) {
  const Tensor x = random_tensor({33, 256}, 1), w = random_tensor({256}, 2), dy = random_tensor({33, 256}, 3);
  const Tensor logits = random_tensor({21, 512}, 4);
  Tensor targets = Tensor::empty({21}, DType::i32);
  for (int64_t i = 0; i < 21; ++i) targets.data_as<int32_t>()[i] = i == 5 ? -1 : static_cast<int32_t>(i * 37 % 512);
  const auto run = [&] {
    Tensor y = Tensor::empty({33, 256}, DType::f32), dx = Tensor::empty({33, 256}, DType::f32);
    Tensor dw = Tensor::zeros({256}, DType::f32);
    ops::rms_norm(y, x, w, {1e-6f});
    ops::rms_norm_backward(dx, dw, dy, x, w, {1e-6f});
    Tensor g = clone(logits), loss = Tensor::empty({21}, DType::f32);
    ops::cross_entropy_with_grad(g, loss, targets, 0.5f);
    return std::vector<Tensor>{std::move(y), std::move(dx), std::move(dw), std::move(g), std::move(loss)};
  };
  const std::vector<Tensor> plain = run();
  const ops::SmallRowKernelsScope on(true);
  const std::vector<Tensor> switched = run();
  const char* names[] = {"rms_norm", "dx", "d_weight", "gradient", "row loss"};
  for (size_t i = 0; i < plain.size(); ++i) expect_same_bits(switched[i], plain[i], names[i]);
}

}  // namespace
}  // namespace hydra::test
