// The GEMV's CPU reference (kernels/gemv/gemv_reference.cpp) against OpenBLAS's ops::linear on the same host
// views (column blocks of wider buffers, accumulation, every row count it takes), and the rules
// gemv_supported applies to GPU views (checked on views of made-up device addresses: nothing is
// read). Tolerance 1e-5: fp32 sums (OpenBLAS) against float64 (the reference) over K ≤ 300.
#include <fmt/format.h>

#include "kernels/gemv/gemv.h"
#include "kernels/matmul/matmul.h"
#include "runtime/error.h"
#include "tests/common/test_util.h"

namespace hydra::test {
namespace {

TEST(Gemv, ReferenceEqualsLinearForEveryRowCount) {
  for (int64_t m = 1; m <= ops::kGemvMaxRows; ++m) {
    for (const auto& [n, k] : {std::pair<int64_t, int64_t>{1, 1}, {37, 300}, {64, 33}}) {
      Tensor xbuf = random_tensor({m, k + 3}, 1), wbuf = random_tensor({n, k + 5}, 2), obuf = random_tensor({m, n + 2}, 3);
      const TensorView x = xbuf.view().narrow(1, 3, k), w = wbuf.view().narrow(1, 1, k);
      for (const ops::Accumulate acc : {ops::Accumulate::no, ops::Accumulate::yes}) {
        Tensor want_buf = clone(obuf), got_buf = clone(obuf);
        const TensorView want = want_buf.view().narrow(1, 2, n), got = got_buf.view().narrow(1, 2, n);
        ops::linear(want, x, w, acc);
        ops::gemv(got, x, w, acc);
        const std::string what = fmt::format("gemv m={} n={} k={} accumulate={}", m, n, k, acc == ops::Accumulate::yes);
        expect_close(clone(got), clone(want), 1e-5, what);
        expect_close(got_buf.view().narrow(1, 0, 2), obuf.view().narrow(1, 0, 2), 0.0, what + ": columns left of the block");
      }
    }
  }
}

TEST(Gemv, RefusesMoreRowsThanItTakes) {
  const Tensor x = random_tensor({ops::kGemvMaxRows + 1, 8}, 4), w = random_tensor({4, 8}, 5);
  Tensor out = Tensor::empty({ops::kGemvMaxRows + 1, 4}, DType::f32);
  EXPECT_FALSE(ops::gemv_supported(out, x, w));
  try {
    ops::gemv(out, x, w);
    ADD_FAILURE() << "9 rows were taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gemv takes 1 to 8 rows, got 9"), std::string::npos) << e.what();
  }
}

// GPU views: bf16 everywhere, at most 8 rows, x and w rows starting 16-byte aligned (the kernel's
// 16-byte copies); K and N need no alignment (a row stride that is a multiple of 8 elements may hold
// any width), and out's row stride is free (2-byte stores).
TEST(Gemv, SupportsTheGpuViewsItsKernelTakes) {
  const auto device = [](uintptr_t address, DType dtype, std::vector<int64_t> shape, std::vector<int64_t> strides) {
    return TensorView(reinterpret_cast<void*>(address), dtype, Device::cuda, shape, strides);
  };
  const uintptr_t base = uintptr_t{1} << 20;  // 16-byte aligned
  const int64_t m = 8, n = 6144 + 3, k = 2048 + 5, ldk = 2048 + 8;
  const TensorView x = device(base, DType::bf16, {m, k}, {ldk, 1}), w = device(base, DType::bf16, {n, k}, {ldk, 1});
  const TensorView out = device(base, DType::bf16, {m, n}, {n + 1, 1});
  EXPECT_TRUE(ops::gemv_supported(out, x, w)) << "odd K and N with aligned row starts";
  EXPECT_FALSE(ops::gemv_supported(out, device(base + 2, DType::bf16, {m, k}, {ldk, 1}), w)) << "x's start off 16 bytes";
  EXPECT_FALSE(ops::gemv_supported(out, x, device(base, DType::bf16, {n, k}, {k, 1}))) << "w's rows off 16 bytes (odd stride)";
  EXPECT_FALSE(ops::gemv_supported(device(base, DType::f32, {m, n}, {n, 1}), x, w)) << "fp32 output";
  EXPECT_FALSE(ops::gemv_supported(out, x, device(base, DType::bf16, {n, k}, {1, n}))) << "a transposed w";
  const TensorView x9 = device(base, DType::bf16, {9, k}, {ldk, 1}), out9 = device(base, DType::bf16, {9, n}, {n, 1});
  EXPECT_FALSE(ops::gemv_supported(out9, x9, w)) << "9 rows";
  EXPECT_FALSE(ops::gemv_supported(out, x, device(base, DType::bf16, {n, k - 1}, {ldk, 1}))) << "mismatched K";
}

}  // namespace
}  // namespace hydra::test
