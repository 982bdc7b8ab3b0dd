// The GDN gates' entry points: shape checks, then the CUDA kernels (tensors on the GPU, gdn_gates.cu)
// or the CPU reference (host tensors, gdn_gates_reference.cpp).
#include "kernels/gdn_gates/gdn_gates.h"

#include "kernels/common.h"
#include "kernels/gdn_gates/gdn_gates_reference.h"

namespace hydra::ops {
namespace {

void check_shapes(const TensorView& b_logits, const TensorView& a_logits, const TensorView& a_log,
                  const TensorView& dt_bias, std::initializer_list<Named> per_token) {
  expect_shape(b_logits, "gdn b logits", {{"T", -1}, {"H", -1}});
  const int64_t t_len = b_logits.size(0), heads = b_logits.size(1);
  expect_shape(a_logits, "gdn a logits", {{"T", t_len}, {"H", heads}});
  expect_shape(a_log, "gdn A_log", {{"H", heads}});
  expect_shape(dt_bias, "gdn dt_bias", {{"H", heads}});
  for (const Named& v : per_token) expect_shape(v.view, v.what, {{"T", t_len}, {"H", heads}});
}

}  // namespace

void gdn_gates(const TensorView& beta, const TensorView& g, const TensorView& b_logits, const TensorView& a_logits,
               const TensorView& a_log, const TensorView& dt_bias) {
  check_shapes(b_logits, a_logits, a_log, dt_bias, {{beta, "gdn beta"}, {g, "gdn g"}});
  if (shapes_only({beta, g, b_logits, a_logits, a_log, dt_bias})) return;
  if (on_cuda({beta, g, b_logits, a_logits, a_log, dt_bias})) {
#if HYDRA_CUDA
    cuda_impl::gdn_gates(beta, g, b_logits, a_logits, a_log, dt_bias);
    return;
#endif
  }
  reference::gdn_gates(beta, g, b_logits, a_logits, a_log, dt_bias);
}

void gdn_gates_backward(const TensorView& d_b_logits, const TensorView& d_a_logits, const TensorView& d_a_log,
                        const TensorView& d_dt_bias, const TensorView& d_beta, const TensorView& d_g,
                        const TensorView& b_logits, const TensorView& a_logits, const TensorView& a_log,
                        const TensorView& dt_bias) {
  check_shapes(b_logits, a_logits, a_log, dt_bias,
               {{d_b_logits, "gdn d_b_logits"}, {d_a_logits, "gdn d_a_logits"}, {d_beta, "gdn d_beta"}, {d_g, "gdn d_g"}});
  if (d_a_log.defined()) expect_shape(d_a_log, "gdn d_A_log", {{"H", b_logits.size(1)}});
  if (d_dt_bias.defined()) expect_shape(d_dt_bias, "gdn d_dt_bias", {{"H", b_logits.size(1)}});
  if (shapes_only({d_b_logits, d_a_logits, d_a_log, d_dt_bias, d_beta, d_g, b_logits, a_logits, a_log, dt_bias})) return;
  if (on_cuda({d_b_logits, d_a_logits, d_a_log, d_dt_bias, d_beta, d_g, b_logits, a_logits, a_log, dt_bias})) {
#if HYDRA_CUDA
    cuda_impl::gdn_gates_backward(d_b_logits, d_a_logits, d_a_log, d_dt_bias, d_beta, d_g, b_logits, a_logits, a_log,
                                  dt_bias);
    return;
#endif
  }
  reference::gdn_gates_backward(d_b_logits, d_a_logits, d_a_log, d_dt_bias, d_beta, d_g, b_logits, a_logits, a_log,
                                dt_bias);
}

}  // namespace hydra::ops
