// Dispatcher of the GDN branch's decode step (gdn_decode.h): the three ops in order (the CPU
// reference, and the GPU's separate kernels), or the GPU's fused kernel.
#include "kernels/gdn_decode/gdn_decode.h"

#include <cmath>

#include "kernels/common.h"
#include "kernels/delta_rule/delta_rule_step.h"
#include "kernels/gdn_gates/gdn_gates.h"
#include "kernels/gdn_qk/gdn_qk_step.h"

namespace hydra::ops {

const char* gdn_decode_kernel_name(GdnDecodeKernel kernel) {
  switch (kernel) {
    case GdnDecodeKernel::separate: return "separate";
    case GdnDecodeKernel::fused: return "fused";
  }
  return "?";
}

void gdn_decode_step(const GdnDecodeTensors& t, const GdnQkParams& qk, const DeltaRuleParams& rule) {
  expect_shape(t.state, "GDN decode state", {{"S", -1}, {"H", -1}, {"d", -1}, {"d", -1}});
  const int64_t heads = t.state.size(1), d = t.state.size(2);
  HYDRA_ASSERT(t.state.size(3) == d, "GDN decode: the state's key and value dimensions differ ({} and {})", d,
               t.state.size(3));
  HYDRA_ASSERT(qk.qk_heads == 2 * heads && qk.head_dim == d, "GDN decode: {} q/k heads of {} for {} GDN heads of {}",
               qk.qk_heads, qk.head_dim, heads, d);
  expect_shape(t.x, "GDN decode x", {{"B", -1}, {"C", 3 * heads * d}});
  const int64_t rows = t.x.size(0);
  expect_shape(t.conv_out, "GDN decode conv out", {{"B", rows}, {"C", 3 * heads * d}});
  expect_shape(t.out, "GDN decode out", {{"B", rows}, {"H", heads}, {"d", d}});
  if (rule.decode_kernel == GdnDecodeKernel::fused &&
      on_cuda({t.out, t.conv_out, t.inv_norm, t.beta, t.g, t.state, t.tail, t.slots, t.positions, t.x, t.conv_w,
               t.b_logits, t.a_logits, t.a_log, t.dt_bias})) {
#if HYDRA_CUDA
    // The shapes the fused launcher relies on (gdn_decode.cu checks dtypes and layouts), then one launch.
    expect_shape(t.inv_norm, "GDN decode inv_norm", {{"B", rows}, {"qk heads", 2 * heads}});
    expect_shape(t.beta, "GDN decode beta", {{"B", rows}, {"H", heads}});
    expect_shape(t.g, "GDN decode g", {{"B", rows}, {"H", heads}});
    expect_shape(t.b_logits, "GDN decode b logits", {{"B", rows}, {"H", heads}});
    expect_shape(t.a_logits, "GDN decode a logits", {{"B", rows}, {"H", heads}});
    expect_shape(t.a_log, "GDN decode A_log", {{"H", heads}});
    expect_shape(t.dt_bias, "GDN decode dt_bias", {{"H", heads}});
    expect_shape(t.positions, "GDN decode positions", {{"B", rows}});
    if (t.slots.defined()) expect_shape(t.slots, "GDN decode slots", {{"B", rows}});
    const double scale = rule.scale > 0 ? rule.scale : 1.0 / std::sqrt(static_cast<double>(d));
    if (rows == 0) return;
    cuda_impl::gdn_decode_fused(t, qk, static_cast<float>(scale));
    return;
#endif
  }
  gdn_qkv_conv_step(t.conv_out, t.inv_norm, t.x, t.conv_w, t.tail, t.slots, t.positions, qk);
  gdn_gates(t.beta, t.g, t.b_logits, t.a_logits, t.a_log, t.dt_bias);
  const auto heads_at = [&](int64_t first) { return t.conv_out.narrow(1, first * d, heads * d).split_dim(1, heads, d); };
  delta_rule_step(t.out, t.state, t.slots, heads_at(0), heads_at(heads), heads_at(2 * heads), t.g, t.beta, rule);
}

}  // namespace hydra::ops
