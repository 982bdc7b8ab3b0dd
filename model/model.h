// A model ready to run and to train: config plus runtime weights on one device (model.cpp), the
// forward pass (model_forward.cpp: one layer implementation for every pass) and the backward pass
// (model_backward.cpp).
//
// The checkpoint keeps HF parameter paths; at load time each layer's tensors are packed into the
// runtime layout that model/weight_layout.h describes (one fused input projection, heads in physical
// order: FA first, then GDN), which leaves the math (DESIGN.md §1.2) unchanged. Gradients live in
// the same runtime layout and are unpacked to checkpoint names with the same description.
// The forward pass runs on this rank's tokens of a SequenceLayout; with one rank that is the whole
// sequence. Only attention, the GDN scan and the conv cross ranks (parallel/). The MLP runs in
// token tiles (kMlpTileTokens) so its [T, 2I] intermediate never exists whole at long context.
//
// Element types: the CPU path computes in the model's dtype (f32, the reference; f64 for gradient
// checks); the GPU path stores bf16 and accumulates in fp32 (DESIGN.md §2). acc_dtype() is the type
// of norm weights, fusion/GDN scalars, attention accumulators and every gradient.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "model/config.h"
#include "model/layer_buffers.h"
#include "model/weight_layout.h"
#include "kernels/kernel_options.h"
#include "parallel/communicator.h"
#include "parallel/gdn_scan.h"
#include "parallel/layout.h"
#include "runtime/checkpoint.h"
#include "runtime/phase_timer.h"

namespace hydra {

class KvCache;  // model/kv_cache.h

// Hooks into the forward pass (calibration, head patching). Called on every rank for its tokens.
class LayerObserver {
 public:
  virtual ~LayerObserver() = default;
  // Per-head outputs of layer `layer` just before W_o, o [T_loc, H, d] in physical head order:
  // head_of[p] is the model head stored at position p. For the teacher this is the attention
  // output of each head; for HydraHead the fused y_h. May be modified in place (patching).
  virtual void on_head_outputs(int64_t layer, const TensorView& o, std::span<const int> head_of) = 0;
};

// What a pass runs on. Every mode but decode reads the sequence's layout over the ranks; a decode
// step's rows are the cache's (KvCache::begin_decode), so its context has none (run_layers checks
// that the layout is there exactly when the mode is not LayerMode::decode).
struct ForwardContext {
  Communicator& comm;
  std::optional<SequenceLayout> layout = {};
  LayerObserver* observer = nullptr;
  PhaseTimer* timer = nullptr;                      // per-phase timing (prefill), optional
  std::function<void(int64_t layer)> after_layer = {};  // progress / watchdog hook, optional
  // Training: what a forward that saves for the backward keeps beyond the minimum (model/layer_buffers.h).
  KeptActivations keep = {};
  // Generation (model/kv_cache.h): a prefill forward fills the cache; Model::decode_step reads and
  // extends it. The layer calls its hooks; null: no cache.
  KvCache* cache = nullptr;
  // The layout, for the modes that read one (HYDRA_ASSERT that there is one).
  const SequenceLayout& sequence() const;
};

// The runtime tensors of one layer (model/weight_layout.h), or their gradients (same shapes, in
// acc_dtype()). Tensors a layer does not have are undefined.
struct LayerWeights {
  Tensor input_norm, post_norm;  // [D]
  Tensor in_proj;                // [rows, D], the fused projection
  Tensor q_norm, k_norm;         // [d] (teacher, or FA heads)
  Tensor conv;                   // [3·H_gdn·d, K]: q, k, v channels
  Tensor a_log, dt_bias;         // [H_gdn]
  Tensor fuse_norm;              // [H, d], physical order (fusions with a norm)
  Tensor fuse_gamma;             // [H], physical order (fusions with a γ)
  Tensor fuse_gate_bias;         // [H], physical order (the fusion gate; its u are rows of in_proj)
  Tensor o_proj;                 // [D, H·d], columns in physical order
  Tensor mlp_in;                 // [2I, D]: gate rows then up rows
  Tensor mlp_down;               // [D, I]
  std::vector<int> head_of;      // physical position -> model head
  std::vector<int> fa_kv_of;     // FA head (physical) -> row block of k/v (0..G_fa−1)
  int64_t h_fa = 0, g_fa = 0, h_gdn = 0;

  Tensor& slot(Slot s);
  const Tensor& slot(Slot s) const;
};

// Every runtime tensor of a model: its weights, or gradients / optimizer moments in the same layout.
struct ModelTensors {
  Tensor embed;       // [V, D]
  Tensor final_norm;  // [D]
  Tensor lm_head;     // [V, D]; the embedding itself (same storage) when tied
  std::vector<LayerWeights> layers;
  bool tied = false;

  // Visits every distinct defined tensor with its runtime name ("embed", "final_norm", "lm_head",
  // "layers.3.in_proj"); a tied lm_head is the embedding and is visited once, as "embed".
  void for_each(const std::function<void(const std::string& name, Tensor& tensor)>& visit);
  void for_each(const std::function<void(const std::string& name, const Tensor& tensor)>& visit) const;
};

// What a layer's forward keeps for its backward (training). Chosen for memory at 512K tokens:
//  - input: the residual stream entering the layer [T_loc, D]; the whole layer is recomputed from it;
//  - fa_out, fa_lse: the FA heads' attention output (before the gate) [T_loc, H_fa, d] and its
//    log-sum-exp [H_fa, T_loc]; attention is the one part whose recomputation would cost as much as
//    the rest of the layer, and its output is only H_fa·d values per token (2 of 16 heads at 7:1);
//  - gdn: with several ranks, each local segment's initial state and its own transition M (d×d per
//    head and local segment: the same bytes at any rank count); the backward gathers the later
//    segments' M with its state gradients. The GDN chunk states themselves are recomputed in the
//    backward.
struct LayerSaved {
  Tensor input;   // [T_loc, D], dtype()
  Tensor fa_out;  // [T_loc, H_fa, d], dtype()
  Tensor fa_lse;  // [H_fa, T_loc], acc_dtype()
  Tensor gdn_out; // [T_loc, H_gdn, d], dtype(): the GDN heads' outputs (KeptActivations::gdn_outputs)
  Tensor proj;    // [T_loc, rows], dtype(): the fused projection (KeptActivations::projection)
  Tensor mlp_gate_up;  // [T_loc, 2I], dtype(): the MLP's gate | up (KeptActivations::mlp_layers)
  GdnSaved gdn;
};

// The intermediates of a layer's attention block that its backward reads: what the recomputation
// (a LayerPass that replays) returns. Physical head order; undefined for a branch the layer lacks.
struct AttentionTrace {
  Tensor x_norm;        // [T_loc, D]: input norm
  Tensor proj;          // [T_loc, rows]: the fused projection
  Tensor fa_q, fa_k;    // [T_loc, H_fa, d], [T_loc, G_fa, d]: after the q/k norms (teacher: and RoPE)
  Tensor conv;          // [T_loc, 3·H_gdn·d]: q̂ | k̂ | v after the fused conv, RoPE and L2 norm
  Tensor inv_norm;      // [T_loc, 2·H_gdn], acc_dtype(): the q/k L2 norms' inverses
  Tensor beta, g;       // [T_loc, H_gdn], acc_dtype(): the GDN gates
  Tensor heads;         // [T_loc, H, d]: per-head outputs before fusion
  Tensor fused;         // [T_loc, H, d]: what W_o reads (the teacher: heads itself)
};

// How one pass of a layer runs (model_forward.cpp), named by the door that runs it:
enum class LayerMode {
  forward,  // x ← layer(x): inference, evaluation, a teacher
  save,     // the same, and what the backward needs goes into a LayerSaved (training)
  replay,   // the backward's recomputation from a LayerSaved, returning its AttentionTrace; reruns
            // neither attention nor the GDN scan's collective
  prefill,  // a forward that also fills context.cache (generation, model/kv_cache.h)
  decode,   // one row per sequence against context.cache, which it reads and extends; the
            // context's layout is not read (the cache holds the positions)
};
const char* layer_mode_name(LayerMode mode);

// A layer pass: its mode and what that mode reads or writes (the rest null). Built by the named
// constructors, so a mode always comes with its tensors.
struct LayerPass {
  LayerMode mode = LayerMode::forward;
  LayerSaved* save = nullptr;          // save
  const LayerSaved* replay = nullptr;  // replay
  AttentionTrace* trace = nullptr;     // replay
  SideWork* prefetch = nullptr;        // decode: the layer's L2 weight prefetch (run_layer joins it)
  static LayerPass forward() { return {}; }
  static LayerPass saving(LayerSaved& saved) { return {.mode = LayerMode::save, .save = &saved}; }
  static LayerPass replaying(const LayerSaved& saved, AttentionTrace& trace) {
    return {.mode = LayerMode::replay, .replay = &saved, .trace = &trace};
  }
  static LayerPass with_cache(LayerMode mode) { return {.mode = mode}; }  // prefill or decode
};

// Whether weights holding NaN or Inf may load (read_model_checkpoint, Model::load).
enum class NonFinite { refuse, allow };

class Model {
 public:
  // `params` are tensors named as in model/params.h (host f32, or already on the GPU); weights are
  // placed on `device` in `dtype` (host: f32, or f64 for gradient checks; cuda: bf16 storage with
  // fp32 norm/fusion/GDN scalars).
  Model(ModelConfig config, const NamedTensors& params, Device device = Device::host, DType dtype = DType::f32);
  // Reads, validates and places a checkpoint (non-finite weights: see read_model_checkpoint).
  static Model load(const std::string& path, Device device = Device::host, DType dtype = DType::f32,
                    NonFinite nonfinite = NonFinite::refuse);

  const ModelConfig& config() const { return config_; }
  Device device() const { return device_; }
  DType dtype() const { return dtype_; }
  // Accumulators, norm weights and gradients: f32 (the model's dtype on a host f64 model).
  DType acc_dtype() const { return dtype_ == DType::f64 ? DType::f64 : DType::f32; }
  // The GDN branch's fused q/k finish (RoPE, L2 norm) for a layer of `gdn_heads` GDN heads.
  ops::GdnQkParams gdn_qk_params(int64_t gdn_heads) const {
    return {.qk_heads = 2 * gdn_heads, .head_dim = config_.head_dim, .rope_theta = config_.rope_theta,
            .l2_eps = static_cast<float>(config_.l2_norm_eps)};
  }
  const LayerLayout& layout(int64_t layer) const { return layouts_.at(static_cast<size_t>(layer)); }
  // Kernel choices and measurement switches (kernels/kernel_options.h), copied into every op this
  // model runs; the defaults are the production choices. launch/ sets what the environment asked.
  const ops::KernelOptions& kernel_options() const { return kernels_; }
  void set_kernel_options(const ops::KernelOptions& kernels) { kernels_ = kernels; }
  // The op parameters of a layer's branches, with the kernel options in.
  ops::AttentionParams attention_params(int64_t layer) const;
  ops::DeltaRuleParams delta_rule_params() const {
    return {.segments = kernels_.gdn_segments, .profile = kernels_.gdn_profile, .decode_kernel = kernels_.gdn_decode};
  }

  // ---- Forward ----
  // Final-normed hidden states [T_loc, D] of this rank's tokens; ids [T_loc] int32 in local order.
  Tensor forward(ForwardContext& context, const TensorView& ids) const;
  // The residual stream after the last layer, before the final norm [T_loc, D]:
  // forward = final_norm(forward_residual) (head selection reads the pre-norm stream).
  Tensor forward_residual(ForwardContext& context, const TensorView& ids) const;
  // One decode step (generation, model/model_decode.cpp): ids [B] int32, the next token of each row
  // of the step context.cache->begin_decode set up (replicated on every rank of context.comm);
  // returns the final-normed hidden states [B, D]. Runs the same layer as the forward.
  Tensor decode_step(ForwardContext& context, const TensorView& ids) const;
  // logits [n, V] for hidden rows [n, D].
  void lm_head(const TensorView& logits, const TensorView& hidden) const;

  // The forward's parts, for training and for callers that start or stop at a layer boundary:
  // forward = final_norm(layer_{L−1}(…layer_0(embed(ids)))).
  Tensor embed(const TensorView& ids) const;                      // residual stream [T_loc, D]
  // RoPE positions [T_loc] int64: global positions, restarting at every packed document's start.
  Tensor positions(const SequenceLayout& layout) const;
  // One layer: x [T_loc, D] ← layer(x) in place (LayerMode::forward, or save when `saved` is given:
  // it receives what the backward needs). A cache pass goes through run_layers.
  void layer_forward(ForwardContext& context, int64_t layer, const Tensor& positions, const TensorView& x,
                     LayerSaved* saved = nullptr) const;
  // The layer loop every door shares (forward, prefill, decode, the training forward): x [T_loc, D]
  // ([B, D] decoding) through every layer in `mode` (forward, save, prefill or decode); with save,
  // saved[l] receives what layer l's backward needs. After each layer: hook(l), then
  // context.after_layer(l).
  void run_layers(ForwardContext& context, LayerMode mode, const Tensor& positions, const TensorView& x,
                  std::span<LayerSaved> saved = {}, const std::function<void(int64_t layer)>& hook = {}) const;
  Tensor final_norm(const TensorView& x) const;                   // [T_loc, D]

  // ---- Backward (model_backward.cpp) ----
  // Gradients are accumulated (+=) into `grads` (zeros(), then any number of backward calls); a
  // gradient tensor left undefined there is not computed (frozen parameters, e.g. the MLP in the
  // align stage). Activation gradients: dx is acc_dtype().
  //
  // dx [T_loc, D]: in, the gradient w.r.t. the layer's output; out, w.r.t. its input. Collective
  // (same order on every rank) like the forward.
  // `input_gradient` skip: the input's gradient is not formed; dx is left holding the gradient
  // w.r.t. the mid-layer residual (after the MLP backward), which the caller discards (layer-wise
  // alignment stops every layer's backward at its input, DESIGN.md §1.5).
  enum class InputGradient { compute, skip };
  void layer_backward(ForwardContext& context, int64_t layer, const Tensor& positions, const LayerSaved& saved,
                      const TensorView& dx, LayerWeights& grads,
                      InputGradient input_gradient = InputGradient::compute) const;
  // dx [T_loc, D] ← gradient w.r.t. the last residual stream x, from d_hidden w.r.t. final_norm(x).
  void final_norm_backward(const TensorView& dx, const TensorView& d_hidden, const TensorView& x,
                           ModelTensors& grads) const;
  // Embedding rows' gradient from dx w.r.t. embed(ids).
  void embed_backward(const TensorView& dx, const TensorView& ids, ModelTensors& grads) const;

  // ---- Weights ----
  const ModelTensors& weights() const { return weights_; }
  // For the optimizer, which writes updated weights in place (between steps, never during one).
  ModelTensors& mutable_weights() { return weights_; }
  // Zero tensors in the runtime layout, in acc_dtype() on `device` (gradients, moments, masters);
  // `keep` decides per checkpoint name whether a tensor is allocated (undefined: frozen).
  ModelTensors zeros_like_weights(DType dtype, const std::function<bool(const std::string& name)>& keep = {}) const;
  // Runtime-layout tensors (weights, gradients, moments) unpacked to checkpoint names, host f32
  // (f64 for the tensors of a host f64 model).
  NamedTensors unpack(const ModelTensors& tensors) const;
  // Checkpoint-named tensors packed into `out` (same layout; any device/dtype per its tensors).
  void pack(const NamedTensors& params, ModelTensors& out) const;

  // ---- Read access for interpretability (model/model_access.cpp) ----
  // Head selection (model/selection/head_selection.h) reads the placed weights to compute direct effects and
  // to replay the residual stream at a few positions. Views of the runtime layout (fused, physical
  // head order, on device() in dtype()); nothing here changes the model.
  const LayerWeights& layer_weights(int64_t layer) const;
  const Tensor& embedding_table() const;   // [V, D]
  const Tensor& final_norm_weight() const;  // [D], f32
  const Tensor& lm_head_weight() const;     // [V, D]; the embedding when tied
  // Position of model head `head` in the layer's physical order (head_of⁻¹).
  int64_t physical_head(int64_t layer, int64_t head) const;
  // W_o columns that read model head `head`: [D, d], a strided view of the layer's o_proj.
  TensorView head_output_projection(int64_t layer, int64_t head) const;

 private:
  // One layer in the pass's mode: the attention block, then the MLP (keeping its gate/up when saving
  // and context.keep says so).
  void run_layer(ForwardContext& context, int64_t layer, const Tensor& positions, const TensorView& x,
                 const LayerPass& pass) const;
  // x [T_loc, D] += W_o fusion(heads): the attention block of a teacher or HydraHead layer, the one
  // implementation that every pass runs (LayerPass; model_forward.cpp).
  void attention_block(ForwardContext& context, int64_t layer, const Tensor& positions, const TensorView& x,
                       const LayerPass& pass) const;
  // Its two branches, in the pass's mode: each writes its heads' columns of block.heads from
  // block.proj and fills the intermediates its backward reads (FA: fa_q, fa_k; GDN: conv,
  // inv_norm, beta, g).
  void fa_branch(ForwardContext& context, int64_t layer, const Tensor& positions, const LayerPass& pass,
                 AttentionTrace& block) const;
  void gdn_branch(ForwardContext& context, int64_t layer, const Tensor& positions, const LayerPass& pass,
                  AttentionTrace& block) const;
  // x += MLP(post_norm(x)); gate_up [T_loc, 2I], when defined, receives the MLP's gate | up (kept
  // for the backward) instead of a tile buffer.
  void mlp(ForwardContext& context, int64_t layer, const TensorView& x, const TensorView& gate_up = {}) const;
  // One token tile of the MLP up to its intermediate, shared by the forward and the backward's
  // recomputation: x_norm [n, D] ← post_norm(x), gate_up [n, 2I] ← x_norm·W_inᵀ (unless `kept`:
  // the forward stored it), h [n, I] ← SiLU(gate) ⊙ up.
  enum class MlpGateUp { compute, kept };
  void mlp_tile(ForwardContext& context, int64_t layer, const TensorView& x, const TensorView& x_norm,
                const TensorView& gate_up, const TensorView& h, MlpGateUp gate_up_state) const;
  // A layer's projection out (+)= x · wᵀ: ops::linear, or in a decode step on the GPU (the context's
  // cache is decoding) the GEMV when the kernel option decode_gemv asks for it and it takes the views.
  void project(const ForwardContext& context, const TensorView& out, const TensorView& x, const TensorView& w,
               ops::Accumulate accumulate = ops::Accumulate::no) const;
  // Whether the projection w of rms_norm(x; gamma) runs as one GEMV with the norm fused
  // (ops::gemv_rms_norm): a decode step on the GPU with decode_gemv = hydra-norm, on views it takes.
  // Its output is then a fresh [T, N] buffer of the model's dtype (what gemv needs of it).
  bool norm_in_projection(const ForwardContext& context, const TensorView& x, const TensorView& gamma,
                          const TensorView& w) const;
  bool gpu_decoding(const ForwardContext& context) const;  // a decode step (the cache decoding) on the GPU
  // The parts of layer_backward (model_backward.cpp). mlp_backward: the MLP's tiles, recomputed
  // from x_mid [T_loc, D] (the residual after attention); dx in: w.r.t. the layer's output, out:
  // w.r.t. x_mid. The branches read the replayed block (`trace`) and d_heads [T_loc, H, d], and write
  // their columns of the projection's gradient dproj [T_loc, rows] and their parameter gradients.
  struct BranchGradients {
    TensorView d_heads;
    TensorView dproj;
    LayerWeights& grads;
  };
  void mlp_backward(ForwardContext& context, int64_t layer, const LayerSaved& saved, const TensorView& x_mid,
                    const TensorView& dx, LayerWeights& grads) const;
  void fa_branch_backward(ForwardContext& context, int64_t layer, const Tensor& positions, const LayerSaved& saved,
                          const AttentionTrace& trace, const BranchGradients& into) const;
  void gdn_branch_backward(ForwardContext& context, int64_t layer, const Tensor& positions, const LayerSaved& saved,
                           const AttentionTrace& trace, const BranchGradients& into) const;
  DType place_dtype(Slot slot) const;  // dtype() for GEMM weights, acc_dtype() for the rest
  const LayerWeights& layers_at(int64_t layer) const { return weights_.layers.at(static_cast<size_t>(layer)); }

  ModelConfig config_;
  Device device_;
  DType dtype_;
  std::vector<LayerLayout> layouts_;
  ModelTensors weights_;
  ops::KernelOptions kernels_;
};

// Reads the checkpoint's config and all tensors as host f32 (validated against the config). Weights
// holding NaN or Inf are a UserError naming the tensor unless `nonfinite` is allow (model/nonfinite.h).
struct LoadedCheckpoint {
  ModelConfig config;
  NamedTensors params;
};
LoadedCheckpoint read_model_checkpoint(const std::string& path, NonFinite nonfinite = NonFinite::refuse);
// The config of a checkpoint alone (cheap: its attributes); malformed configs are UserErrors.
ModelConfig read_model_config(const std::string& path);
void write_model_checkpoint(const std::string& path, const ModelConfig& config, const NamedTensors& params);

}  // namespace hydra
