// The decode GEMV's entry point and support test: shape checks, then the CUDA kernel (tensors on the
// GPU, gemv.cu) or the CPU reference (host tensors, gemv_reference.cpp).
#include "kernels/gemv/gemv.h"

#include <sstream>

#include <fmt/format.h>

#include "kernels/common.h"
#include "kernels/gemv/gemv_reference.h"
#include "kernels/rmsnorm/rms_vector.h"

namespace hydra::ops {
namespace {

void expect_gemv_shapes(const TensorView& out, const TensorView& x, const TensorView& w) {
  expect_shape(x, "gemv x", {{"M", -1}, {"K", -1}});
  expect_shape(w, "gemv w", {{"N", -1}, {"K", x.size(1)}});
  expect_shape(out, "gemv out", {{"M", x.size(0)}, {"N", w.size(0)}});
  for (const TensorView* v : {&out, &x, &w}) {
    HYDRA_ASSERT(v->stride(1) == 1, "gemv views need a unit column stride, got {}", v->shape_string());
  }
  HYDRA_ASSERT(x.size(0) >= 1 && x.size(0) <= kGemvMaxRows, "gemv takes 1 to {} rows, got {}", kGemvMaxRows,
               x.size(0));
}

bool row_starts_aligned_16(const TensorView& v) {
  return reinterpret_cast<uintptr_t>(v.data()) % 16 == 0 && v.stride(0) % 8 == 0;
}

}  // namespace

const char* decode_gemv_kernel_name(DecodeGemvKernel kernel) {
  switch (kernel) {
    case DecodeGemvKernel::cublas: return "cublas";
    case DecodeGemvKernel::hydra: return "hydra";
    case DecodeGemvKernel::hydra_norm: return "hydra-norm";
  }
  return "?";
}

const char* gemv_prefetch_name(GemvPrefetch prefetch) {
  return prefetch == GemvPrefetch::tile ? "tile" : "first-slices";
}

GemvTuning parse_gemv_tuning(const std::string& text) {
  GemvTuning t;
  if (text.empty() || text == "default") return t;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq), value = eq == std::string::npos ? "" : item.substr(eq + 1);
    if (key == "warps" && (value == "0" || value == "4" || value == "8" || value == "16")) {
      t.warps = std::stoi(value);
    } else if (key == "ahead" && (value == "4" || value == "8")) {
      t.ahead = std::stoi(value);
    } else if (key == "prefetch" && (value == "first-slices" || value == "tile")) {
      t.prefetch = value == "tile" ? GemvPrefetch::tile : GemvPrefetch::first_slices;
    } else {
      HYDRA_USER_FAIL("GEMV tuning '{}': '{}' is not warps=0|4|8|16, ahead=4|8 or prefetch=first-slices|tile", text, item);
    }
  }
  return t;
}

std::string gemv_tuning_name(const GemvTuning& t) {
  return fmt::format("warps={},ahead={},prefetch={}", t.warps, t.ahead, gemv_prefetch_name(t.prefetch));
}

bool gemv_supported(const TensorView& out, const TensorView& x, const TensorView& w) {
  if (out.rank() != 2 || x.rank() != 2 || w.rank() != 2) return false;
  const int64_t m = x.size(0), k = x.size(1), n = w.size(0);
  if (m < 1 || m > kGemvMaxRows || n < 1 || k < 1 || w.size(1) != k || out.size(0) != m || out.size(1) != n) return false;
  if (out.stride(1) != 1 || x.stride(1) != 1 || w.stride(1) != 1) return false;
  if (out.device() != x.device() || w.device() != x.device()) return false;
  if (x.device() != Device::cuda) return true;  // the reference takes any layout
  if (out.dtype() != DType::bf16 || x.dtype() != DType::bf16 || w.dtype() != DType::bf16) return false;
  // A shape-only run (memory plan) has no addresses to check; the GEMV allocates nothing either way.
  if (out.is_meta() || x.is_meta() || w.is_meta()) return x.stride(0) % 8 == 0 && w.stride(0) % 8 == 0;
  return row_starts_aligned_16(x) && row_starts_aligned_16(w);
}

void gemv(const TensorView& out, const TensorView& x, const TensorView& w, Accumulate accumulate,
          const GemvTuning& tuning) {
  expect_gemv_shapes(out, x, w);
  if (shapes_only({out, x, w})) return;
  if (on_cuda({out, x, w})) {
#if HYDRA_CUDA
    cuda_impl::gemv(out, x, w, accumulate, nullptr, tuning);
    return;
#endif
  }
  reference::gemv(out, x, w, accumulate);
}

bool gemv_rms_norm_supported(const TensorView& x, const TensorView& gamma, const TensorView& w) {
  if (x.rank() != 2 || w.rank() != 2 || gamma.rank() != 1) return false;
  const int64_t m = x.size(0), k = x.size(1);
  if (m < 1 || m > kGemvMaxRows || k < 1 || w.size(0) < 1 || w.size(1) != k || gamma.size(0) != k) return false;
  if (x.stride(1) != 1 || w.stride(1) != 1 || gamma.stride(0) != 1) return false;
  if (w.device() != x.device() || gamma.device() != x.device()) return false;
  if (x.device() != Device::cuda) return true;  // the reference: rms_norm, then gemv
  if (x.dtype() != DType::bf16 || w.dtype() != DType::bf16 || gamma.dtype() != DType::f32) return false;
  if (rms_vector::vector_shape(k).group == 0) return false;
  if (x.is_meta() || w.is_meta() || gamma.is_meta()) return x.stride(0) % 8 == 0 && w.stride(0) % 8 == 0;
  return row_starts_aligned_16(x) && row_starts_aligned_16(w) && reinterpret_cast<uintptr_t>(gamma.data()) % 16 == 0;
}

void gemv_rms_norm(const TensorView& out, const TensorView& x, const GemvInputNorm& norm, const TensorView& w,
                   const GemvTuning& tuning) {
  expect_gemv_shapes(out, x, w);
  expect_shape(norm.gamma, "gemv_rms_norm gamma", {{"K", x.size(1)}});
  if (shapes_only({out, x, w, norm.gamma})) return;
  if (on_cuda({out, x, w, norm.gamma})) {
#if HYDRA_CUDA
    cuda_impl::gemv(out, x, w, Accumulate::no, &norm, tuning);
    return;
#endif
  }
  // The definition: the norm's rows in x's dtype, then the GEMV.
  Tensor normed = Tensor::empty(x.shape(), x.dtype(), x.device(), "gemv_rms_norm normed rows");
  rms_norm(normed, x, norm.gamma, norm.params);
  gemv(out, normed, w);
}

}  // namespace hydra::ops
