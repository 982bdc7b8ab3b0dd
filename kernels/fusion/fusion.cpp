// The head-fusion ops' entry points and names: shape checks, then the CUDA kernels (tensors on the
// GPU, fusion.cu) or the CPU reference (host tensors, fusion_reference.cpp).
#include "kernels/fusion/fusion.h"

#include <fmt/format.h>

#include "kernels/common.h"
#include "kernels/fusion/fusion_reference.h"

namespace hydra::ops {

const char* fusion_name(Fusion fusion) {
  switch (fusion) {
    case Fusion::scale_norm: return "scale_norm";
    case Fusion::norm: return "norm";
    case Fusion::scale: return "scale";
    case Fusion::concat: return "concat";
    case Fusion::gate: return "gate";
  }
  return "?";
}

Fusion fusion_from_name(const std::string& name, const std::string& what) {
  for (Fusion f : kFusions) {
    if (name == fusion_name(f)) return f;
  }
  HYDRA_USER_FAIL("{}: unknown fusion '{}' (expected scale_norm, norm, scale, concat or gate)", what, name);
}

namespace {

// The variant's tensors are exactly those it has, with their shapes; `like_o` are [T, H, d] too.
void check_shapes(const TensorView& o, const FusionTensors& p, const HeadFusionParams& params,
                  std::initializer_list<Named> like_o) {
  expect_shape(o, "fusion o", {{"T", -1}, {"H", -1}, {"d", -1}});
  const int64_t t_len = o.size(0), heads = o.size(1), d = o.size(2);
  const Fusion f = params.fusion;
  HYDRA_ASSERT(p.weight.defined() == fusion_has_norm(f) && p.gamma.defined() == fusion_has_gamma(f) &&
                   p.gate.defined() == fusion_has_gate(f) && p.gate_bias.defined() == fusion_has_gate(f),
               "fusion {}: weight {}, gamma {}, gate {}, gate bias {} given", fusion_name(f), p.weight.defined(),
               p.gamma.defined(), p.gate.defined(), p.gate_bias.defined());
  if (p.weight.defined()) expect_shape(p.weight, "fusion weight", {{"H", heads}, {"d", d}});
  if (p.gamma.defined()) expect_shape(p.gamma, "fusion gamma", {{"H", heads}});
  if (p.gate.defined()) expect_shape(p.gate, "fusion gate", {{"T", t_len}, {"H", heads}});
  if (p.gate_bias.defined()) expect_shape(p.gate_bias, "fusion gate bias", {{"H", heads}});
  for (const Named& v : like_o) expect_shape(v.view, v.what, {{"T", t_len}, {"H", heads}, {"d", d}});
}

// Gradients of a variant's tensors are defined only where it has them.
void check_gradients(const TensorView& o, const FusionTensors& g, const HeadFusionParams& params) {
  const Fusion f = params.fusion;
  HYDRA_ASSERT((!g.weight.defined() || fusion_has_norm(f)) && (!g.gamma.defined() || fusion_has_gamma(f)) &&
                   (!g.gate.defined() || fusion_has_gate(f)) && (!g.gate_bias.defined() || fusion_has_gate(f)),
               "fusion {}: a gradient of a tensor the variant does not have", fusion_name(f));
  if (g.weight.defined()) expect_shape(g.weight, "fusion d_weight", {{"H", o.size(1)}, {"d", o.size(2)}});
  if (g.gamma.defined()) expect_shape(g.gamma, "fusion d_gamma", {{"H", o.size(1)}});
  if (g.gate.defined()) expect_shape(g.gate, "fusion d_gate", {{"T", o.size(0)}, {"H", o.size(1)}});
  if (g.gate_bias.defined()) expect_shape(g.gate_bias, "fusion d_gate_bias", {{"H", o.size(1)}});
}

}  // namespace

void head_fusion(const TensorView& y, const TensorView& o, const FusionTensors& p, const HeadFusionParams& params) {
  check_shapes(o, p, params, {{y, "fusion y"}});
  if (shapes_only({y, o, p.weight, p.gamma, p.gate, p.gate_bias})) return;
  if (on_cuda({y, o, p.weight, p.gamma, p.gate, p.gate_bias})) {
#if HYDRA_CUDA
    cuda_impl::head_fusion(y, o, p, params);
    return;
#endif
  }
  reference::head_fusion(y, o, p, params);
}

void head_fusion_backward(const TensorView& d_o, const FusionTensors& grads, const TensorView& d_y,
                          const TensorView& o, const FusionTensors& p, const HeadFusionParams& params) {
  check_shapes(o, p, params, {{d_o, "fusion d_o"}, {d_y, "fusion d_y"}});
  check_gradients(o, grads, params);
  const bool meta = shapes_only({d_o, grads.weight, grads.gamma, grads.gate, grads.gate_bias, d_y, o, p.weight,
                                 p.gamma, p.gate, p.gate_bias});
  if (on_cuda({d_o, grads.weight, grads.gamma, grads.gate, grads.gate_bias, d_y, o, p.weight, p.gamma, p.gate,
               p.gate_bias})) {
    if (meta) {  // fusion.cu's row scalars
      const BufferSpec scratch = head_fusion_backward_scratch(o.size(0), o.size(1), params.fusion);
      if (scratch.exists()) scratch.empty(Device::cuda, {MemoryPart::workspaces, "fusion row scalars"});
      return;
    }
#if HYDRA_CUDA
    cuda_impl::head_fusion_backward(d_o, grads, d_y, o, p, params);
    return;
#endif
  }
  if (meta) return;
  reference::head_fusion_backward(d_o, grads, d_y, o, p, params);
}

}  // namespace hydra::ops
