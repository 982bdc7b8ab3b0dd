// CUDA GDN gates: β = sigmoid(b), g = −exp(A_log)·softplus(a + dt_bias), fp32 outputs.
// Backward: the logit gradients element-wise; d_dt_bias and d_a_log summed over tokens by the
// deterministic column reduction (backward.cuh), recomputing the per-token terms from the inputs.
#include "kernels/cuda/backward.cuh"
#include "kernels/gdn_gates/gdn_gates.cuh"
#include "kernels/gdn_gates/gdn_gates.h"

namespace hydra::ops::cuda_impl {
namespace {
__global__ void gdn_gates_kernel(float* beta, float* g, int64_t out_stride, const bf16_t* b, int64_t b_stride,
                                 const bf16_t* a, int64_t a_stride, const float* a_log, const float* dt_bias,
                                 int64_t t_len, int64_t heads) {
  cuda::wait_for_previous_grid();  // launched through cuda::launch (PDL in a decode step)
  cuda::allow_next_grid();
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < t_len * heads;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = idx / heads, h = idx % heads;
    const float bv = __bfloat162float(b[t * b_stride + h]);
    const float sp = gdn_softplus(__bfloat162float(a[t * a_stride + h]), dt_bias[h]);
    beta[t * out_stride + h] = gdn_beta(bv);
    g[t * out_stride + h] = gdn_g(sp, a_log[h]);
  }
}

// The inputs of the backward: [T, H] logits (bf16 or fp32, possibly column blocks), fp32 d_beta, d_g.
struct GateInputs {
  cuda::FloatRows b, a;
  const float* d_beta;
  int64_t d_beta_stride;
  const float* d_g;
  int64_t d_g_stride;
  const float* a_log;
  const float* dt_bias;

  // ∂L/∂a_logits at (t, h) = −d_g exp(A_log) σ(a + dt_bias)  (also the d_dt_bias term).
  __device__ float d_a(int64_t t, int64_t h) const {
    const float x = a.load(a.offset(t) + h) + dt_bias[h];
    return -d_g[t * d_g_stride + h] * expf(a_log[h]) / (1.0f + expf(-x));
  }
  // The d_a_log term d_g ⊙ g, g recomputed as the forward does.
  __device__ float d_alog(int64_t t, int64_t h) const {
    const float sp = gdn_softplus(a.load(a.offset(t) + h), dt_bias[h]);
    return d_g[t * d_g_stride + h] * gdn_g(sp, a_log[h]);
  }
};

__global__ void gdn_gates_backward_kernel(cuda::FloatRows d_b, cuda::FloatRows d_a, GateInputs in, int64_t t_len,
                                          int64_t heads) {
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < t_len * heads;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = idx / heads, h = idx % heads;
    const float beta = gdn_beta(in.b.load(in.b.offset(t) + h));
    const float da = in.d_a(t, h);
    d_b.store(d_b.offset(t) + h, in.d_beta[t * in.d_beta_stride + h] * beta * (1.0f - beta));
    d_a.store(d_a.offset(t) + h, da);
  }
}

// Columns [0, H): the d_dt_bias terms; [H, 2H): the d_a_log terms.
struct ParamTerm {
  GateInputs in;
  int64_t heads;
  __device__ float operator()(int64_t t, int64_t c) const {
    return c < heads ? in.d_a(t, c) : in.d_alog(t, c - heads);
  }
};
struct ParamFinish {
  float* d_dt_bias;  // or nullptr
  float* d_a_log;    // or nullptr
  int64_t heads;
  __device__ void operator()(int64_t c, float total) const {
    if (c < heads) {
      if (d_dt_bias != nullptr) d_dt_bias[c] += total;
    } else if (d_a_log != nullptr) {
      d_a_log[c - heads] += total;
    }
  }
};
}  // namespace

void gdn_gates(const TensorView& beta, const TensorView& g, const TensorView& b_logits, const TensorView& a_logits,
               const TensorView& a_log, const TensorView& dt_bias) {
  cuda::expect_cuda(beta, "beta", DType::f32);
  cuda::expect_cuda(g, "g", DType::f32);
  cuda::expect_cuda(b_logits, "b logits", DType::bf16);
  cuda::expect_cuda(a_logits, "a logits", DType::bf16);
  HYDRA_ASSERT(beta.stride(0) == g.stride(0) && beta.stride(1) == 1 && g.stride(1) == 1 && b_logits.stride(1) == 1 &&
                   a_logits.stride(1) == 1,
               "gdn_gates layouts");
  const int64_t n = b_logits.size(0) * b_logits.size(1);
  cuda::launch(gdn_gates_kernel, cuda::capped_grid((n + 255) / 256), 256, 0,
      beta.data_as<float>(), g.data_as<float>(), beta.stride(0), b_logits.data_as<const cuda::bf16_t>(),
      b_logits.stride(0), a_logits.data_as<const cuda::bf16_t>(), a_logits.stride(0), a_log.data_as<const float>(),
      dt_bias.data_as<const float>(), b_logits.size(0), b_logits.size(1));
  HYDRA_CUDA_LAUNCH_CHECK();
}

void gdn_gates_backward(const TensorView& d_b_logits, const TensorView& d_a_logits, const TensorView& d_a_log,
                        const TensorView& d_dt_bias, const TensorView& d_beta, const TensorView& d_g,
                        const TensorView& b_logits, const TensorView& a_logits, const TensorView& a_log,
                        const TensorView& dt_bias) {
  HYDRA_ASSERT(b_logits.rank() == 2, "gdn b logits must be [T, H], got {}", b_logits.shape_string());
  const int64_t t_len = b_logits.size(0), heads = b_logits.size(1);
  for (const TensorView* v : {&d_b_logits, &d_a_logits, &d_beta, &d_g, &a_logits})
    HYDRA_ASSERT(v->rank() == 2 && v->size(0) == t_len && v->size(1) == heads,
                 "gdn_gates_backward [T, H] views must be [{}, {}], got {}", t_len, heads, v->shape_string());
  const cuda::FloatRows fdb = cuda::float_rows(d_b_logits, "gdn d_b_logits");
  const cuda::FloatRows fda = cuda::float_rows(d_a_logits, "gdn d_a_logits");
  cuda::expect_cuda(d_beta, "gdn d_beta", DType::f32);
  cuda::expect_cuda(d_g, "gdn d_g", DType::f32);
  HYDRA_ASSERT(d_beta.stride(1) == 1 && d_g.stride(1) == 1, "gdn d_beta / d_g need unit column strides");
  for (const TensorView* v : {&a_log, &dt_bias, &d_a_log, &d_dt_bias}) {
    if (!v->defined()) continue;  // only the two gradients may be undefined (not needed)
    cuda::expect_cuda(*v, "gdn per-head vector", DType::f32);
    HYDRA_ASSERT(v->rank() == 1 && v->size(0) == heads && v->stride(0) == 1,
                 "gdn per-head vectors must be contiguous [{}], got {}", heads, v->shape_string());
  }
  HYDRA_ASSERT(a_log.defined() && dt_bias.defined(), "gdn_gates_backward needs A_log and dt_bias");
  const GateInputs in{cuda::float_rows(b_logits, "gdn b logits"),
                      cuda::float_rows(a_logits, "gdn a logits"),
                      d_beta.data_as<const float>(),
                      d_beta.stride(0),
                      d_g.data_as<const float>(),
                      d_g.stride(0),
                      a_log.data_as<const float>(),
                      dt_bias.data_as<const float>()};
  // The parameter sums recompute their terms from the inputs (nothing is stored per token).
  if (d_a_log.defined() || d_dt_bias.defined()) {
    cuda::reduce_columns(t_len, 2 * heads, ParamTerm{in, heads},
                         ParamFinish{d_dt_bias.defined() ? d_dt_bias.data_as<float>() : nullptr,
                                     d_a_log.defined() ? d_a_log.data_as<float>() : nullptr, heads});
  }
  gdn_gates_backward_kernel<<<cuda::capped_grid((t_len * heads + 255) / 256), 256, 0, current_stream()>>>(
      fdb, fda, in, t_len, heads);
  HYDRA_CUDA_LAUNCH_CHECK();
}

}  // namespace hydra::ops::cuda_impl
