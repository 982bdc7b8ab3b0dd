// CUDA single-token delta-rule step (delta_rule_step.h).
//
// One CTA per (32-column tile of the value dimension, head, row): the columns of S are independent
// (δ_j and o_j read column j only), so a head's [dk, dv] fp32 state is split over dv/32 CTAs. The
// CTA's four warps each hold dk/4 rows of the tile in registers, lane j owning column j: a warp's
// load or store of one state row is 128 contiguous bytes. Per column, the two dot products over dk
// (Sᵀk before the update, Sᵀq after it) are a per-warp partial in registers summed over the warps
// through shared memory in a fixed order (no atomics: the step is deterministic):
//   s ← e^g s;  δ_j = β (v_j − Σ_i s_ij k_i);  s_ij += k_i δ_j;  o_j = scale Σ_i s_ij q_i.
// The state is read once and written once per step, the whole cost of a GDN head at decode
// (dk·dv·8 bytes: 128 KiB per head at d = 128).
#include "kernels/cuda/common.cuh"
#include "kernels/delta_rule/delta_rule_step.h"

namespace hydra::ops::cuda_impl {
namespace {

constexpr int kWarps = 4;
constexpr int kTile = 32;  // value columns per CTA

struct StepArgs {
  bf16_t* out;
  int64_t out_stride_b, out_stride_h;
  float* state;  // [S, H, dk, dv] contiguous
  const int32_t* slots;
  const bf16_t* q;
  const bf16_t* k;
  const bf16_t* v;
  int64_t q_stride_b, q_stride_h, k_stride_b, k_stride_h, v_stride_b, v_stride_h;
  const float* g;
  const float* beta;
  int64_t g_stride_b, g_stride_h, beta_stride_b, beta_stride_h;
  int64_t heads, dv;
  float scale;
};

template <int DK>
__global__ void __launch_bounds__(32 * kWarps) delta_rule_step_kernel(const StepArgs a) {
  cuda::wait_for_previous_grid();  // launched through cuda::launch (PDL in a decode step)
  cuda::allow_next_grid();
  constexpr int R = DK / kWarps;  // state rows per warp
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t b = blockIdx.z, h = blockIdx.y, j = int64_t(blockIdx.x) * kTile + lane;
  const int64_t slot = a.slots != nullptr ? a.slots[b] : b;
  float* s_head = a.state + (slot * a.heads + h) * DK * a.dv;
  __shared__ float kvec[DK], qvec[DK];
  __shared__ float partial[2][kWarps][kTile];
  for (int i = threadIdx.x; i < DK; i += blockDim.x) {
    kvec[i] = cuda::to_float(a.k[b * a.k_stride_b + h * a.k_stride_h + i]);
    qvec[i] = cuda::to_float(a.q[b * a.q_stride_b + h * a.q_stride_h + i]);
  }
  const float decay = expf(a.g[b * a.g_stride_b + h * a.g_stride_h]);
  const float beta = a.beta[b * a.beta_stride_b + h * a.beta_stride_h];
  const float vj = cuda::to_float(a.v[b * a.v_stride_b + h * a.v_stride_h + j]);
  float s[R];
#pragma unroll
  for (int r = 0; r < R; ++r) s[r] = s_head[int64_t(warp * R + r) * a.dv + j];  // all loads in flight first
  __syncthreads();  // kvec, qvec
  float kv = 0.0f;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    s[r] *= decay;
    kv += s[r] * kvec[warp * R + r];
  }
  partial[0][warp][lane] = kv;
  __syncthreads();
  kv = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) kv += partial[0][w][lane];
  const float delta = beta * (vj - kv);
  float o = 0.0f;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    s[r] += kvec[warp * R + r] * delta;
    o += s[r] * qvec[warp * R + r];
    s_head[int64_t(warp * R + r) * a.dv + j] = s[r];
  }
  partial[1][warp][lane] = o;
  __syncthreads();
  if (warp == 0) {
    o = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) o += partial[1][w][lane];
    a.out[b * a.out_stride_b + h * a.out_stride_h + j] = cuda::from_float<bf16_t>(o * a.scale);
  }
}

}  // namespace

void delta_rule_step(const TensorView& out, const TensorView& state, const TensorView& slots, const TensorView& q,
                     const TensorView& k, const TensorView& v, const TensorView& g, const TensorView& beta, float scale) {
  cuda::expect_cuda(out, "delta step out", DType::bf16);
  cuda::expect_cuda(state, "delta step state", DType::f32);
  cuda::expect_cuda(q, "delta step q", DType::bf16);
  cuda::expect_cuda(k, "delta step k", DType::bf16);
  cuda::expect_cuda(v, "delta step v", DType::bf16);
  cuda::expect_cuda(g, "delta step g", DType::f32);
  cuda::expect_cuda(beta, "delta step beta", DType::f32);
  const int64_t rows = k.size(0), heads = k.size(1), dk = k.size(2), dv = v.size(2);
  HYDRA_ASSERT(dk == 64 || dk == 128, "delta step: dk {} (the kernel takes 64 or 128)", dk);
  HYDRA_ASSERT(dv % kTile == 0, "delta step: dv {} must be a multiple of {}", dv, kTile);
  HYDRA_ASSERT(state.is_contiguous(), "delta step: contiguous state needed");
  for (const TensorView* t : {&out, &q, &k, &v}) HYDRA_ASSERT(t->stride(2) == 1, "delta step: unit last stride needed");
  if (rows == 0 || heads == 0) return;
  const StepArgs a{.out = static_cast<bf16_t*>(out.data()), .out_stride_b = out.stride(0), .out_stride_h = out.stride(1),
                   .state = static_cast<float*>(state.data()),
                   .slots = slots.defined() ? static_cast<const int32_t*>(slots.data()) : nullptr,
                   .q = static_cast<const bf16_t*>(q.data()), .k = static_cast<const bf16_t*>(k.data()),
                   .v = static_cast<const bf16_t*>(v.data()), .q_stride_b = q.stride(0), .q_stride_h = q.stride(1),
                   .k_stride_b = k.stride(0), .k_stride_h = k.stride(1), .v_stride_b = v.stride(0),
                   .v_stride_h = v.stride(1), .g = static_cast<const float*>(g.data()),
                   .beta = static_cast<const float*>(beta.data()), .g_stride_b = g.stride(0), .g_stride_h = g.stride(1),
                   .beta_stride_b = beta.stride(0), .beta_stride_h = beta.stride(1), .heads = heads, .dv = dv,
                   .scale = scale};
  const dim3 grid(static_cast<unsigned>(dv / kTile), static_cast<unsigned>(heads), static_cast<unsigned>(rows));
  cuda::launch(dk == 64 ? delta_rule_step_kernel<64> : delta_rule_step_kernel<128>, grid, 32 * kWarps, 0, a);
  HYDRA_CUDA_LAUNCH_CHECK();
}

}  // namespace hydra::ops::cuda_impl
