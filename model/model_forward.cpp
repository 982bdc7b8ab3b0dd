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
#include "kernels/gemv/gemv.h"
#include "kernels/gdn_gates/gdn_gates.h"
#include "kernels/l2_prefetch/l2_prefetch.h"
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
#include "runtime/memory_timeline.h"

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
                              .decode_ctas_per_sm = kernels_.decode_ctas_per_sm,
                              .decode_kv_evict_first = kernels_.decode_prefetch_bytes > 0};
}

Tensor Model::positions(const SequenceLayout& layout) const {
  // RoPE's positions: within each packed document (the global positions without documents); masks
  // and τ take the document bounds from the layout themselves.
  Tensor out = Tensor::empty({layout.local_length()}, DType::i64, device_, "positions");
  if (out.is_meta()) return out;  // a memory plan's shape-only run: nothing to fill
  std::vector<int64_t> pos = layout.local_document_positions();
  copy_into(out, TensorView(pos.data(), DType::i64, Device::host, {static_cast<int64_t>(pos.size())}));
  return out;
}

Tensor Model::embed(const TensorView& ids) const {
  Tensor x = Tensor::empty({ids.size(0), config_.hidden_size}, dtype_, device_, "residual stream");
  ops::embedding(x, weights_.embed, to_device(ids, device_, "token ids"));
  return x;
}

Tensor Model::final_norm(const TensorView& x) const {
  Tensor out = Tensor::empty(x.shape(), dtype_, device_, "final-normed hidden states");
  ops::rms_norm(out, x, weights_.final_norm, {static_cast<float>(config_.rms_norm_eps)});
  return out;
}

Tensor Model::forward(ForwardContext& context, const TensorView& ids) const {
  const Tensor x = forward_residual(context, ids);
  ScopedPhase phase(context.timer, Phase::other);
  memory_stage("final norm");
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
  memory_stage("layer {} forward", layer);
  if (pass.mode == LayerMode::save) pass.save->input = clone(x, "kept input");
  // The decode step's L2 prefetch of this layer's weights (the kernel option decode_prefetch_bytes,
  // kernels/l2_prefetch/l2_prefetch.h): forked by attention_block once the input projection is
  // queued, joined here after the MLP. The prefetch kernel only issues its prefetches (a few µs
  // once it has an SM), so by the layer's end it has long completed and the join delays nothing:
  // the next layer's first kernel does not wait on it in practice. A join before o_proj instead
  // would make o_proj wait whenever the prefetch kernel got its SMs late (behind a full wave of
  // attention CTAs), and joining once per step would keep a stream forked across layers.
  SideWork prefetch;
  LayerPass p = pass;
  if (pass.mode == LayerMode::decode && kernels_.decode_prefetch_bytes > 0 && device_ == Device::cuda) {
    p.prefetch = &prefetch;
  }
  attention_block(context, layer, positions, x, p);
  Tensor gate_up;
  if (pass.mode == LayerMode::save && layer < context.keep.mlp_layers) {
    gate_up = layer_buffers(config_, layout(layer), x.size(0), dtype_, acc_dtype()).mlp_gate_up.empty(device_, "kept MLP gate/up");
    pass.save->mlp_gate_up = gate_up;
  }
  mlp(context, layer, x, gate_up);
  prefetch.join();
}

void Model::attention_block(ForwardContext& context, int64_t layer, const Tensor& positions, const TensorView& x,
                            const LayerPass& pass) const {
  const LayerWeights& w = layers_at(layer);
  const ProjectionColumns& col = layout(layer).columns;
  const int64_t t = x.size(0), H = config_.num_heads, d = config_.head_dim;
  const bool hydra = config_.is_hydra();
  check_pass(pass, context, layer);
  HYDRA_ASSERT(w.h_fa == 0 || pass.mode != LayerMode::replay || pass.replay->fa_out.defined(),
               "layer {}: replay without the forward's attention output", layer);
  PhaseTimer* timer = context.timer;
  // Every buffer's shape and type (model/layer_buffers.h); each allocation names its buffer.
  const LayerBuffers b = layer_buffers(config_, layout(layer), t, dtype_, acc_dtype());
  AttentionTrace block;  // the block's buffers; a replay hands them to its backward

  const ops::RmsNormParams input_norm{static_cast<float>(config_.rms_norm_eps)};
  // A decode step may fold the input norm into in_proj's GEMV (nothing else reads x_norm there).
  const bool norm_in_gemv = norm_in_projection(context, x, w.input_norm, w.in_proj);
  if (!norm_in_gemv) {
    block.x_norm = b.x_norm.empty(device_, "x_norm");
    ScopedPhase phase(timer, Phase::other);
    ops::rms_norm(block.x_norm, x, w.input_norm, input_norm);
  }
  if (pass.mode == LayerMode::replay) block.proj = pass.replay->proj;  // the projection, if the forward kept it
  if (!block.proj.defined()) {
    block.proj = b.proj.empty(device_, "projection");
    ScopedPhase phase(timer, Phase::gemm);
    if (norm_in_gemv) {
      ops::gemv_rms_norm(block.proj, x, {w.input_norm, input_norm}, w.in_proj, kernels_.gemv_tuning);
    } else {
      project(context, block.proj, block.x_norm, w.in_proj);
    }
  }
  if (pass.prefetch) {  // the weights of the GEMVs after the attention part, in the order they are read
    pass.prefetch->start(device_, kernels_.branches, [&] {
      const TensorView regions[] = {w.o_proj, w.mlp_in, w.mlp_down};
      ops::l2_prefetch(regions, kernels_.decode_prefetch_bytes);
    });
  }
  // Kept (read-only from here on) when the forward saves it.
  if (pass.mode == LayerMode::save && hydra && context.keep.projection) pass.save->proj = block.proj;
  block.heads = b.heads.empty(device_, "heads");  // per-head outputs before fusion, physical order: FA, then GDN
  // Concurrent on the GPU (layer_parts.h): each writes its own head columns.
  run_branches(device_, kernels_.branches, w.h_fa, w.h_gdn, [&] { fa_branch(context, layer, positions, pass, block); },
               [&] { gdn_branch(context, layer, positions, pass, block); });

  // Fusion (HydraHead), in place unless the backward reads the unfused heads too; concat is the
  // identity (W_o reads the heads themselves).
  block.fused = block.heads;
  if (hydra && config_.fusion != ops::Fusion::concat) {
    ScopedPhase phase(timer, Phase::other);
    if (pass.mode == LayerMode::replay) block.fused = b.heads.empty(device_, "fused heads");
    ops::head_fusion(block.fused, block.heads, fusion_tensors(w, block.proj, col),
                     {static_cast<float>(config_.rms_norm_eps), config_.fusion});
  }
  if (context.observer) context.observer->on_head_outputs(layer, block.fused, w.head_of);
  {
    ScopedPhase phase(timer, Phase::gemm);
    project(context, x, block.fused.view().reshape({t, H * d}), w.o_proj, ops::Accumulate::yes);
  }
  if (pass.mode == LayerMode::replay) *pass.trace = std::move(block);
}

void Model::fa_branch(ForwardContext& context, int64_t layer, const Tensor& positions, const LayerPass& pass,
                      AttentionTrace& block) const {
  const LayerWeights& w = layers_at(layer);
  const ProjectionColumns& col = layout(layer).columns;
  const TensorView pv = block.proj.view();
  const int64_t t = pv.size(0), H = config_.num_heads, d = config_.head_dim, hfa = w.h_fa, gfa = w.g_fa;
  const bool hydra = config_.is_hydra();
  PhaseTimer* timer = context.timer;
  const ops::RmsNormParams norm{static_cast<float>(config_.rms_norm_eps)};
  const LayerBuffers b = layer_buffers(config_, layout(layer), t, dtype_, acc_dtype());
  block.fa_q = b.fa_q.empty(device_, "FA q");
  block.fa_k = b.fa_k.empty(device_, "FA k");
  {
    ScopedPhase phase(timer, Phase::other);
    ops::rms_norm(block.fa_q, head_columns(pv, col.fa_q, hfa, d), w.q_norm, norm);
    ops::rms_norm(block.fa_k, head_columns(pv, col.fa_k, gfa, d), w.k_norm, norm);
    if (!hydra) {  // the teacher's RoPE; HydraHead FA heads have none (τ scales the query instead)
      ops::rope(block.fa_q, positions, {config_.rope_theta});
      ops::rope(block.fa_k, positions, {config_.rope_theta});
    }
  }
  const TensorView v = head_columns(pv, col.fa_v, gfa, d);
  // The attention output before the gate: fp32 from the ring (its merge accumulator), or the bf16
  // rounding the forward kept. A forward that saves gates the kept rounding, as the replay does, so
  // the replayed residual equals the forward's bit for bit and what else the forward keeps (the
  // MLP's gate/up) is what the backward would have recomputed.
  TensorView attn;
  Tensor o_acc;
  if (pass.mode == LayerMode::replay) {
    attn = pass.replay->fa_out.view();
  } else if (pass.mode == LayerMode::decode) {  // the new rows against the cache, merged over the ranks
    o_acc = b.fa_acc.empty(device_, "FA output");
    context.cache->attend(context.comm, layer, o_acc, block.fa_q, block.fa_k, v, attention_params(layer), timer);
    attn = o_acc.view();
  } else {  // forward, save, prefill: ring attention over the sequence
    o_acc = b.fa_acc.empty(device_, "FA output");
    Tensor lse = b.fa_lse.empty(device_, "FA lse");
    ring_attention(context.comm, context.sequence(), o_acc, lse, block.fa_q, block.fa_k, v, attention_params(layer),
                   timer);
    if (pass.mode == LayerMode::prefill) context.cache->store_kv(layer, block.fa_k, v);
    attn = o_acc.view();
    if (pass.mode == LayerMode::save) {
      ScopedPhase phase(timer, Phase::other);
      pass.save->fa_out = to(o_acc, device_, dtype_, "kept FA output");
      pass.save->fa_lse = lse;
      attn = pass.save->fa_out.view();
    }
  }
  ScopedPhase phase(timer, Phase::other);
  const TensorView fa_heads = block.heads.view().reshape({t, H * d}).narrow(1, 0, hfa * d);
  if (hydra) {
    ops::sigmoid_gate(fa_heads, attn.reshape({t, hfa * d}), pv.narrow(1, col.fa_gate, hfa * d));
  } else {
    copy_into(fa_heads, attn.reshape({t, hfa * d}));
  }
}

void Model::gdn_branch(ForwardContext& context, int64_t layer, const Tensor& positions, const LayerPass& pass,
                       AttentionTrace& block) const {
  const LayerWeights& w = layers_at(layer);
  const ProjectionColumns& col = layout(layer).columns;
  const TensorView pv = block.proj.view();
  const int64_t t = pv.size(0), d = config_.head_dim, hfa = w.h_fa, hg = w.h_gdn;
  PhaseTimer* timer = context.timer;
  KvCache* cache = context.cache;  // prefill, decode
  const LayerBuffers b = layer_buffers(config_, layout(layer), t, dtype_, acc_dtype());
  // conv + SiLU with the halo, then RoPE and the L2 norm of q and k, in one pass (ops::gdn_qkv_conv).
  block.conv = b.conv.empty(device_, "GDN conv");
  block.inv_norm = b.inv_norm.empty(device_, "q/k inverse norms");  // their backward needs them
  const TensorView qkv = pv.narrow(1, col.gdn_qkv, 3 * hg * d);
  block.beta = b.gate.empty(device_, "beta");
  block.g = b.gate.empty(device_, "g");
  const TensorView out = block.heads.view().narrow(1, hfa, hg);
  if (pass.mode == LayerMode::decode) {  // the whole branch against the cached conv tails and states
    ScopedPhase phase(timer, Phase::gdn);
    cache->gdn_decode(layer,
                      {.out = out, .conv_out = block.conv, .inv_norm = block.inv_norm, .beta = block.beta, .g = block.g,
                       .x = qkv, .conv_w = w.conv, .b_logits = pv.narrow(1, col.gdn_b, hg),
                       .a_logits = pv.narrow(1, col.gdn_a, hg), .a_log = w.a_log, .dt_bias = w.dt_bias},
                      gdn_qk_params(hg), delta_rule_params());
    return;
  }
  {
    const GdnQkFinish finish{positions, block.inv_norm, gdn_qk_params(hg)};
    causal_conv_sequence_parallel(context.comm, context.sequence(), block.conv, qkv, w.conv, timer, &finish);
    if (pass.mode == LayerMode::prefill) cache->store_conv_tail(layer, qkv);
  }
  const TensorView q = head_columns(block.conv, 0, hg, d), k = head_columns(block.conv, hg * d, hg, d);
  const TensorView v = head_columns(block.conv, 2 * hg * d, hg, d);
  {
    ScopedPhase phase(timer, Phase::gdn);
    ops::gdn_gates(block.beta, block.g, pv.narrow(1, col.gdn_b, hg), pv.narrow(1, col.gdn_a, hg), w.a_log, w.dt_bias);
  }
  const LayerSaved* replay = pass.replay;
  if (pass.mode == LayerMode::replay && replay->gdn_out.defined()) {  // kept by the forward (KeptActivations::gdn_outputs)
    ScopedPhase phase(timer, Phase::gdn);
    copy_into(out, replay->gdn_out);
  } else if (pass.mode == LayerMode::replay) {
    gdn_sequence_parallel_recompute(context.sequence(), replay->gdn, out, q, k, v, block.g, block.beta,
                                    delta_rule_params(), timer);
  } else {  // forward, save, prefill: the sequence-parallel scan (a prefill keeps the final state)
    const bool save = pass.mode == LayerMode::save;
    gdn_sequence_parallel(context.comm, context.sequence(), out, q, k, v, block.g, block.beta, delta_rule_params(),
                          timer, save ? &pass.save->gdn : nullptr,
                          pass.mode == LayerMode::prefill ? cache->final_state(layer) : TensorView());
    if (save && context.keep.gdn_outputs) {
      ScopedPhase phase(timer, Phase::gdn);
      pass.save->gdn_out = clone(out, "kept GDN outputs");
    }
  }
}

void Model::mlp_tile(ForwardContext& context, int64_t layer, const TensorView& x, const TensorView& x_norm,
                     const TensorView& gate_up, const TensorView& h, MlpGateUp gate_up_state) const {
  const LayerWeights& w = layers_at(layer);
  const int64_t I = config_.intermediate_size;
  const ops::RmsNormParams post_norm{static_cast<float>(config_.rms_norm_eps)};
  if (gate_up_state == MlpGateUp::compute && norm_in_projection(context, x, w.post_norm, w.mlp_in)) {
    ScopedPhase phase(context.timer, Phase::gemm);  // a decode step: the norm inside the GEMV
    ops::gemv_rms_norm(gate_up, x, {w.post_norm, post_norm}, w.mlp_in, kernels_.gemv_tuning);
  } else {
    {
      ScopedPhase phase(context.timer, Phase::other);
      ops::rms_norm(x_norm, x, w.post_norm, post_norm);
    }
    if (gate_up_state == MlpGateUp::compute) {
      ScopedPhase phase(context.timer, Phase::gemm);
      project(context, gate_up, x_norm, w.mlp_in);
    }
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
  Tensor x_norm = b.tile_x_norm.empty(device_, "MLP tile");
  Tensor gu_tile = gate_up.defined() ? Tensor() : b.tile_gate_up.empty(device_, "MLP gate/up tile");
  Tensor h = b.tile_h.empty(device_, "MLP tile");
  for (int64_t t0 = 0; t0 < t; t0 += tile) {  // token-local: tiles bound the intermediate's size
    const int64_t n = std::min(tile, t - t0);
    const TensorView xt = x.narrow(0, t0, n), ht = h.view().narrow(0, 0, n);
    const TensorView gu = gate_up.defined() ? gate_up.narrow(0, t0, n) : gu_tile.view().narrow(0, 0, n);
    mlp_tile(context, layer, xt, x_norm.view().narrow(0, 0, n), gu, ht, MlpGateUp::compute);
    ScopedPhase phase(context.timer, Phase::gemm);
    project(context, xt, ht, w.mlp_down, ops::Accumulate::yes);
  }
}

bool Model::gpu_decoding(const ForwardContext& context) const {
  return context.cache != nullptr && context.cache->decoding() && device_ == Device::cuda;
}

bool Model::norm_in_projection(const ForwardContext& context, const TensorView& x, const TensorView& gamma,
                               const TensorView& w) const {
  return gpu_decoding(context) && kernels_.decode_gemv == ops::DecodeGemvKernel::hydra_norm &&
         ops::gemv_rms_norm_supported(x, gamma, w);
}

void Model::project(const ForwardContext& context, const TensorView& out, const TensorView& x, const TensorView& w,
                    ops::Accumulate accumulate) const {
  // The GEMV is a GPU kernel choice: on the host ops::linear (OpenBLAS) is the fast path.
  if (gpu_decoding(context) && kernels_.decode_gemv != ops::DecodeGemvKernel::cublas && ops::gemv_supported(out, x, w)) {
    ops::gemv(out, x, w, accumulate, kernels_.gemv_tuning);
  } else {
    ops::linear(out, x, w, accumulate);
  }
}

void Model::lm_head(const TensorView& logits, const TensorView& hidden) const {
  expect_shape(logits, "logits", {{"n", hidden.size(0)}, {"V", config_.vocab_size}});
  ops::linear(logits, hidden, weights_.lm_head);
}

}  // namespace hydra
