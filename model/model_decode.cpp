// One decode step of generation (model.h Model::decode_step, DESIGN.md §1.6): the rows of the step
// (one new token per sequence) go through the same layer loop as every forward (run_layers,
// model_forward.cpp) in LayerMode::decode, which reads and extends the cache. The
// step's token-local work is replicated on every rank; only FA attention is split over the ranks'
// caches (model/kv_cache.h).
#include "model/kv_cache.h"
#include "model/model.h"

namespace hydra {

Tensor Model::decode_step(ForwardContext& context, const TensorView& ids) const {
  HYDRA_ASSERT(context.cache && context.cache->decoding(), "decode_step without a decode step of a cache");
  const Tensor& positions = context.cache->positions();
  expect_shape(ids, "decode ids", {{"B", positions.size(0)}});
  Tensor x;
  {
    ScopedPhase phase(context.timer, Phase::other);
    x = embed(ids);
  }
  run_layers(context, LayerMode::decode, positions, x);
  ScopedPhase phase(context.timer, Phase::other);
  return final_norm(x);
}

}  // namespace hydra
