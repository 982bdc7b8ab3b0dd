// The gated delta rule's forward entry points and workspace specs: shape checks, then the CUDA kernels
// (tensors on the GPU, delta_rule_*.cu) or the CPU reference (host tensors, delta_rule_reference.cpp).
// The backward's are delta_rule_backward.cpp.
#include "kernels/delta_rule/delta_rule.h"

#include "kernels/common.h"
#include "kernels/delta_rule/delta_rule_cpu.h"
#include "kernels/delta_rule/delta_rule_reference.h"

namespace hydra::ops {

DeltaRulePrepareBuffers delta_rule_prepare_buffers(int64_t rows, int64_t heads, int64_t d, bool queries, bool backward) {
  const int64_t c = kDeltaRuleChunk, chunks = (rows + c - 1) / c;
  DeltaRulePrepareBuffers b{.gamma = {{chunks, heads, c}, DType::f32},
                            .factors = {{chunks, heads, 4, c}, DType::f32},
                            .t = {{chunks, heads, c, c}, DType::bf16},
                            .p = {},
                            .tile = {}};
  if (queries) b.p = {{chunks, heads, c, c}, DType::bf16};
  if (backward) b.tile = {{chunks, heads, c, d}, DType::bf16};
  return b;
}

double DeltaRulePrepareBuffers::bytes() const {
  const auto of = [](const BufferSpec& s) { return s.exists() ? s.bytes() : 0.0; };
  return of(gamma) + of(factors) + of(t) + of(p) + 3 * of(tile);
}

DeltaRuleBackwardBuffers delta_rule_backward_buffers(int64_t rows, int64_t heads, int64_t d) {
  const int64_t c = kDeltaRuleChunk, chunks = (rows + c - 1) / c;
  return {.states = {{chunks, heads, d, d}, DType::bf16}, .v_new = {{chunks, heads, c, d}, DType::bf16}};
}

void delta_rule_recurrent(const TensorView& out, const TensorView& state, const TensorView& q, const TensorView& k,
                          const TensorView& v, const TensorView& g, const TensorView& beta,
                          const DeltaRuleParams& params) {
  HYDRA_ASSERT(!on_cuda({out, state, q, k, v, g, beta}), "the recurrent form is the CPU oracle; use the chunked form on CUDA");
  if (shapes_only({out, state, q, k, v, g, beta})) return;
  reference::delta_rule_recurrent(out, state, q, k, v, g, beta, params);
}

void delta_rule_chunked(const TensorView& out, const TensorView& state, const TensorView& q, const TensorView& k,
                        const TensorView& v, const TensorView& g, const TensorView& beta,
                        const DeltaRuleParams& params) {
  if (on_cuda({out, state, q, k, v, g, beta})) {
    delta_cpu::check_shapes(&out, &state, &q, k, v, g, beta);
    if (shapes_only({out, state, q, k, v, g, beta})) {
      // delta_rule_forward.cu's chunk workspace (delta_rule_prepare.cu, with queries), one block per call.
      allocate_storage(static_cast<size_t>(delta_rule_prepare_buffers(q.size(0), q.size(1), q.size(2), true, false).bytes()),
                       Device::cuda, {MemoryPart::workspaces, "GDN chunk workspace"});
      return;
    }
#if HYDRA_CUDA
    cuda_impl::delta_rule_chunked(out, state, q, k, v, g, beta, params);
    return;
#endif
  }
  HYDRA_ASSERT(params.chunk >= 1, "chunk size {}", params.chunk);
  if (shapes_only({out, state, q, k, v, g, beta})) return;  // the CPU form keeps its chunk state in vectors
  reference::delta_rule_chunked(out, state, q, k, v, g, beta, params);
}

void delta_rule_segment_map(const TensorView& m, const TensorView& s_ext, const TensorView& k, const TensorView& v,
                            const TensorView& g, const TensorView& beta, const DeltaRuleParams& params) {
  if (shapes_only({m, s_ext, k, v, g, beta})) return;
  if (on_cuda({m, s_ext, k, v, g, beta})) {
#if HYDRA_CUDA
    delta_cpu::check_shapes(nullptr, &s_ext, nullptr, k, v, g, beta);
    expect_shape(m, "segment map m", {{"H", k.size(1)}, {"dk", k.size(2)}, {"dk", k.size(2)}});
    cuda_impl::delta_rule_segment_map(m, s_ext, k, v, g, beta, params);
    return;
#endif
  }
  HYDRA_ASSERT(params.chunk >= 1, "chunk size {}", params.chunk);
  reference::delta_rule_segment_map(m, s_ext, k, v, g, beta, params);
}

void delta_rule_apply_map(const TensorView& state, const TensorView& m, const TensorView& s_ext) {
  expect_shape(state, "state", {{"H", -1}, {"dk", -1}, {"dv", -1}});
  const int64_t h = state.size(0), dk = state.size(1), dv = state.size(2);
  expect_shape(m, "map m", {{"H", h}, {"dk", dk}, {"dk", dk}});
  expect_shape(s_ext, "map s_ext", {{"H", h}, {"dk", dk}, {"dv", dv}});
  if (shapes_only({state, m, s_ext})) return;
  if (on_cuda({state, m, s_ext})) {
#if HYDRA_CUDA
    cuda_impl::delta_rule_apply_map(state, m, s_ext);
    return;
#endif
  }
  reference::delta_rule_apply_map(state, m, s_ext);
}

}  // namespace hydra::ops
