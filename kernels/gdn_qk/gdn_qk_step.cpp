// Dispatcher and CPU reference of the decode-step GDN input pass (gdn_qk_step.h).
#include "kernels/gdn_qk/gdn_qk_step.h"

#include "kernels/common.h"

namespace hydra::ops {

void gdn_qkv_conv_step(const TensorView& out, const TensorView& inv_norm, const TensorView& x, const TensorView& w,
                       const TensorView& tail, const TensorView& slots, const TensorView& positions,
                       const GdnQkParams& params) {
  expect_shape(x, "conv step x", {{"B", -1}, {"C", -1}});
  const int64_t rows = x.size(0), channels = x.size(1);
  expect_shape(out, "conv step out", {{"B", rows}, {"C", channels}});
  expect_shape(inv_norm, "conv step inv_norm", {{"B", rows}, {"H_qk", params.qk_heads}});
  expect_shape(w, "conv step weight", {{"C", channels}, {"K", -1}});
  const int64_t halo = w.size(1) - 1;
  HYDRA_ASSERT(halo == 0 || tail.defined(), "conv step: a kernel of {} taps needs the tail cache", halo + 1);
  if (tail.defined()) expect_shape(tail, "conv step tail", {{"S", -1}, {"K-1", halo}, {"C", channels}});
  if (slots.defined()) {
    expect_shape(slots, "conv step slots", {{"B", rows}});
    expect_dtype(slots, "conv step slots", DType::i32);
  }
  expect_shape(positions, "conv step positions", {{"B", rows}});
  expect_dtype(positions, "conv step positions", DType::i64);
  if (shapes_only({out, inv_norm, x, w, tail, slots, positions})) return;
  if (on_cuda({out, inv_norm, x, w, tail, slots, positions})) {
#if HYDRA_CUDA
    cuda_impl::gdn_qkv_conv_step(out, inv_norm, x, w, tail, slots, positions, params);
    return;
#endif
  }
  for (int64_t b = 0; b < rows; ++b) {
    const int64_t slot = slots.defined() ? *static_cast<const int32_t*>(slots.element_ptr({b})) : b;
    const TensorView prefix = halo > 0 ? tail.select(0, slot) : TensorView();  // [K−1, C]
    HYDRA_ASSERT(halo == 0 || (slot >= 0 && slot < tail.size(0)), "conv step: row {} maps to slot {} of {}", b, slot,
                 tail.size(0));
    gdn_qkv_conv(out.narrow(0, b, 1), inv_norm.narrow(0, b, 1), x.narrow(0, b, 1), w, prefix, positions.narrow(0, b, 1),
                 params);
    for (int64_t r = 0; r + 1 < halo; ++r) copy_into(prefix.select(0, r), prefix.select(0, r + 1));
    if (halo > 0) copy_into(prefix.select(0, halo - 1), x.select(0, b));
  }
}

}  // namespace hydra::ops
