// A model ready to run: config plus runtime weights on one device, and the forward pass.
//
// The checkpoint keeps HF parameter paths; at load time each layer's input projections are fused
// into one matrix so a layer needs one GEMM for all of q/k/v/gates, and the heads are put in
// "physical" order — FA heads first, then GDN heads — so each branch reads one contiguous column
// block. W_o's columns and the fusion weights are permuted to match, which leaves the math
// (SPEC 1.2) unchanged. Fused row layout (per layer):
//   qwen3:      [W_q (H·d) | W_k (G·d) | W_v (G·d)]
//   hydrahead:  [W_q FA (H_fa·d) | W_k (G_fa·d) | W_v (G_fa·d) | W_fgate (H_fa·d) |
//                W_q GDN (H_gdn·d) | W_kl (H_gdn·d) | W_vl (H_gdn·d) | w_a (H_gdn) | w_b (H_gdn)]
// The fused matrix is zero-padded to a multiple of 64 rows so every column block starts 16-byte
// aligned on the GPU. The forward pass runs on this rank's tokens of a SequenceLayout; with one
// rank that is the whole sequence. Only attention, the GDN scan and the conv cross ranks
// (parallel/). The MLP runs in token tiles (kMlpTileTokens) so its [T, 2I] intermediate never
// exists whole at long context.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "model/config.h"
#include "parallel/communicator.h"
#include "parallel/layout.h"
#include "runtime/checkpoint.h"
#include "runtime/phase_timer.h"

namespace hydra {

// Hooks into the forward pass (calibration, head patching). Called on every rank for its tokens.
class LayerObserver {
 public:
  virtual ~LayerObserver() = default;
  // Per-head outputs of layer `layer` just before W_o, o [T_loc, H, d] in physical head order:
  // head_of[p] is the model head stored at position p. For the teacher this is the attention
  // output of each head; for HydraHead the fused y_h. May be modified in place (patching).
  virtual void on_head_outputs(int64_t layer, const TensorView& o, std::span<const int> head_of) = 0;
};

struct ForwardContext {
  Communicator& comm;
  SequenceLayout layout;
  LayerObserver* observer = nullptr;
  PhaseTimer* timer = nullptr;                      // per-phase timing (prefill), optional
  std::function<void(int64_t layer)> after_layer;   // progress / watchdog hook, optional
};

struct LayerWeights {
  Tensor input_norm, post_norm;  // [D]
  Tensor in_proj;                // [N_in, D], layout in the header comment
  Tensor q_norm, k_norm;         // [d] (teacher, or FA heads)
  Tensor conv;                   // [3·H_gdn·d, K]: q, k, v channels
  Tensor a_log, dt_bias;         // [H_gdn]
  Tensor fuse_norm;              // [H, d], physical order
  Tensor fuse_gamma;             // [H], physical order
  Tensor o_proj;                 // [D, H·d], columns in physical order
  Tensor mlp_in;                 // [2I, D]: gate rows then up rows
  Tensor mlp_down;               // [D, I]
  std::vector<int> head_of;      // physical position -> model head
  std::vector<int> fa_kv_of;     // FA head (physical) -> row block of k/v (0..G_fa−1)
  int64_t h_fa = 0, g_fa = 0, h_gdn = 0;
};

inline constexpr int64_t kMlpTileTokens = 32768;

class Model {
 public:
  // `params` are tensors named as in model/params.h (host f32, or already on the GPU); weights are
  // placed on `device` in `dtype` (host: f32; cuda: bf16 storage, fp32 norm/fusion/GDN scalars).
  Model(ModelConfig config, const NamedTensors& params, Device device = Device::host, DType dtype = DType::f32);
  // Reads, validates and places a checkpoint.
  static Model load(const std::string& path, Device device = Device::host, DType dtype = DType::f32);

  const ModelConfig& config() const { return config_; }
  Device device() const { return device_; }
  DType dtype() const { return dtype_; }

  // Final-normed hidden states [T_loc, D] of this rank's tokens; ids [T_loc] int32 in local order.
  Tensor forward(ForwardContext& context, const TensorView& ids) const;
  // logits [n, V] for hidden rows [n, D].
  void lm_head(const TensorView& logits, const TensorView& hidden) const;

  // ---- Read access for interpretability (model/model_access.cpp) ----
  // Head selection (model/head_selection.h) reads the placed weights to compute direct effects and
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
  void attention_teacher(ForwardContext& context, int64_t layer, const Tensor& positions, const TensorView& x_norm,
                         const TensorView& x) const;
  void attention_hydra(ForwardContext& context, int64_t layer, const Tensor& positions, const TensorView& x_norm,
                       const TensorView& x) const;
  void mlp(ForwardContext& context, int64_t layer, const TensorView& x) const;

  ModelConfig config_;
  Device device_;
  DType dtype_;
  Tensor embed_;     // [V, D]
  Tensor final_norm_;  // [D]
  Tensor lm_head_;   // [V, D]; the embedding when tied
  std::vector<LayerWeights> layers_;
};

// Reads the checkpoint's config and all tensors as host f32 (validated against the config).
struct LoadedCheckpoint {
  ModelConfig config;
  NamedTensors params;
};
LoadedCheckpoint read_model_checkpoint(const std::string& path);
void write_model_checkpoint(const std::string& path, const ModelConfig& config, const NamedTensors& params);

}  // namespace hydra
