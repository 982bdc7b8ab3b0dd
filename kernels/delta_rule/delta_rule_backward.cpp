// The gated delta rule's backward entry points: shape checks, then the CUDA kernels (tensors on the
// GPU, delta_rule_backward*.cu; on a meta run, the workspaces they hold) or the CPU reference (host
// tensors, delta_rule_backward_reference.cpp).
#include "kernels/common.h"
#include "kernels/delta_rule/delta_rule.h"
#include "kernels/delta_rule/delta_rule_cpu.h"
#include "kernels/delta_rule/delta_rule_reference.h"

namespace hydra::ops {

void delta_rule_chunked_backward(const TensorView& dq, const TensorView& dk, const TensorView& dv,
                                 const TensorView& dg, const TensorView& dbeta, const TensorView& d_state,
                                 const TensorView& d_out, const TensorView& q, const TensorView& k,
                                 const TensorView& v, const TensorView& g, const TensorView& beta,
                                 const TensorView& state0, const DeltaRuleParams& params) {
  const delta_cpu::Dims d = delta_cpu::check_shapes(&d_out, &state0, &q, k, v, g, beta);
  expect_shape(dq, "delta rule dq", {{"T", d.t}, {"H", d.h}, {"dk", d.dk}});
  expect_shape(dk, "delta rule dk", {{"T", d.t}, {"H", d.h}, {"dk", d.dk}});
  expect_shape(dv, "delta rule dv", {{"T", d.t}, {"H", d.h}, {"dv", d.dv}});
  expect_shape(dg, "delta rule dg", {{"T", d.t}, {"H", d.h}});
  expect_shape(dbeta, "delta rule dbeta", {{"T", d.t}, {"H", d.h}});
  expect_shape(d_state, "delta rule d_state", {{"H", d.h}, {"dk", d.dk}, {"dv", d.dv}});
  if (on_cuda({dq, dk, dv, dg, dbeta, d_state, d_out, q, k, v, g, beta, state0})) {
    if (shapes_only({dq, dk, dv, dg, dbeta, d_state, d_out, q, k, v, g, beta, state0})) {
      // What delta_rule_backward.cu's chunked backward holds, in its order: the prepared chunks (one
      // block), the state and the chunk states and v_new it recomputes, and their gradients.
      const std::shared_ptr<void> prepared = allocate_storage(
          static_cast<size_t>(delta_rule_prepare_buffers(d.t, d.h, d.dk, true, true).bytes()), Device::cuda,
          {MemoryPart::workspaces, "GDN backward workspace"});
      const DeltaRuleBackwardBuffers spec = delta_rule_backward_buffers(d.t, d.h, d.dk);
      const Tensor state = clone(state0, {MemoryPart::workspaces, "GDN state"});
      const Tensor states = spec.states.empty(Device::cuda, {MemoryPart::workspaces, "GDN chunk states"});
      const Tensor vnew = spec.v_new.empty(Device::cuda, {MemoryPart::workspaces, "GDN v_new"});
      const Tensor dstate = clone(d_state, {MemoryPart::workspaces, "GDN state gradient"});
      const Tensor dstates = spec.states.empty(Device::cuda, {MemoryPart::workspaces, "GDN chunk state gradients"});
      const Tensor dvnew = spec.v_new.empty(Device::cuda, {MemoryPart::workspaces, "GDN v_new gradient"});
      return;
    }
#if HYDRA_CUDA
    cuda_impl::delta_rule_chunked_backward(dq, dk, dv, dg, dbeta, d_state, d_out, q, k, v, g, beta, state0, params);
    return;
#endif
  }
  HYDRA_ASSERT(params.chunk >= 1, "chunk size {}", params.chunk);
  if (shapes_only({dq, dk, dv, dg, dbeta, d_state, d_out, q, k, v, g, beta, state0})) return;  // vectors on the CPU
  reference::delta_rule_chunked_backward(dq, dk, dv, dg, dbeta, d_state, d_out, q, k, v, g, beta, state0, params);
}

void delta_rule_state_backward(const TensorView& d_state, const TensorView& d_out, const TensorView& q,
                               const TensorView& k, const TensorView& g, const TensorView& beta,
                               const DeltaRuleParams& params) {
  const delta_cpu::Dims d = delta_cpu::check_shapes(&d_out, &d_state, &q, k, TensorView(), g, beta);
  if (on_cuda({d_state, d_out, q, k, g, beta})) {
    if (shapes_only({d_state, d_out, q, k, g, beta})) {  // delta_rule_backward.cu: the prepared chunks, a state copy
      const std::shared_ptr<void> prepared = allocate_storage(
          static_cast<size_t>(delta_rule_prepare_buffers(d.t, d.h, d.dk, true, true).bytes()), Device::cuda,
          {MemoryPart::workspaces, "GDN state backward workspace"});
      const Tensor dstate = clone(d_state, {MemoryPart::workspaces, "GDN state gradient copy"});
      return;
    }
#if HYDRA_CUDA
    cuda_impl::delta_rule_state_backward(d_state, d_out, q, k, g, beta, params);
    return;
#endif
  }
  HYDRA_ASSERT(params.chunk >= 1, "chunk size {}", params.chunk);
  if (shapes_only({d_state, d_out, q, k, g, beta})) return;
  reference::delta_rule_state_backward(d_state, d_out, q, k, g, beta, params);
}

void delta_rule_apply_map_transposed(const TensorView& d_state, const TensorView& m, const TensorView& d_loc) {
  expect_shape(d_state, "d_state", {{"H", -1}, {"dk", -1}, {"dv", -1}});
  const int64_t h = d_state.size(0), dk = d_state.size(1), dv = d_state.size(2);
  expect_shape(m, "map m", {{"H", h}, {"dk", dk}, {"dk", dk}});
  expect_shape(d_loc, "d_loc", {{"H", h}, {"dk", dk}, {"dv", dv}});
  if (shapes_only({d_state, m, d_loc})) return;
  if (on_cuda({d_state, m, d_loc})) {
#if HYDRA_CUDA
    cuda_impl::delta_rule_apply_map_transposed(d_state, m, d_loc);
    return;
#endif
  }
  reference::delta_rule_apply_map_transposed(d_state, m, d_loc);
}

}  // namespace hydra::ops
