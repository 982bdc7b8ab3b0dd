// Rotary position embedding, rotate-half convention (HF Qwen3): for pair (i, i + d/2) of a head,
// angle = pos · theta^(−2i/d), x_i' = x_i cos − x_{i+d/2} sin, x_{i+d/2}' = x_{i+d/2} cos + x_i sin.
// Positions are global token positions (sequence parallelism keeps them), angles in fp64 on the
// CPU so positions in the millions keep their precision.
#pragma once

#include "runtime/tensor.h"

namespace hydra::ops {

// forward rotates by +angle; inverse by −angle, which is the transpose of the rotation and so the
// backward: the gradient of rope(x) is rope(dy) with RopeDirection::inverse.
enum class RopeDirection { forward, inverse };

// The default θ of every RoPE parameter: Qwen3's (the GDN input pass, gdn_qk.h, and ModelConfig,
// model/config.h, take it from here; a checkpoint's config sets its own).
inline constexpr double kDefaultRopeTheta = 1e6;

struct RopeParams {
  double theta = kDefaultRopeTheta;
  RopeDirection direction = RopeDirection::forward;
};

// x [T, H, d] in place; positions [T] int64.
void rope(const TensorView& x, const TensorView& positions, const RopeParams& params);

#if HYDRA_CUDA
namespace cuda_impl {  // rope.cu; called by the dispatcher for CUDA views
void rope(const TensorView& x, const TensorView& positions, const RopeParams& params);
}  // namespace cuda_impl
#endif

}  // namespace hydra::ops
