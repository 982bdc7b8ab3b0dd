// The forward pass of the model (DESIGN.md §1.1, §1.2): the one implementation of a layer that every
// caller runs, in one of the modes of model.h LayerMode:
//   forward      x ← layer(x);
//   save         the same, and what the backward needs goes into a LayerSaved (model.h);
//   replay       the backward's recomputation from a LayerSaved (model_backward.cpp): attention is
//                not rerun (its output and log-sum-exp were kept), the GDN outputs come from the kept
//                segment initial states (no collective) or were kept whole, the projection may have
//                been kept; the intermediates the backward reads go into an AttentionTrace;
//   prefill      a forward that also stores the K/V rows, conv tails and GDN states into the cache;
//   decode       one row per sequence against the cache (model_decode.cpp).
// Every door runs the layers through run_layers (forward, prefill, decode, the training forward),
// so a change to the layer (a cache write, a document reset) is made here once.
#include <algorithm>

#include "kernels/elementwise/elementwise.h"
#include "kernels/embedding/embedding.h"
#include "kernels/fusion/fusion.h"
#include "kernels/gdn_gates/gdn_gates.h"
#include "kernels/matmul/matmul.h"
#include "kernels/rmsnorm/rmsnorm.h"
#include "kernels/rope/rope.h"
#include "kernels/swiglu/swiglu.h"
#include "model/kv_cache.h"
#include "model/layer_parts.h"
#include "model/model.h"
#include "parallel/gdn_scan.h"
#include "parallel/ring_attention.h"
#include "runtime/concurrency.h"
#include "runtime/fault.h"

namespace hydra {
namespace {

// The pass's tensors are those of its mode, and a cache is there exactly when the mode uses one
// (decoding when the mode decodes): checked once per layer, so the layer's code reads the mode.
void check_pass(const LayerPass& pass, const ForwardContext& context, int64_t layer) {
  const bool saves = pass.mode == LayerMode::save, replays = pass.mode == LayerMode::replay;
  const bool caches = pass.mode == LayerMode::prefill || pass.mode == LayerMode::decode;
  HYDRA_ASSERT(saves == (pass.save != nullptr) && replays == (pass.replay != nullptr && pass.trace != nullptr) &&
                   (replays || pass.trace == nullptr),
               "layer {}: a {} pass with the wrong tensors", layer, layer_mode_name(pass.mode));
  HYDRA_ASSERT(caches == (context.cache != nullptr), "layer {}: a {} pass {} a generation cache", layer,
               layer_mode_name(pass.mode), caches ? "without" : "with");
  HYDRA_ASSERT(!caches || context.cache->decoding() == (pass.mode == LayerMode::decode),
               "layer {}: a {} pass on a cache that is {}decoding", layer, layer_mode_name(pass.mode),
               context.cache->decoding() ? "" : "not ");
  HYDRA_ASSERT(!(saves && context.observer), "a forward that saves for the backward cannot be observed (patched)");
}

}  // namespace

const SequenceLayout& ForwardContext::sequence() const {
  HYDRA_ASSERT(layout.has_value(), "a pass that reads the sequence layout was given none (only decode runs without)");
  return *layout;
}

const char* layer_mode_name(LayerMode mode) {
  switch (mode) {
    case LayerMode::forward: return "forward";
    case LayerMode::save: return "save";
    case LayerMode::replay: return "replay";
    case LayerMode::prefill: return "prefill";
    case LayerMode::decode: return "decode";
  }
  return "?";
}

ops::AttentionParams Model::attention_params(int64_t layer) const {
  return ops::AttentionParams{.tau_log_base = config_.is_hydra() ? config_.fa_log_base : 0.0,
                              .kv_head_of_query = layers_at(layer).fa_kv_of,
                              .forward_kernel = kernels_.attention,
                              .backward_kernel = kernels_.attention_backward,
                              .decode_kernel = kernels_.decode_attention,
                              .decode_ctas_per_sm = kernels_.decode_ctas_per_sm};
}

Tensor Model::positions(const SequenceLayout& layout) const {
  // RoPE's positions: within each packed document (the global positions without documents); masks
  // and τ take the document bounds from the layout themselves.
  const std::vector<int64_t> pos = layout.local_document_positions();
  return to_device(TensorView(const_cast<int64_t*>(pos.data()), DType::i64, Device::host,
                              {static_cast<int64_t>(pos.size())}),
                   device_);
}

Tensor Model::embed(const TensorView& ids) const {
  Tensor x = Tensor::empty({ids.size(0), config_.hidden_size}, dtype_, device_);
  ops::embedding(x, weights_.embed, to_device(ids, device_));
  return x;
}

Tensor Model::final_norm(const TensorView& x) const {
  Tensor out = Tensor::empty(x.shape(), dtype_, device_);
  ops::rms_norm(out, x, weights_.final_norm, {static_cast<float>(config_.rms_norm_eps)});
  return out;
}

Tensor Model::forward(ForwardContext& context, const TensorView& ids) const {
  const Tensor x = forward_residual(context, ids);
  ScopedPhase phase(context.timer, Phase::other);
  return final_norm(x);
}

Tensor Model::forward_residual(ForwardContext& context, const TensorView& ids) const {
  const SequenceLayout& layout = context.sequence();
  expect_shape(ids, "token ids", {{"T_loc", layout.local_length()}});
  HYDRA_ASSERT(context.comm.size() == layout.world_size() && context.comm.rank() == layout.rank(),
               "layout for rank {}/{} used on rank {}/{}", layout.rank(), layout.world_size(), context.comm.rank(),
               context.comm.size());
  const Tensor pos = positions(layout);
  Tensor x;  // the residual stream
  {
    ScopedPhase phase(context.timer, Phase::other);
    x = embed(ids);
  }
  run_layers(context, context.cache ? LayerMode::prefill : LayerMode::forward, pos, x);
  return x;
}

void Model::run_layers(ForwardContext& context, LayerMode mode, const Tensor& positions, const TensorView& x,
                       std::span<LayerSaved> saved, const std::function<void(int64_t layer)>& hook) const {
  HYDRA_ASSERT(mode != LayerMode::replay, "run_layers runs forward modes; a replay is one layer's backward");
  HYDRA_ASSERT(context.layout.has_value() == (mode != LayerMode::decode),
               "a {} pass {} a sequence layout (decode has none, every other mode one)", layer_mode_name(mode),
               context.layout ? "with" : "without");
  HYDRA_ASSERT((mode == LayerMode::save) == (static_cast<int64_t>(saved.size()) == config_.num_layers),
               "a {} pass over {} layers with {} saved slots", layer_mode_name(mode), config_.num_layers, saved.size());
  for (int64_t l = 0; l < config_.num_layers; ++l) {
    const LayerPass pass = mode == LayerMode::save ? LayerPass::saving(saved[static_cast<size_t>(l)])
                           : mode == LayerMode::forward ? LayerPass::forward()
                                                        : LayerPass::with_cache(mode);
    run_layer(context, l, positions, x, pass);
    if (hook) hook(l);
    if (context.after_layer) context.after_layer(l);
  }
}

void Model::layer_forward(ForwardContext& context, int64_t layer, const Tensor& positions, const TensorView& x,
                          LayerSaved* saved) const {
  run_layer(context, layer, positions, x, saved ? LayerPass::saving(*saved) : LayerPass::forward());
}

void Model::run_layer(ForwardContext& context, int64_t layer, const Tensor& positions, const TensorView& x,
                      const LayerPass& pass) const {
  if (pass.mode != LayerMode::decode) {  // a decode step's rows are the cache's, not a layout's
    expect_shape(x, "residual stream", {{"T_loc", context.sequence().local_length()}, {"D", config_.hidden_size}});
  }
  maybe_inject_fault("layer");
  if (pass.mode == LayerMode::save) pass.save->input = clone(x);
  attention_block(context, layer, positions, x, pass);
  Tensor gate_up;
  if (pass.mode == LayerMode::save && layer < context.keep.mlp_layers) {
    gate_up = layer_buffers(config_, layout(layer), x.size(0), dtype_, acc_dtype()).mlp_gate_up.empty(device_);
    pass.save->mlp_gate_up = gate_up;
  }
  mlp(context, layer, x, gate_up);
}

void Model::attention_block(ForwardContext& context, int64_t layer, const Tensor& positions, const TensorView& x,
                            const LayerPass& pass) const {
  const LayerWeights& w = layers_at(layer);
  const ProjectionColumns& col = layout(layer).columns;
  const int64_t t = x.size(0), H = config_.num_heads, d = config_.head_dim;
  const int64_t hfa = w.h_fa, gfa = w.g_fa, hg = w.h_gdn;
  const bool hydra = config_.is_hydra();
  check_pass(pass, context, layer);
  const LayerMode mode = pass.mode;
  const LayerSaved* replay = pass.replay;  // replay
  LayerSaved* save = pass.save;            // save
  HYDRA_ASSERT(hfa == 0 || mode != LayerMode::replay || replay->fa_out.defined(),
               "layer {}: replay without the forward's attention output", layer);
  // Generation (model/kv_cache.h): a prefill stores into context.cache, a decode step reads it.
  KvCache* cache = context.cache;  // prefill, decode
  PhaseTimer* timer = context.timer;
  const ops::RmsNormParams norm{static_cast<float>(config_.rms_norm_eps)};
  // Every buffer's shape and type: the one description the memory plan prices (model/memory_plan.h).
  const LayerBuffers b = layer_buffers(config_, layout(layer), t, dtype_, acc_dtype());

  Tensor x_norm = b.x_norm.empty(device_);
  {
    ScopedPhase phase(timer, Phase::other);
    ops::rms_norm(x_norm, x, w.input_norm, norm);
  }
  Tensor proj = mode == LayerMode::replay ? replay->proj : Tensor();  // the projection, if the forward kept it
  if (!proj.defined()) {
    proj = b.proj.empty(device_);
    ScopedPhase phase(timer, Phase::gemm);
    ops::linear(proj, x_norm, w.in_proj);
  }
  if (mode == LayerMode::save && hydra && context.keep.projection) save->proj = proj;  // read-only from here on
  const TensorView pv = proj.view();
  Tensor heads = b.heads.empty(device_);  // per-head outputs before fusion, physical order: FA, then GDN

  Tensor fa_q, fa_k;
  auto fa_branch = [&] {
    fa_q = b.fa_q.empty(device_);
    fa_k = b.fa_k.empty(device_);
    {
      ScopedPhase phase(timer, Phase::other);
      ops::rms_norm(fa_q, head_columns(pv, col.fa_q, hfa, d), w.q_norm, norm);
      ops::rms_norm(fa_k, head_columns(pv, col.fa_k, gfa, d), w.k_norm, norm);
      if (!hydra) {  // the teacher's RoPE; HydraHead FA heads have none (τ scales the query instead)
        ops::rope(fa_q, positions, {config_.rope_theta});
        ops::rope(fa_k, positions, {config_.rope_theta});
      }
    }
    // The attention output before the gate: fp32 from the ring (its merge accumulator), or the
    // bf16 rounding the forward kept. A forward that saves gates the kept rounding, as the replay
    // does, so the replayed residual equals the forward's bit for bit and what else the forward
    // keeps (the MLP's gate/up) is what the backward would have recomputed.
    TensorView attn;
    Tensor o_acc;
    if (mode == LayerMode::replay) {
      attn = replay->fa_out.view();
    } else if (mode == LayerMode::decode) {  // the new rows against the cache, merged over the ranks
      o_acc = b.fa_acc.empty(device_);
      cache->attend(context.comm, layer, o_acc, fa_q, fa_k, head_columns(pv, col.fa_v, gfa, d), attention_params(layer),
                    timer);
      attn = o_acc.view();
    } else {  // forward, save, prefill: ring attention over the sequence
      o_acc = b.fa_acc.empty(device_);
      Tensor lse = b.fa_lse.empty(device_);
      ring_attention(context.comm, context.sequence(), o_acc, lse, fa_q, fa_k, head_columns(pv, col.fa_v, gfa, d),
                     attention_params(layer), timer);
      if (mode == LayerMode::prefill) cache->store_kv(layer, fa_k, head_columns(pv, col.fa_v, gfa, d));
      attn = o_acc.view();
      if (mode == LayerMode::save) {
        ScopedPhase phase(timer, Phase::other);
        save->fa_out = to(o_acc, device_, dtype_);
        save->fa_lse = lse;
        attn = save->fa_out.view();
      }
    }
    ScopedPhase phase(timer, Phase::other);
    const TensorView fa_heads = heads.view().reshape({t, H * d}).narrow(1, 0, hfa * d);
    if (hydra) {
      ops::sigmoid_gate(fa_heads, attn.reshape({t, hfa * d}), pv.narrow(1, col.fa_gate, hfa * d));
    } else {
      copy_into(fa_heads, attn.reshape({t, hfa * d}));
    }
  };

  Tensor conv, inv_norm, beta, g;
  auto gdn_branch = [&] {
    // conv + SiLU with the halo, then RoPE and the L2 norm of q and k, in one pass (ops::gdn_qkv_conv).
    conv = b.conv.empty(device_);
    inv_norm = b.inv_norm.empty(device_);  // the q/k L2 norms' inverses: their backward needs them
    const GdnQkFinish finish{positions, inv_norm, gdn_qk_params(hg)};
    if (mode == LayerMode::decode) {  // the new rows' conv reads (and advances) the cached tail
      cache->conv_step(layer, conv, inv_norm, pv.narrow(1, col.gdn_qkv, 3 * hg * d), w.conv, gdn_qk_params(hg));
    } else {
      causal_conv_sequence_parallel(context.comm, context.sequence(), conv, pv.narrow(1, col.gdn_qkv, 3 * hg * d), w.conv,
                                    timer, &finish);
      if (mode == LayerMode::prefill) cache->store_conv_tail(layer, pv.narrow(1, col.gdn_qkv, 3 * hg * d));
    }
    const TensorView q = head_columns(conv, 0, hg, d), k = head_columns(conv, hg * d, hg, d);
    const TensorView v = head_columns(conv, 2 * hg * d, hg, d);
    beta = b.gate.empty(device_);
    g = b.gate.empty(device_);
    {
      ScopedPhase phase(timer, Phase::gdn);
      ops::gdn_gates(beta, g, pv.narrow(1, col.gdn_b, hg), pv.narrow(1, col.gdn_a, hg), w.a_log, w.dt_bias);
    }
    const TensorView out = heads.view().narrow(1, hfa, hg);
    if (mode == LayerMode::replay && replay->gdn_out.defined()) {  // kept by the forward (KeptActivations::gdn_outputs)
      ScopedPhase phase(timer, Phase::gdn);
      copy_into(out, replay->gdn_out);
    } else if (mode == LayerMode::decode) {
      ScopedPhase phase(timer, Phase::gdn);
      cache->gdn_step(layer, out, q, k, v, g, beta, delta_rule_params());
    } else if (mode == LayerMode::replay) {
      gdn_sequence_parallel_recompute(context.sequence(), replay->gdn, out, q, k, v, g, beta, delta_rule_params(), timer);
    } else {  // forward, save, prefill: the sequence-parallel scan (a prefill keeps the final state)
      gdn_sequence_parallel(context.comm, context.sequence(), out, q, k, v, g, beta, delta_rule_params(), timer,
                            mode == LayerMode::save ? &save->gdn : nullptr,
                            mode == LayerMode::prefill ? cache->final_state(layer) : TensorView());
      if (mode == LayerMode::save && context.keep.gdn_outputs) {
        ScopedPhase phase(timer, Phase::gdn);
        save->gdn_out = clone(out);
      }
    }
  };

  run_branches(device_, kernels_.branches, hfa, hg, fa_branch, gdn_branch);  // concurrent on the GPU (layer_parts.h)

  // Fusion (HydraHead), in place unless the backward reads the unfused heads too; concat is the
  // identity (W_o reads the heads themselves).
  Tensor fused = heads;
  if (hydra && config_.fusion != ops::Fusion::concat) {
    ScopedPhase phase(timer, Phase::other);
    if (mode == LayerMode::replay) fused = b.heads.empty(device_);
    ops::head_fusion(fused, heads, fusion_tensors(w, pv, col), {norm.eps, config_.fusion});
  }
  if (context.observer) context.observer->on_head_outputs(layer, fused, w.head_of);
  {
    ScopedPhase phase(timer, Phase::gemm);
    ops::linear(x, fused.view().reshape({t, H * d}), w.o_proj, ops::Accumulate::yes);
  }
  if (mode == LayerMode::replay) {
    *pass.trace = AttentionTrace{.x_norm = std::move(x_norm), .proj = std::move(proj), .fa_q = std::move(fa_q),
                                 .fa_k = std::move(fa_k), .conv = std::move(conv), .inv_norm = std::move(inv_norm),
                                 .beta = std::move(beta), .g = std::move(g), .heads = std::move(heads),
                                 .fused = std::move(fused)};
  }
}

void Model::mlp_tile(ForwardContext& context, int64_t layer, const TensorView& x, const TensorView& x_norm,
                     const TensorView& gate_up, const TensorView& h, MlpGateUp gate_up_state) const {
  const LayerWeights& w = layers_at(layer);
  const int64_t I = config_.intermediate_size;
  {
    ScopedPhase phase(context.timer, Phase::other);
    ops::rms_norm(x_norm, x, w.post_norm, {static_cast<float>(config_.rms_norm_eps)});
  }
  if (gate_up_state == MlpGateUp::compute) {
    ScopedPhase phase(context.timer, Phase::gemm);
    ops::linear(gate_up, x_norm, w.mlp_in);
  }
  ScopedPhase phase(context.timer, Phase::other);
  ops::swiglu(h, gate_up.narrow(1, 0, I), gate_up.narrow(1, I, I));
}

void Model::mlp(ForwardContext& context, int64_t layer, const TensorView& x, const TensorView& gate_up) const {
  const LayerWeights& w = layers_at(layer);
  const int64_t t = x.size(0), I = config_.intermediate_size;
  if (gate_up.defined()) expect_shape(gate_up, "kept MLP gate | up", {{"T_loc", t}, {"2I", 2 * I}});
  const LayerBuffers b = layer_buffers(config_, layout(layer), t, dtype_, acc_dtype());
  const int64_t tile = b.tile_h.shape[0];
  Tensor x_norm = b.tile_x_norm.empty(device_);
  Tensor gu_tile = gate_up.defined() ? Tensor() : b.tile_gate_up.empty(device_);
  Tensor h = b.tile_h.empty(device_);
  for (int64_t t0 = 0; t0 < t; t0 += tile) {  // token-local: tiles bound the intermediate's size
    const int64_t n = std::min(tile, t - t0);
    const TensorView xt = x.narrow(0, t0, n), ht = h.view().narrow(0, 0, n);
    const TensorView gu = gate_up.defined() ? gate_up.narrow(0, t0, n) : gu_tile.view().narrow(0, 0, n);
    mlp_tile(context, layer, xt, x_norm.view().narrow(0, 0, n), gu, ht, MlpGateUp::compute);
    ScopedPhase phase(context.timer, Phase::gemm);
    ops::linear(xt, ht, w.mlp_down, ops::Accumulate::yes);
  }
}

void Model::lm_head(const TensorView& logits, const TensorView& hidden) const {
  expect_shape(logits, "logits", {{"n", hidden.size(0)}, {"V", config_.vocab_size}});
  ops::linear(logits, hidden, weights_.lm_head);
}

}  // namespace hydra
