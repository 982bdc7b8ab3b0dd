// CUDA decode-step GDN input pass (gdn_qk_step.h): conv + SiLU over the cached tail, RoPE and the
// L2 norm of the q/k heads, and the tail's advance, in one launch.
//
// One CTA per (head, row), d/2 threads: thread i owns channels i and i + d/2 of the head (a RoPE
// pair), reads their K − 1 tail values and the new input, writes the conv output and shifts the
// tail (each thread touches only its own channels, so the in-place shift needs no barrier). q/k
// heads then rotate at the row's position (angles in fp64, reduced mod 2π, as kernels/rope and
// gdn_qk.cu form them) and normalise by a block sum. A decode step runs one launch per layer for all
// rows and heads, instead of a launch per row of the sequence kernel (gdn_qk.cu).
#include "kernels/cuda/common.cuh"
#include "kernels/gdn_qk/gdn_qk_step.h"
#include "kernels/rope/rope_angle.cuh"

namespace hydra::ops::cuda_impl {
namespace {

constexpr int kMaxTaps = 8;
constexpr int kMaxThreads = 128;  // d ≤ 256

struct ConvStepArgs {
  bf16_t* out;
  int64_t out_stride;
  float* inv_norm;
  int64_t inv_stride;
  const bf16_t* x;
  int64_t x_stride;
  const float* w;
  int64_t w_stride;
  bf16_t* tail;  // [S, K−1, C] contiguous, or null (K = 1)
  const int32_t* slots;
  const int64_t* pos;
  int64_t channels, qk_heads;
  int half, taps;
  double log_theta_over_d;
  float eps;
};

__global__ void __launch_bounds__(kMaxThreads) gdn_qkv_conv_step_kernel(const ConvStepArgs a) {
  cuda::wait_for_previous_grid();  // launched through cuda::launch (PDL in a decode step)
  cuda::allow_next_grid();
  const int64_t head = blockIdx.x, b = blockIdx.y;
  const int i = threadIdx.x;  // < half
  const int64_t slot = a.slots != nullptr ? a.slots[b] : b;
  const int64_t c_lo = head * 2 * a.half + i, c_hi = c_lo + a.half;
  const int halo = a.taps - 1;
  bf16_t* tail = a.tail != nullptr ? a.tail + slot * halo * a.channels : nullptr;
  float in_lo[kMaxTaps], in_hi[kMaxTaps];
  for (int m = 0; m < halo; ++m) {
    in_lo[m] = cuda::to_float(tail[m * a.channels + c_lo]);
    in_hi[m] = cuda::to_float(tail[m * a.channels + c_hi]);
  }
  const bf16_t x_lo = a.x[b * a.x_stride + c_lo], x_hi = a.x[b * a.x_stride + c_hi];
  in_lo[halo] = cuda::to_float(x_lo);
  in_hi[halo] = cuda::to_float(x_hi);
  float lo = 0.0f, hi = 0.0f;
  for (int m = 0; m < a.taps; ++m) {
    lo += a.w[c_lo * a.w_stride + m] * in_lo[m];
    hi += a.w[c_hi * a.w_stride + m] * in_hi[m];
  }
  lo *= cuda::fast_sigmoid(lo);
  hi *= cuda::fast_sigmoid(hi);
  // The tail advances: row m ← row m + 1, the last row ← the new input (bf16 as stored).
  for (int m = 0; m + 1 < halo; ++m) {
    tail[m * a.channels + c_lo] = cuda::from_float<bf16_t>(in_lo[m + 1]);
    tail[m * a.channels + c_hi] = cuda::from_float<bf16_t>(in_hi[m + 1]);
  }
  if (halo > 0) {
    tail[(halo - 1) * a.channels + c_lo] = x_lo;
    tail[(halo - 1) * a.channels + c_hi] = x_hi;
  }
  if (head < a.qk_heads) {  // uniform over the block
    const float2 cos_sin = rope_cos_sin(a.pos[b], rope_inv_freq(i, a.log_theta_over_d));
    const float cs = cos_sin.x, sn = cos_sin.y;
    const float r_lo = lo * cs - hi * sn, r_hi = hi * cs + lo * sn;
    lo = r_lo;
    hi = r_hi;
    float ss = lo * lo + hi * hi;
    __shared__ float warp_sums[kMaxThreads / 32];
#pragma unroll
    for (int o = 16; o > 0; o /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if ((i & 31) == 0) warp_sums[i >> 5] = ss;
    __syncthreads();
    float total = 0.0f;
    for (int w = 0; w < (blockDim.x + 31) / 32; ++w) total += warp_sums[w];
    const float inv = rsqrtf(total + a.eps);
    lo *= inv;
    hi *= inv;
    if (i == 0) a.inv_norm[b * a.inv_stride + head] = inv;
  }
  a.out[b * a.out_stride + c_lo] = cuda::from_float<bf16_t>(lo);
  a.out[b * a.out_stride + c_hi] = cuda::from_float<bf16_t>(hi);
}

}  // namespace

void gdn_qkv_conv_step(const TensorView& out, const TensorView& inv_norm, const TensorView& x, const TensorView& w,
                       const TensorView& tail, const TensorView& slots, const TensorView& positions,
                       const GdnQkParams& params) {
  cuda::expect_cuda(out, "conv step out", DType::bf16);
  cuda::expect_cuda(x, "conv step x", DType::bf16);
  cuda::expect_cuda(w, "conv step weight", DType::f32);
  cuda::expect_cuda(inv_norm, "conv step inv_norm", DType::f32);
  if (tail.defined()) {
    cuda::expect_cuda(tail, "conv step tail", DType::bf16);
    HYDRA_ASSERT(tail.is_contiguous(), "conv step: contiguous tail cache needed");
  }
  const int64_t rows = x.size(0), channels = x.size(1), d = params.head_dim, taps = w.size(1);
  HYDRA_ASSERT(d % 2 == 0 && d / 2 <= kMaxThreads && d / 2 % 32 == 0 && channels % d == 0,
               "conv step: head dim {} (even, 64..256) must divide the {} channels", d, channels);
  HYDRA_ASSERT(taps >= 1 && taps <= kMaxTaps, "conv step: {} taps (at most {})", taps, kMaxTaps);
  HYDRA_ASSERT(out.stride(1) == 1 && x.stride(1) == 1 && w.stride(1) == 1 && inv_norm.stride(1) == 1,
               "conv step: unit last strides needed");
  if (rows == 0) return;
  const ConvStepArgs a{.out = static_cast<bf16_t*>(out.data()), .out_stride = out.stride(0),
                       .inv_norm = static_cast<float*>(inv_norm.data()), .inv_stride = inv_norm.stride(0),
                       .x = static_cast<const bf16_t*>(x.data()), .x_stride = x.stride(0),
                       .w = static_cast<const float*>(w.data()), .w_stride = w.stride(0),
                       .tail = tail.defined() ? static_cast<bf16_t*>(tail.data()) : nullptr,
                       .slots = slots.defined() ? static_cast<const int32_t*>(slots.data()) : nullptr,
                       .pos = static_cast<const int64_t*>(positions.data()), .channels = channels,
                       .qk_heads = params.qk_heads, .half = static_cast<int>(d / 2), .taps = static_cast<int>(taps),
                       .log_theta_over_d = rope_log_theta_over_d(params.rope_theta, d), .eps = params.l2_eps};
  const dim3 grid(static_cast<unsigned>(channels / d), static_cast<unsigned>(rows));
  cuda::launch(gdn_qkv_conv_step_kernel, grid, static_cast<unsigned>(d / 2), 0, a);
  HYDRA_CUDA_LAUNCH_CHECK();
}

}  // namespace hydra::ops::cuda_impl
