// The GDN gates of one (token, head) on the device, the one statement of their formula for every
// kernel that forms them: the gates kernel and its backward (gdn_gates.cu) and the fused decode
// step (kernels/gdn_decode/gdn_decode.cu). fp32, the CPU reference's formula
// (gdn_gates_reference.cpp): β = σ(b), g = −exp(A_log)·softplus(a + dt_bias), in three parts so a
// kernel can load A_log after its other work (softplus(x) = x above 20, where log1p(eˣ) rounds to x).
#pragma once

namespace hydra::ops::cuda_impl {

__device__ __forceinline__ float gdn_beta(float b_logit) { return 1.0f / (1.0f + expf(-b_logit)); }

// softplus(a + dt_bias)
__device__ __forceinline__ float gdn_softplus(float a_logit, float dt_bias) {
  const float x = a_logit + dt_bias;
  return x > 20.0f ? x : log1pf(expf(x));
}

// g from gdn_softplus's value
__device__ __forceinline__ float gdn_g(float softplus, float a_log) { return -expf(a_log) * softplus; }

}  // namespace hydra::ops::cuda_impl
