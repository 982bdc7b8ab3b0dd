// The RoPE angle on the GPU, one form for every kernel that rotates: rope.cu, the GDN input pass
// (gdn_qk.cu) and its decode step (gdn_qk_step.cu). Included only by .cu files.
//
//   inv_freq_i = θ^(−2i/d) = exp(−2i · ln θ / d),  angle = pos · inv_freq_i,
//
// both in fp64, then reduced to [−π, π] in fp64 before the fp32 sincos, so positions in the millions
// keep their precision (an fp32 angle is off by ~0.1 rad at 512K). The reduction is a − 2π·rint(a/2π):
// a multiply and a rounding (fmod is a loop of fp64 divisions), and the fp32 argument lands in
// [−π, π], the range where sincosf is most accurate. The CPU forms (rope_reference.cpp) take sin and cos of the
// fp64 angle directly.
#pragma once

#include <cmath>
#include <cstdint>

namespace hydra::ops::cuda_impl {

// ln θ / d, the argument the kernels take (formed once on the host).
inline double rope_log_theta_over_d(double theta, int64_t head_dim) {
  return std::log(theta) / static_cast<double>(head_dim);
}

__device__ __forceinline__ double rope_inv_freq(int64_t i, double log_theta_over_d) {
  return exp(-double(2 * i) * log_theta_over_d);
}

// (cos, sin) of pos · inv_freq.
__device__ __forceinline__ float2 rope_cos_sin(int64_t pos, double inv_freq) {
  const double angle = double(pos) * inv_freq;
  const double reduced = angle - 6.283185307179586 * rint(angle * 0.15915494309189535);
  float s, c;
  sincosf(float(reduced), &s, &c);
  return make_float2(c, s);
}

}  // namespace hydra::ops::cuda_impl
