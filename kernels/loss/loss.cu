// The training losses on the GPU, forward and gradient in one launch per chunk of rows.
//
// Cross-entropy and KL: one block of 512 threads per row of V logits (V up to 151936: ~300 per
// thread), two passes over the row. Pass 1 keeps a running (max m, Σ exp(x − m)) per thread, the
// online softmax statistics, merged over the block in a fixed order; pass 2 writes the gradient over
// the logits, or into a separate (bf16) gradient row. Everything is fp32 except the KL's loss sum (fp64). Rows are read as float4 when the
// row is 16-byte aligned. The block merges are fixed trees, so results are deterministic.
// Squared error: one warp per row. Cross-entropy over V ≤ 2048 has an opt-in warp-per-row kernel
// (HYDRA_SMALL_ROWS=1, below).
#include <cmath>

#include "kernels/cuda/backward.cuh"
#include "kernels/cuda/vector.cuh"
#include "kernels/loss/loss.h"
#include "kernels/small_rows.h"

namespace hydra::ops::cuda_impl {
namespace {

constexpr int kThreads = 512, kWarps = kThreads / 32;

struct MaxSum {
  float m;  // running max
  float s;  // Σ exp(x − m)
};
constexpr MaxSum kEmpty{-INFINITY, 0.0f};

// A NaN logit fails `x > m` and makes s NaN, so a NaN anywhere in the row reaches the loss.
__device__ __forceinline__ void add(MaxSum& a, float x) {
  if (x > a.m) {
    a.s = a.s * expf(a.m - x) + 1.0f;
    a.m = x;
  } else if (x != -INFINITY) {
    a.s += expf(x - a.m);
  }
}

// Symmetric in a and b (bit for bit), so the xor-shuffle tree gives every lane the same value.
__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return kEmpty;
  return {m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}

// Block-wide merge; every thread returns the same value. `scratch` is free again on return.
__device__ MaxSum block_merge(MaxSum v, MaxSum* scratch) {
  for (int o = 16; o > 0; o /= 2) {
    const MaxSum other{__shfl_xor_sync(0xffffffffu, v.m, o), __shfl_xor_sync(0xffffffffu, v.s, o)};
    v = merge(v, other);
  }
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  MaxSum total = scratch[0];
  for (int w = 1; w < kWarps; ++w) total = merge(total, scratch[w]);
  __syncthreads();
  return total;
}

__device__ double block_sum(double v, double* scratch) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  double total = 0.0;
  for (int w = 0; w < kWarps; ++w) total += scratch[w];
  __syncthreads();
  return total;
}

__device__ __forceinline__ bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Calls f(i, x_i) for this thread's elements of a row: float4 loads over the first 4⌊V/4⌋ elements
// when `vec`, scalar loads for the rest.
template <class F>
__device__ __forceinline__ void visit(const float* x, int64_t vocab, bool vec, F&& f) {
  const int64_t n4 = vec ? vocab / 4 : 0;
  for (int64_t i = threadIdx.x; i < n4; i += kThreads) {
    const float4 v = reinterpret_cast<const float4*>(x)[i];
    f(4 * i, v.x);
    f(4 * i + 1, v.y);
    f(4 * i + 2, v.z);
    f(4 * i + 3, v.w);
  }
  for (int64_t i = 4 * n4 + threadIdx.x; i < vocab; i += kThreads) f(i, x[i]);
}

__device__ __forceinline__ void store4(float* y, int64_t i, float4 v) { reinterpret_cast<float4*>(y)[i] = v; }
__device__ __forceinline__ void store4(cuda::bf16_t* y, int64_t i, float4 v) {
  const float f[4] = {v.x, v.y, v.z, v.w};
  cuda::store_bf16<4>(y + 4 * i, f);
}
__device__ __forceinline__ void store1(float* y, float v) { *y = v; }
__device__ __forceinline__ void store1(cuda::bf16_t* y, float v) { *y = __float2bfloat16_rn(v); }

// y_i ← f(i, x_i, t_i) over a row, t a second row read alongside (TWO = false: no second row, t_i = 0);
// y is x (fp32, in place) or the bf16 gradient operand. `vec`: x (and t) 16-byte, y 16/8-byte aligned.
template <bool TWO, class Out, class F>
__device__ __forceinline__ void rewrite(const float* x, const float* t, Out* y, int64_t vocab, bool vec, F&& f) {
  const int64_t n4 = vec ? vocab / 4 : 0;
  for (int64_t i = threadIdx.x; i < n4; i += kThreads) {
    float4 v = reinterpret_cast<const float4*>(x)[i];
    const float4 u = TWO ? reinterpret_cast<const float4*>(t)[i] : float4{0.0f, 0.0f, 0.0f, 0.0f};
    v.x = f(4 * i, v.x, u.x);
    v.y = f(4 * i + 1, v.y, u.y);
    v.z = f(4 * i + 2, v.z, u.z);
    v.w = f(4 * i + 3, v.w, u.w);
    store4(y, i, v);
  }
  for (int64_t i = 4 * n4 + threadIdx.x; i < vocab; i += kThreads) store1(y + i, f(i, x[i], TWO ? t[i] : 0.0f));
}

__device__ __forceinline__ bool aligned_out(const float* y) { return aligned16(y); }
__device__ __forceinline__ bool aligned_out(const cuda::bf16_t* y) { return reinterpret_cast<uintptr_t>(y) % 8 == 0; }

struct RowsF32 {  // [n, V] fp32, unit last stride
  float* data;
  int64_t stride;
};
template <class Out>
struct GradRows {  // [n, V] of Out, unit last stride: where the gradient goes (the logits themselves when fp32 in place)
  Out* data;
  int64_t stride;
};

template <class Out>
__global__ void __launch_bounds__(kThreads)
    cross_entropy_kernel(RowsF32 logits, GradRows<Out> grad, int64_t vocab, int64_t rows, const int32_t* targets,
                         int64_t target_stride, float* row_loss, int64_t loss_stride, float grad_scale,
                         const float* scale_at_run_time) {
  __shared__ MaxSum scratch[kWarps];
  if (scale_at_run_time != nullptr) grad_scale = *scale_at_run_time;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {  // every branch below is uniform per block
    const float* x = logits.data + r * logits.stride;
    Out* y = grad.data + r * grad.stride;
    const int32_t target = targets[r * target_stride];
    if (target < 0) {  // ignored row: loss 0, gradient 0
      for (int64_t i = threadIdx.x; i < vocab; i += kThreads) store1(y + i, 0.0f);
      if (threadIdx.x == 0) row_loss[r * loss_stride] = 0.0f;
      continue;
    }
    const bool vec = aligned16(x) && aligned_out(y);
    // A target ≥ V is a caller bug (targets are validated on input): its loss is NaN, which stops training.
    const float x_target = target < vocab ? x[target] : NAN;  // read before block_merge's barrier, so before pass 2
    MaxSum st = kEmpty;
    visit(x, vocab, vec, [&](int64_t, float v) { add(st, v); });
    st = block_merge(st, scratch);
    const float inv_s = 1.0f / st.s;
    rewrite<false>(x, nullptr, y, vocab, vec, [&](int64_t i, float v, float) {
      return grad_scale * (expf(v - st.m) * inv_s - (i == target ? 1.0f : 0.0f));
    });
    if (threadIdx.x == 0) row_loss[r * loss_stride] = logf(st.s) + st.m - x_target;
  }
}

template <class Out>
__global__ void __launch_bounds__(kThreads)
    kl_divergence_kernel(RowsF32 student, RowsF32 teacher, GradRows<Out> grad, int64_t vocab, int64_t rows,
                         const int32_t* targets, int64_t target_stride, float* row_loss, int64_t loss_stride,
                         float grad_scale) {
  __shared__ MaxSum scratch[kWarps];
  __shared__ double sum_scratch[kWarps];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {  // every branch below is uniform per block
    const float* x = student.data + r * student.stride;
    const float* t = teacher.data + r * teacher.stride;
    Out* y = grad.data + r * grad.stride;
    if (targets && targets[r * target_stride] < 0) {  // ignored row (loss mask): loss 0, gradient 0
      for (int64_t i = threadIdx.x; i < vocab; i += kThreads) store1(y + i, 0.0f);
      if (threadIdx.x == 0) row_loss[r * loss_stride] = 0.0f;
      continue;
    }
    const bool vec = aligned16(x) && aligned16(t) && aligned_out(y);
    MaxSum ss = kEmpty, ts = kEmpty;
    visit(x, vocab, vec, [&](int64_t, float v) { add(ss, v); });
    visit(t, vocab, vec, [&](int64_t, float v) { add(ts, v); });
    ss = block_merge(ss, scratch);
    ts = block_merge(ts, scratch);
    const float inv_ss = 1.0f / ss.s, inv_ts = 1.0f / ts.s;
    // log p_t − log p_s = (t − x) + c, c = lse_s − lse_t.
    const double c = (double(ss.m) + log(double(ss.s))) - (double(ts.m) + log(double(ts.s)));
    double loss = 0.0;
    rewrite<true>(x, t, y, vocab, vec, [&](int64_t, float xv, float tv) {
      const float pt = expf(tv - ts.m) * inv_ts;
      // p_t = 0 contributes 0 (also where t = −∞, which would give 0 · ∞); a NaN p_t passes into the loss.
      if (pt != 0.0f) loss += double(pt) * ((double(tv) - double(xv)) + c);
      return grad_scale * (expf(xv - ss.m) * inv_ss - pt);
    });
    loss = block_sum(loss, sum_scratch);
    if (threadIdx.x == 0) row_loss[r * loss_stride] = static_cast<float>(loss);
  }
}

// ---- Cross-entropy for small vocabularies (V ≤ kSmallVocabMax), opt-in: HYDRA_SMALL_ROWS=1
// (kernels/small_rows.h), not yet timed on a GPU.
//
// Why the block-per-row kernel above is slow at V = 512 (qwen3-synth: 16384 rows, 133 us a step on
// an H200, ~126 GB/s): a row is 128 float4, so 384 of its 512 threads load nothing; the grid is
// capped at 32 CTAs an SM but only 4 CTAs of 512 threads fit, so ~528 rows are in flight; and each
// row's chain — a load, a 5-level shuffle tree, a barrier, 16 serial merges (two expf each) in every
// thread, a barrier, the second read, the stores — is latency end to end, ~31 such rounds a launch.
//
// Here a warp owns a row and holds it in registers: lane L takes the float4 chunks L, L + 32, …
// (C = ⌈V/128⌉ rounded up to a power of two, ≤ 16 chunks, 4C values), read once; the max and then
// Σ exp(x − m) are warp butterflies; the gradient is written from the registers. 8 rows a 256-thread
// CTA, no shared memory, no barrier. The chunk a value sits in never depends on alignment (an
// unaligned row reads its chunks as four scalars), so the in-place fp32 gradient and the bf16 operand
// give the same row losses bit for bit, as the block kernel's do. Same formulas as the block kernel:
// loss = log s + m − x_target, gradient grad_scale (e^{x−m}/s − onehot); a NaN logit makes s, so the
// loss, NaN (fmaxf skips it for m, e^{NaN − m} does not); a row of −∞ gives NaN, as there.
constexpr int64_t kSmallVocabMax = 2048;
constexpr int kSmallVocabThreads = 256, kSmallVocabRows = kSmallVocabThreads / 32;

template <int C, class Out>
__global__ void __launch_bounds__(kSmallVocabThreads)
    cross_entropy_small_vocab_kernel(RowsF32 logits, GradRows<Out> grad, int64_t vocab, int64_t rows,
                                     const int32_t* targets, int64_t target_stride, float* row_loss,
                                     int64_t loss_stride, float grad_scale, const float* scale_at_run_time,
                                     bool vec_in, bool vec_out) {
  if (scale_at_run_time != nullptr) grad_scale = *scale_at_run_time;
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t(gridDim.x) * kSmallVocabRows;
  for (int64_t r = int64_t(blockIdx.x) * kSmallVocabRows + threadIdx.x / 32; r < rows; r += warps) {  // per warp
    const float* x = logits.data + r * logits.stride;
    Out* y = grad.data + r * grad.stride;
    const int32_t target = targets[r * target_stride];
    if (target < 0) {  // ignored row: loss 0, gradient 0
      for (int64_t i = lane; i < vocab; i += 32) store1(y + i, 0.0f);
      if (lane == 0) row_loss[r * loss_stride] = 0.0f;
      continue;
    }
    // A target ≥ V is a caller bug (targets are validated on input): its loss is NaN.
    const float x_target = target < vocab ? x[target] : NAN;
    float v[C][4];
#pragma unroll
    for (int c = 0; c < C; ++c) {
      const int64_t i0 = 4 * (lane + 32 * int64_t(c));
      if (vec_in && i0 + 3 < vocab) {
        const float4 f = *reinterpret_cast<const float4*>(x + i0);
        v[c][0] = f.x, v[c][1] = f.y, v[c][2] = f.z, v[c][3] = f.w;
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) v[c][e] = i0 + e < vocab ? x[i0 + e] : -INFINITY;
      }
    }
    float m = -INFINITY;
#pragma unroll
    for (int c = 0; c < C; ++c) {
#pragma unroll
      for (int e = 0; e < 4; ++e) m = fmaxf(m, v[c][e]);
    }
    for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    float s = 0.0f;
#pragma unroll
    for (int c = 0; c < C; ++c) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        v[c][e] = expf(v[c][e] - m);  // 0 for the −∞ past the row's end
        s += v[c][e];
      }
    }
    s = cuda::warp_sum(s);
    const float inv_s = 1.0f / s;
#pragma unroll
    for (int c = 0; c < C; ++c) {
      const int64_t i0 = 4 * (lane + 32 * int64_t(c));
      float g[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) g[e] = grad_scale * (v[c][e] * inv_s - (i0 + e == target ? 1.0f : 0.0f));
      if (vec_out && i0 + 3 < vocab) {
        store4(y, i0 / 4, float4{g[0], g[1], g[2], g[3]});
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if (i0 + e < vocab) store1(y + i0 + e, g[e]);
        }
      }
    }
    if (lane == 0) row_loss[r * loss_stride] = logf(s) + m - x_target;
  }
}

// Launches the small-vocabulary kernel for V ≤ kSmallVocabMax: C = 1, 2, 4, 8 or 16 chunks a lane.
template <class Out>
void launch_cross_entropy_small_vocab(const RowsF32& x, const GradRows<Out>& y, int64_t vocab, int64_t rows,
                                      const TensorView& targets, const TensorView& row_loss, float grad_scale,
                                      const float* scale_at_run_time) {
  const auto rows_aligned = [](const void* p, int64_t stride_bytes, int64_t bytes) {
    return reinterpret_cast<uintptr_t>(p) % bytes == 0 && stride_bytes % bytes == 0;
  };
  const bool vec_in = rows_aligned(x.data, x.stride * 4, 16);
  const bool vec_out = rows_aligned(y.data, y.stride * int64_t(sizeof(Out)), 4 * int64_t(sizeof(Out)));
  const int64_t chunks = (vocab + 127) / 128;
  auto* kernel = chunks <= 1   ? cross_entropy_small_vocab_kernel<1, Out>
                 : chunks <= 2 ? cross_entropy_small_vocab_kernel<2, Out>
                 : chunks <= 4 ? cross_entropy_small_vocab_kernel<4, Out>
                 : chunks <= 8 ? cross_entropy_small_vocab_kernel<8, Out>
                               : cross_entropy_small_vocab_kernel<16, Out>;
  const int blocks = cuda::capped_grid((rows + kSmallVocabRows - 1) / kSmallVocabRows);
  kernel<<<blocks, kSmallVocabThreads, 0, current_stream()>>>(x, y, vocab, rows, targets.data_as<const int32_t>(),
                                                              targets.stride(0), row_loss.data_as<float>(),
                                                              row_loss.stride(0), grad_scale, scale_at_run_time,
                                                              vec_in, vec_out);
  HYDRA_CUDA_LAUNCH_CHECK();
}

// One warp per row; every element is read before it is written, so d_a may alias a.
__global__ void __launch_bounds__(256) squared_error_kernel(cuda::FloatRows d_a, cuda::FloatRows a, cuda::FloatRows b,
                                                            float* row_loss, int64_t loss_stride, float grad_scale) {
  const int lane = threadIdx.x % 32;
  const int64_t n = a.layout.length;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t row = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32; row < a.layout.rows; row += warps) {
    const int64_t oa = a.offset(row), ob = b.offset(row), od = d_a.offset(row);
    float acc = 0.0f;
    for (int64_t i = lane; i < n; i += 32) {
      const float diff = a.load(oa + i) - b.load(ob + i);
      acc += diff * diff;
      d_a.store(od + i, grad_scale * 2.0f * diff);
    }
    acc = cuda::warp_sum(acc);
    if (lane == 0) row_loss[row * loss_stride] = acc;
  }
}

RowsF32 logit_rows(const TensorView& v, const char* what) {
  cuda::expect_cuda(v, what, DType::f32);
  HYDRA_ASSERT(v.rank() == 2 && v.stride(1) == 1, "{} must be [n, V] with unit column stride, got {}", what,
               v.shape_string());
  return {v.data_as<float>(), v.stride(0)};
}

// Launches kernel<float> over the logits in place, or kernel<bf16> into a bf16 `grad`.
template <class Launch>
void with_grad_rows(const TensorView& logits, const TensorView& grad, Launch&& launch) {
  if (!grad.defined() || grad.data() == logits.data()) {
    launch(GradRows<float>{logits.data_as<float>(), logits.stride(0)});
    return;
  }
  HYDRA_ASSERT(grad.rank() == 2 && grad.stride(1) == 1 && grad.size(0) == logits.size(0) &&
                   grad.size(1) == logits.size(1),
               "loss gradient {} must be [n, V] = {} with unit column stride", grad.shape_string(),
               logits.shape_string());
  if (grad.dtype() == DType::bf16) {
    launch(GradRows<cuda::bf16_t>{grad.data_as<cuda::bf16_t>(), grad.stride(0)});
  } else {
    cuda::expect_cuda(grad, "loss gradient", DType::f32);
    launch(GradRows<float>{grad.data_as<float>(), grad.stride(0)});
  }
}

void expect_row_loss(const TensorView& row_loss, int64_t rows) {
  cuda::expect_cuda(row_loss, "row_loss", DType::f32);
  HYDRA_ASSERT(row_loss.rank() == 1 && row_loss.size(0) == rows, "row_loss must be [{}], got {}", rows,
               row_loss.shape_string());
}
}  // namespace

void cross_entropy_with_grad(const TensorView& logits, const TensorView& row_loss, const TensorView& targets,
                             float grad_scale, const TensorView& grad, const TensorView& scale_at_run_time) {
  const RowsF32 x = logit_rows(logits, "cross-entropy logits");
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  expect_row_loss(row_loss, rows);
  cuda::expect_cuda(targets, "cross-entropy targets", DType::i32);
  HYDRA_ASSERT(targets.rank() == 1 && targets.size(0) == rows, "targets must be [{}], got {}", rows,
               targets.shape_string());
  const float* scale = nullptr;  // read by the kernel when it runs (a captured step's changing scale)
  if (scale_at_run_time.defined()) {
    cuda::expect_cuda(scale_at_run_time, "cross-entropy scale", DType::f32);
    scale = scale_at_run_time.data_as<const float>();
  }
  if (rows == 0) return;
  with_grad_rows(logits, grad, [&](auto y) {
    if (vocab <= kSmallVocabMax && small_row_kernels_enabled()) {
      launch_cross_entropy_small_vocab(x, y, vocab, rows, targets, row_loss, grad_scale, scale);
      return;
    }
    cross_entropy_kernel<<<cuda::capped_grid(rows), kThreads, 0, current_stream()>>>(
        x, y, vocab, rows, targets.data_as<const int32_t>(), targets.stride(0), row_loss.data_as<float>(),
        row_loss.stride(0), grad_scale, scale);
    HYDRA_CUDA_LAUNCH_CHECK();
  });
}

void kl_divergence_with_grad(const TensorView& student_logits, const TensorView& row_loss,
                             const TensorView& teacher_logits, float grad_scale, const TensorView& grad,
                             const TensorView& targets) {
  const RowsF32 s = logit_rows(student_logits, "student logits"), t = logit_rows(teacher_logits, "teacher logits");
  const int64_t rows = student_logits.size(0), vocab = student_logits.size(1);
  HYDRA_ASSERT(teacher_logits.size(0) == rows && teacher_logits.size(1) == vocab,
               "teacher logits {} must match the student's {}", teacher_logits.shape_string(),
               student_logits.shape_string());
  expect_row_loss(row_loss, rows);
  if (targets.defined()) cuda::expect_cuda(targets, "kl targets", DType::i32);
  if (rows == 0) return;
  const int32_t* target_ptr = targets.defined() ? targets.data_as<const int32_t>() : nullptr;
  const int64_t target_stride = targets.defined() ? targets.stride(0) : 0;
  with_grad_rows(student_logits, grad, [&](auto y) {
    kl_divergence_kernel<<<cuda::capped_grid(rows), kThreads, 0, current_stream()>>>(
        s, t, y, vocab, rows, target_ptr, target_stride, row_loss.data_as<float>(), row_loss.stride(0), grad_scale);
    HYDRA_CUDA_LAUNCH_CHECK();
  });
}

void squared_error_with_grad(const TensorView& d_a, const TensorView& row_loss, const TensorView& a,
                             const TensorView& b, float grad_scale) {
  const cuda::FloatRows fd = cuda::float_rows(d_a, "squared error d_a");
  const cuda::FloatRows fa = cuda::float_rows(a, "squared error a"), fb = cuda::float_rows(b, "squared error b");
  HYDRA_ASSERT(a.rank() == 2 && cuda::same_rows(fa.layout, fb.layout) && cuda::same_rows(fa.layout, fd.layout),
               "squared error: d_a {}, a {}, b {} must all be [n, D]", d_a.shape_string(), a.shape_string(),
               b.shape_string());
  expect_row_loss(row_loss, fa.layout.rows);
  squared_error_kernel<<<cuda::capped_grid((fa.layout.rows + 7) / 8), 256, 0, current_stream()>>>(
      fd, fa, fb, row_loss.data_as<float>(), row_loss.stride(0), grad_scale);
  HYDRA_CUDA_LAUNCH_CHECK();
}

}  // namespace hydra::ops::cuda_impl
