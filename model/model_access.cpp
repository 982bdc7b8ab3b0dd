// Read access to a placed Model's weights, for interpretability (head selection).
//
// Why a file of its own: model.cpp places the weights and model_forward.cpp / model_backward.cpp
// run the passes, and both change with the GPU path; these accessors only expose what is already
// placed, so they live apart and do not depend on how the passes are organised. Everything returned is in the runtime layout
// (model/model.h header): fused input projections, heads in physical order (FA first; for a Qwen3
// teacher the identity), on device() in dtype() (norm weights f32).
#include <algorithm>

#include "model/model.h"

namespace hydra {

const LayerWeights& Model::layer_weights(int64_t layer) const {
  HYDRA_ASSERT(layer >= 0 && layer < config_.num_layers, "layer {} of a {}-layer model", layer, config_.num_layers);
  return layers_at(layer);
}

const Tensor& Model::embedding_table() const { return weights_.embed; }

const Tensor& Model::final_norm_weight() const { return weights_.final_norm; }

const Tensor& Model::lm_head_weight() const { return weights_.lm_head; }

int64_t Model::physical_head(int64_t layer, int64_t head) const {
  const std::vector<int>& head_of = layer_weights(layer).head_of;
  const auto it = std::find(head_of.begin(), head_of.end(), static_cast<int>(head));
  HYDRA_ASSERT(it != head_of.end(), "head {} is not a head of layer {} ({} heads)", head, layer, head_of.size());
  return it - head_of.begin();
}

TensorView Model::head_output_projection(int64_t layer, int64_t head) const {
  const int64_t d = config_.head_dim;
  return layer_weights(layer).o_proj.view().narrow(1, physical_head(layer, head) * d, d);
}

}  // namespace hydra
