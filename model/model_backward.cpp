// The backward pass of the model, one layer at a time (DESIGN.md §1.5).
//
// What is saved and what is recomputed is decided in model.h (LayerSaved): a layer's backward
// first reruns the forward's own code from the saved input (Model::attention_block in
// LayerMode::replay, model_forward.cpp) — norms, the fused projection unless kept, the FA heads' q/k
// (attention itself is not rerun: its output and log-sum-exp were kept), the GDN conv with RoPE and
// the L2 norm fused in, the gates, the chunked delta rule from the kept segment initial states
// unless the GDN outputs were kept, the fusion and the residual after attention; each MLP tile's
// intermediate through Model::mlp_tile (its gate/up GEMM skipped where the forward kept it) — then
// runs the gradients back:
//   MLP (token tiles) → post-norm → W_o → fusion → FA branch (output gate, ring-attention backward,
//   q/k norms [teacher: RoPE⁻¹ first]) and GDN branch (delta-rule backward with the reverse state
//   fold, L2 norm and RoPE⁻¹ in one pass, conv with its halo, β/g gates) → the fused projection →
//   input norm.
// Every parameter gradient is accumulated (+=) in acc_dtype() (fp32 on the GPU); activation
// gradients are held in the compute dtype where they feed a GEMM (bf16 on the GPU), and the
// residual stream's gradient dx in acc_dtype().
#include <algorithm>

#include "kernels/attention/attention.h"
#include "kernels/conv/conv.h"
#include "kernels/elementwise/elementwise.h"
#include "kernels/embedding/embedding.h"
#include "kernels/fusion/fusion.h"
#include "kernels/gdn_gates/gdn_gates.h"
#include "kernels/matmul/matmul.h"
#include "runtime/concurrency.h"
#include "runtime/fault.h"
#include "runtime/memory_timeline.h"
#include "kernels/rmsnorm/rmsnorm.h"
#include "kernels/rope/rope.h"
#include "kernels/swiglu/swiglu.h"
#include "model/layer_parts.h"
#include "model/model.h"
#include "parallel/gdn_scan.h"
#include "parallel/ring_attention.h"

namespace hydra {
namespace {

const TensorView& grad_of(const Tensor& t) { return t.view(); }  // undefined: frozen, not computed

}  // namespace

void Model::final_norm_backward(const TensorView& dx, const TensorView& d_hidden, const TensorView& x,
                                ModelTensors& grads) const {
  ops::rms_norm_backward(dx, grad_of(grads.final_norm), d_hidden, x, weights_.final_norm,
                         {static_cast<float>(config_.rms_norm_eps)});
}

void Model::embed_backward(const TensorView& dx, const TensorView& ids, ModelTensors& grads) const {
  if (grads.embed.defined()) ops::embedding_backward(grads.embed, dx, to_device(ids, device_, "token ids"));
}

void Model::layer_backward(ForwardContext& context, int64_t layer, const Tensor& positions, const LayerSaved& saved,
                           const TensorView& dx, LayerWeights& grads, InputGradient input_gradient) const {
  const LayerWeights& w = layers_at(layer);
  const ProjectionColumns& col = layout(layer).columns;
  PhaseTimer* timer = context.timer;
  const int64_t t = context.sequence().local_length(), D = config_.hidden_size, H = config_.num_heads;
  const int64_t d = config_.head_dim;
  const bool hydra = config_.is_hydra();
  const ops::RmsNormParams norm{static_cast<float>(config_.rms_norm_eps)};
  expect_shape(dx, "layer dx", {{"T_loc", t}, {"D", D}});
  expect_shape(saved.input, "saved layer input", {{"T_loc", t}, {"D", D}});
  maybe_inject_fault("backward");
  memory_stage("layer {} backward", layer);
  // Every buffer's shape and type (model/layer_buffers.h); each allocation names its buffer.
  const LayerBuffers b = layer_buffers(config_, layout(layer), t, dtype_, acc_dtype());

  // ---- Recompute the forward (all but attention itself): the forward's own code, replaying ----
  const TensorView x_in = saved.input;
  Tensor x_mid = clone(x_in, "mid-layer residual");  // the residual stream after attention, before the MLP
  AttentionTrace trace;
  attention_block(context, layer, positions, x_mid, LayerPass::replaying(saved, trace));
  const TensorView pv = trace.proj.view();

  mlp_backward(context, layer, saved, x_mid, dx, grads);  // dx is now the gradient w.r.t. x_mid

  // ---- W_o and the fusion ----
  Tensor dxb = to(dx, device_, dtype_, "dx operand");
  Tensor d_fused = b.d_heads.empty(device_, "d_fused");
  {
    ScopedPhase phase(timer, Phase::gemm);
    ops::linear_backward(d_fused.view().reshape({t, H * d}), grad_of(grads.o_proj), dxb,
                         trace.fused.view().reshape({t, H * d}), w.o_proj);
  }
  Tensor dproj = b.d_proj.zeros(device_, "d_proj");  // padding columns stay zero
  const TensorView dpv = dproj.view();
  Tensor d_heads = d_fused;
  if (hydra && config_.fusion != ops::Fusion::concat) {  // concat: the identity
    ScopedPhase phase(timer, Phase::other);
    d_heads = b.d_heads.empty(device_, "d_heads");
    // The gate's logit gradient goes to its columns of dproj: the in_proj backward below takes it
    // on to u and to x̂.
    const ops::FusionTensors fusion_grads{.weight = grad_of(grads.fuse_norm), .gamma = grad_of(grads.fuse_gamma),
                                          .gate = col.fuse_gate >= 0 ? dpv.narrow(1, col.fuse_gate, H) : TensorView(),
                                          .gate_bias = grad_of(grads.fuse_gate_bias)};
    ops::head_fusion_backward(d_heads, fusion_grads, d_fused, trace.heads, fusion_tensors(w, pv, col),
                              {norm.eps, config_.fusion});
  }

  // ---- The FA and GDN branches ----
  // Independent, as in the forward: they read the recomputed forward and d_heads, write disjoint
  // columns of dproj and disjoint parameter gradients. On the GPU the GDN branch runs on a side
  // stream under the FA ring (run_branches); its host code runs first, so the collectives of
  // both branches reach the communicator's stream in the same order on every rank.
  const BranchGradients into{.d_heads = d_heads, .dproj = dpv, .grads = grads};
  run_branches(device_, kernels_.branches, w.h_fa, w.h_gdn,
               [&] { fa_branch_backward(context, layer, positions, saved, trace, into); },
               [&] { gdn_branch_backward(context, layer, positions, saved, trace, into); });

  // ---- The fused projection and the input norm ----
  const bool want_input = input_gradient == InputGradient::compute;
  Tensor dxn;
  if (want_input) dxn = b.d_x_norm.empty(device_, "d_x_norm");
  {
    ScopedPhase phase(timer, Phase::gemm);
    ops::linear_backward(dxn, grad_of(grads.in_proj), dproj, trace.x_norm, w.in_proj);
  }
  if (want_input) {
    ScopedPhase phase(timer, Phase::other);
    ops::rms_norm_backward(dx, grad_of(grads.input_norm), dxn, x_in, w.input_norm, norm, ops::Accumulate::yes);
  }
}

void Model::mlp_backward(ForwardContext& context, int64_t layer, const LayerSaved& saved, const TensorView& x_mid,
                         const TensorView& dx, LayerWeights& grads) const {
  const LayerWeights& w = layers_at(layer);
  PhaseTimer* timer = context.timer;
  const int64_t t = x_mid.size(0), I = config_.intermediate_size;
  const ops::RmsNormParams norm{static_cast<float>(config_.rms_norm_eps)};
  const LayerBuffers b = layer_buffers(config_, layout(layer), t, dtype_, acc_dtype());
  const int64_t tile = b.tile_h.shape[0];
  const bool kept_gu = saved.mlp_gate_up.defined();  // KeptActivations::mlp_layers: no mlp_in GEMM here
  if (kept_gu) expect_shape(saved.mlp_gate_up, "kept MLP gate | up", {{"T_loc", t}, {"2I", 2 * I}});
  Tensor xn = b.tile_x_norm.empty(device_, "MLP tile"), h = b.tile_h.empty(device_, "MLP tile");
  Tensor gu_tile = kept_gu ? Tensor() : b.tile_gate_up.empty(device_, "MLP gate/up tile");
  Tensor dy = b.tile_dy.empty(device_, "MLP tile gradient"), dh = b.tile_dh.empty(device_, "MLP tile gradient");
  Tensor dgu = b.tile_dgate_up.empty(device_, "MLP gate/up tile gradient");
  Tensor dxn = b.tile_dx_norm.empty(device_, "MLP tile gradient");
  for (int64_t t0 = 0; t0 < t; t0 += tile) {
    const int64_t n = std::min(tile, t - t0);
    const auto rows = [&](const Tensor& m) { return m.view().narrow(0, 0, n); };
    const TensorView xm = x_mid.narrow(0, t0, n), dxt = dx.narrow(0, t0, n);
    const TensorView gu = kept_gu ? saved.mlp_gate_up.view().narrow(0, t0, n) : rows(gu_tile);
    const TensorView gate = gu.narrow(1, 0, I), up = gu.narrow(1, I, I);
    // The tile's forward again (x_norm: mlp_in's weight gradient reads it), as the forward runs it.
    mlp_tile(context, layer, xm, rows(xn), gu, rows(h), kept_gu ? MlpGateUp::kept : MlpGateUp::compute);
    {
      ScopedPhase phase(timer, Phase::other);
      copy_into(rows(dy), dxt);  // the residual gradient as a GEMM operand
    }
    {
      ScopedPhase phase(timer, Phase::gemm);
      ops::linear_backward(rows(dh), grad_of(grads.mlp_down), rows(dy), rows(h), w.mlp_down);
    }
    {
      ScopedPhase phase(timer, Phase::other);
      ops::swiglu_backward(rows(dgu).narrow(1, 0, I), rows(dgu).narrow(1, I, I), rows(dh), gate, up);
    }
    {
      ScopedPhase phase(timer, Phase::gemm);
      ops::linear_backward(rows(dxn), grad_of(grads.mlp_in), rows(dgu), rows(xn), w.mlp_in);
    }
    ScopedPhase phase(timer, Phase::other);
    ops::rms_norm_backward(dxt, grad_of(grads.post_norm), rows(dxn), xm, w.post_norm, norm, ops::Accumulate::yes);
  }
}

void Model::fa_branch_backward(ForwardContext& context, int64_t layer, const Tensor& positions, const LayerSaved& saved,
                               const AttentionTrace& trace, const BranchGradients& into) const {
  const LayerWeights& w = layers_at(layer);
  const ProjectionColumns& col = layout(layer).columns;
  PhaseTimer* timer = context.timer;
  const TensorView pv = trace.proj.view(), dpv = into.dproj;
  const int64_t t = pv.size(0), H = config_.num_heads, d = config_.head_dim, hfa = w.h_fa, gfa = w.g_fa;
  const bool hydra = config_.is_hydra();
  const ops::RmsNormParams norm{static_cast<float>(config_.rms_norm_eps)};
  const LayerBuffers b = layer_buffers(config_, layout(layer), t, dtype_, acc_dtype());
  LayerWeights& grads = into.grads;
  TensorView d_attn = into.d_heads;  // gradient w.r.t. the attention output, [T, H_fa, d]
  Tensor gated;
  if (hydra) {  // through the output gate
    ScopedPhase phase(timer, Phase::other);
    gated = b.d_attn.empty(device_, "d_attn");
    d_attn = gated.view();
    ops::sigmoid_gate_backward(d_attn.reshape({t, hfa * d}), dpv.narrow(1, col.fa_gate, hfa * d),
                               into.d_heads.reshape({t, H * d}).narrow(1, 0, hfa * d),
                               saved.fa_out.view().reshape({t, hfa * d}), pv.narrow(1, col.fa_gate, hfa * d));
  }
  Tensor dq = b.d_fa_q.empty(device_, "FA dq"), dk = b.d_fa_kv.empty(device_, "FA dk");
  Tensor dv = b.d_fa_kv.empty(device_, "FA dv");
  ring_attention_backward(context.comm, context.sequence(), dq, dk, dv, d_attn, trace.fa_q, trace.fa_k,
                          head_columns(pv, col.fa_v, gfa, d), saved.fa_out, saved.fa_lse, attention_params(layer), timer);
  ScopedPhase phase(timer, Phase::other);
  if (!hydra) {
    ops::rope(dq, positions, {config_.rope_theta, ops::RopeDirection::inverse});
    ops::rope(dk, positions, {config_.rope_theta, ops::RopeDirection::inverse});
  }
  ops::rms_norm_backward(head_columns(dpv, col.fa_q, hfa, d), grad_of(grads.q_norm), dq,
                         head_columns(pv, col.fa_q, hfa, d), w.q_norm, norm);
  ops::rms_norm_backward(head_columns(dpv, col.fa_k, gfa, d), grad_of(grads.k_norm), dk,
                         head_columns(pv, col.fa_k, gfa, d), w.k_norm, norm);
  copy_into(head_columns(dpv, col.fa_v, gfa, d), dv);
}

void Model::gdn_branch_backward(ForwardContext& context, int64_t layer, const Tensor& positions,
                                const LayerSaved& saved, const AttentionTrace& trace, const BranchGradients& into) const {
  const LayerWeights& w = layers_at(layer);
  const ProjectionColumns& col = layout(layer).columns;
  PhaseTimer* timer = context.timer;
  const TensorView pv = trace.proj.view(), dpv = into.dproj;
  const int64_t t = pv.size(0), d = config_.head_dim, hfa = w.h_fa, hg = w.h_gdn;
  const LayerBuffers b = layer_buffers(config_, layout(layer), t, dtype_, acc_dtype());
  LayerWeights& grads = into.grads;
  Tensor dconv = b.d_conv.empty(device_, "d_conv");  // gradient w.r.t. the conv's output: q | k | v
  const TensorView dq = head_columns(dconv, 0, hg, d), dk = head_columns(dconv, hg * d, hg, d);
  Tensor dqn = b.d_qk.empty(device_, "dq"), dkn = b.d_qk.empty(device_, "dk");
  Tensor dg = b.gate.empty(device_, "dg"), dbeta = b.gate.empty(device_, "dbeta");
  const TensorView qn = head_columns(trace.conv, 0, hg, d), kn = head_columns(trace.conv, hg * d, hg, d);
  gdn_sequence_parallel_backward(context.comm, context.sequence(), saved.gdn, dqn, dkn,
                                 head_columns(dconv, 2 * hg * d, hg, d), dg, dbeta, into.d_heads.narrow(1, hfa, hg), qn,
                                 kn, head_columns(trace.conv, 2 * hg * d, hg, d), trace.g, trace.beta,
                                 delta_rule_params(), timer);
  {
    ScopedPhase phase(timer, Phase::gdn);
    const ops::GdnQkParams qk = gdn_qk_params(hg);
    ops::gdn_qk_backward(dq, dqn, qn, trace.inv_norm.view().narrow(1, 0, hg), positions, qk);
    ops::gdn_qk_backward(dk, dkn, kn, trace.inv_norm.view().narrow(1, hg, hg), positions, qk);
    ops::gdn_gates_backward(dpv.narrow(1, col.gdn_b, hg), dpv.narrow(1, col.gdn_a, hg), grad_of(grads.a_log),
                            grad_of(grads.dt_bias), dbeta, dg, pv.narrow(1, col.gdn_b, hg), pv.narrow(1, col.gdn_a, hg),
                            w.a_log, w.dt_bias);
  }
  causal_conv_sequence_parallel_backward(context.comm, context.sequence(), dpv.narrow(1, col.gdn_qkv, 3 * hg * d),
                                         grad_of(grads.conv), dconv, pv.narrow(1, col.gdn_qkv, 3 * hg * d), w.conv,
                                         timer);
}

}  // namespace hydra
