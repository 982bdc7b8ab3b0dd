// The attention ops' entry points: shape checks, then the CUDA kernels (tensors on the GPU,
// kernels/attention/attention*.cu) or the CPU reference (host tensors, attention_reference.cpp).
#include "kernels/attention/attention.h"

#include "kernels/attention/attention_reference.h"
#include "kernels/common.h"

namespace hydra::ops {
namespace {

void check_shapes(const TensorView& out, const TensorView& lse, const TensorView& q, const TensorView& k,
                  const TensorView& v, const AttentionParams& p) {
  if (p.q_document_start.defined()) {
    expect_shape(p.q_document_start, "attention q_document_start", {{"Tq", q.size(0)}});
    HYDRA_ASSERT(p.q_document_start.dtype() == DType::i64 && p.q_document_start.device() == q.device() &&
                     p.causality == Causality::causal,
                 "attention: q_document_start must be int64 on q's device, with causal masking");
  }
  if (p.k_document_end.defined()) {
    expect_shape(p.k_document_end, "attention k_document_end", {{"Tk", k.size(0)}});
    HYDRA_ASSERT(p.k_document_end.dtype() == DType::i64 && p.k_document_end.device() == k.device(),
                 "attention: k_document_end must be int64 on k's device");
  }
  expect_shape(q, "attention q", {{"Tq", -1}, {"Hq", -1}, {"d", -1}});
  expect_shape(k, "attention k", {{"Tk", -1}, {"Hk", -1}, {"d", q.size(2)}});
  expect_shape(v, "attention v", {{"Tk", k.size(0)}, {"Hk", k.size(1)}, {"dv", -1}});
  expect_shape(out, "attention out", {{"Tq", q.size(0)}, {"Hq", q.size(1)}, {"dv", v.size(2)}});
  expect_shape(lse, "attention lse", {{"Hq", q.size(1)}, {"Tq", q.size(0)}});
  HYDRA_ASSERT(p.kv_head_of_query.empty() ? q.size(1) % k.size(1) == 0
                                          : static_cast<int64_t>(p.kv_head_of_query.size()) == q.size(1),
               "attention: {} query heads, {} KV heads, mapping of {}", q.size(1), k.size(1),
               p.kv_head_of_query.size());
}

}  // namespace

const char* attention_kernel_name(AttentionKernel kernel) {
  switch (kernel) {
    case AttentionKernel::automatic: return "automatic";
    case AttentionKernel::hopper: return "hopper";
    case AttentionKernel::mma: return "mma";
  }
  return "?";
}

const char* attention_backward_kernel_name(AttentionBackwardKernel kernel) {
  switch (kernel) {
    case AttentionBackwardKernel::automatic: return "automatic";
    case AttentionBackwardKernel::ws: return "ws";
    case AttentionBackwardKernel::mma: return "mma";
    case AttentionBackwardKernel::mma_k64: return "mma-k64";
  }
  return "?";
}

void attention_forward(const TensorView& out, const TensorView& lse, const TensorView& q, const TensorView& k,
                       const TensorView& v, const AttentionParams& p) {
  check_shapes(out, lse, q, k, v, p);
  const bool meta = shapes_only({out, lse, q, k, v});
  if (on_cuda({out, lse, q, k, v})) {
    if (meta) return;
#if HYDRA_CUDA
    cuda_impl::attention_forward(out, lse, q, k, v, p);
    return;
#endif
  }
  if (p.output == AttentionOutput::merge) {
    // CPU: compute this block on its own, then merge; the CUDA kernel merges in its epilogue.
    const AttentionMergeBuffers spec = attention_merge_buffers(out.size(0), out.size(1), out.size(2), out.dtype());
    Tensor part = spec.part.empty(Device::host, {MemoryPart::workspaces, "attention block part"});
    Tensor part_lse = spec.part_lse.empty(Device::host, {MemoryPart::workspaces, "attention block lse"});
    AttentionParams fresh = p;
    fresh.output = AttentionOutput::overwrite;
    attention_forward(part, part_lse, q, k, v, fresh);
    attention_merge(out, lse, part, part_lse);
    return;
  }
  if (meta) return;
  reference::attention_forward(out, lse, q, k, v, p);
}

AttentionMergeBuffers attention_merge_buffers(int64_t tq, int64_t hq, int64_t dv, DType acc) {
  return {.part = {{tq, hq, dv}, acc}, .part_lse = {{hq, tq}, acc}};
}

void attention_merge(const TensorView& out, const TensorView& lse, const TensorView& part_out,
                     const TensorView& part_lse) {
  expect_shape(out, "merge out", {{"Tq", -1}, {"Hq", -1}, {"dv", -1}});
  expect_shape(part_out, "merge part_out", {{"Tq", out.size(0)}, {"Hq", out.size(1)}, {"dv", out.size(2)}});
  expect_shape(lse, "merge lse", {{"Hq", out.size(1)}, {"Tq", out.size(0)}});
  expect_shape(part_lse, "merge part_lse", {{"Hq", out.size(1)}, {"Tq", out.size(0)}});
  if (shapes_only({out, lse, part_out, part_lse})) return;
  reference::attention_merge(out, lse, part_out, part_lse);
}

void attention_backward_prepare(const TensorView& delta, const TensorView& d_out, const TensorView& out) {
  expect_shape(out, "attention out", {{"Tq", -1}, {"Hq", -1}, {"dv", -1}});
  expect_shape(d_out, "attention d_out", {{"Tq", out.size(0)}, {"Hq", out.size(1)}, {"dv", out.size(2)}});
  expect_shape(delta, "attention delta", {{"Hq", out.size(1)}, {"Tq", out.size(0)}});
  if (shapes_only({delta, d_out, out})) return;
  if (on_cuda({delta, d_out, out})) {
#if HYDRA_CUDA
    cuda_impl::attention_backward_prepare(delta, d_out, out);
    return;
#endif
  }
  reference::attention_backward_prepare(delta, d_out, out);
}

void attention_backward(const TensorView& dq, const TensorView& dk, const TensorView& dv, const TensorView& d_out,
                        const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& lse,
                        const TensorView& delta, const AttentionParams& params) {
  check_shapes(d_out, lse, q, k, v, params);
  expect_shape(delta, "attention delta", {{"Hq", q.size(1)}, {"Tq", q.size(0)}});
  expect_shape(dq, "attention dq", {{"Tq", q.size(0)}, {"Hq", q.size(1)}, {"d", q.size(2)}});
  expect_shape(dk, "attention dk", {{"Tk", k.size(0)}, {"Hk", k.size(1)}, {"d", k.size(2)}});
  expect_shape(dv, "attention dv", {{"Tk", v.size(0)}, {"Hk", v.size(1)}, {"dv", v.size(2)}});
  if (shapes_only({dq, dk, dv, d_out, q, k, v, lse, delta})) return;
  if (on_cuda({dq, dk, dv, d_out, q, k, v, lse, delta})) {
#if HYDRA_CUDA
    cuda_impl::attention_backward(dq, dk, dv, d_out, q, k, v, lse, delta, params);
    return;
#endif
  }
  reference::attention_backward(dq, dk, dv, d_out, q, k, v, lse, delta, params);
}


}  // namespace hydra::ops
