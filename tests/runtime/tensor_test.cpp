// Tensor views: strides, narrow/select/split, copies with conversion, bf16 rounding.
#include <cmath>
#include <limits>

#include "runtime/sizes.h"
#include "tests/common/test_util.h"

namespace hydra::test {
namespace {

TEST(TensorView, NarrowSelectSplitAddressTheRightElements) {
  Tensor t = Tensor::empty({4, 6, 5}, DType::f32);
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = static_cast<float>(i);
  const TensorView n = t.view().narrow(1, 2, 3);  // [4, 3, 5]
  EXPECT_EQ(*static_cast<float*>(n.element_ptr({1, 0, 2})), 1 * 30 + 2 * 5 + 2);
  const TensorView s = t.view().select(0, 3);  // [6, 5]
  EXPECT_EQ(s.rank(), 2);
  EXPECT_EQ(*static_cast<float*>(s.element_ptr({5, 4})), 3 * 30 + 5 * 5 + 4);
  const TensorView m = t.view().reshape({4, 30}).narrow(1, 10, 15).split_dim(1, 3, 5);  // [4, 3, 5]
  EXPECT_EQ(*static_cast<float*>(m.element_ptr({2, 1, 3})), 2 * 30 + 10 + 1 * 5 + 3);
  EXPECT_FALSE(m.is_contiguous());
  EXPECT_TRUE(t.view().is_contiguous());
  EXPECT_EQ(t.view().reshape({-1, 5}).size(0), 24);
}

TEST(TensorView, StridedCopyAndConversionRoundTrip) {
  Tensor src = random_tensor({7, 9}, 1);
  const TensorView block = src.view().narrow(1, 2, 4);
  Tensor bf = to(block, Device::host, DType::bf16);
  Tensor back = to(bf, Device::host, DType::f32);
  for (int64_t i = 0; i < 7; ++i)
    for (int64_t j = 0; j < 4; ++j) {
      const float x = src.data_as<float>()[i * 9 + 2 + j];
      EXPECT_EQ(back.data_as<float>()[i * 4 + j], round_to_bf16(x));
      EXPECT_LE(std::abs(back.data_as<float>()[i * 4 + j] - x), std::abs(x) * (1.0f / 256));
    }
}

TEST(Bf16, RoundsToNearestEvenAndKeepsSpecials) {
  EXPECT_EQ(float_to_bf16(1.0f).bits, 0x3f80);
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x3f808000u)).bits, 0x3f80);  // tie -> even
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x3f818000u)).bits, 0x3f82);  // tie -> even (up)
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x3f808001u)).bits, 0x3f81);  // above tie -> up
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isinf(bf16_to_float(float_to_bf16(std::numeric_limits<float>::infinity()))));
}

TEST(Fill, WritesStridedViewsOnly) {
  Tensor t = Tensor::zeros({3, 4}, DType::f32);
  fill(t.view().narrow(1, 1, 2), 2.5f);
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 4; ++j) EXPECT_EQ(t.data_as<float>()[i * 4 + j], (j == 1 || j == 2) ? 2.5f : 0.0f);
}

TEST(Sizes, ParsesSuffixesAndRejectsGarbage) {
  EXPECT_EQ(parse_size("4096", "x"), 4096);
  EXPECT_EQ(parse_size("128K", "x"), 131072);
  EXPECT_EQ(parse_size("512k", "x"), 524288);
  EXPECT_EQ(parse_size("1M", "x"), 1048576);
  EXPECT_EQ(parse_size_list("4K, 16K,1M", "x"), (std::vector<int64_t>{4096, 16384, 1048576}));
  EXPECT_EQ(format_size(524288), "512K");
  EXPECT_EQ(format_size(1000), "1000");
  for (const char* bad : {"", "K", "12Q", "1.5M", "-3", "4KK"}) {
    EXPECT_THROW(parse_size(bad, "--seq-len"), UserError) << bad;
  }
  EXPECT_EQ(parse_int_list("0,10,100", "x"), (std::vector<int64_t>{0, 10, 100}));
  EXPECT_THROW(parse_int_list("1,,2", "x"), UserError);
}

}  // namespace
}  // namespace hydra::test
