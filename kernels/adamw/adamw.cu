// AdamW and the gradient's sum of squares on the GPU.
//
// adamw_update: one thread per parameter (grid-stride), fp32 arithmetic in the order of the formula
// in adamw.h; the bias corrections 1 − β^step are formed once on the host in fp64.
// sum_of_squares: a fixed grid of kSumBlocks blocks whatever the device; each thread sums x² in fp64
// over a fixed set of elements, each block adds its threads in a fixed tree, and the host adds the
// block sums in block order. The result is the same on every run and every GPU. A list of tensors
// is one launch (blockIdx.y picks the tensor) into one slot per tensor of one buffer and a single
// copy back: the optimizer's global norm over ~450 tensors is one launch and one synchronisation.
// The list forms of the update and of the zeroing are one launch each in the same way, over a table
// of the blocks uploaded for the call (the small model's step had ~120 optimizer launches of a few
// microseconds each; cluster/results/h200-2026-12-07).
#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "kernels/adamw/adamw.h"
#include "kernels/cuda/common.cuh"

namespace hydra::ops::cuda_impl {
namespace {

struct AdamWScalars {
  float lr, beta1, beta2, eps, decay, grad_scale;  // decay = 1 − lr·weight_decay
  float bias1, bias2;                              // 1 − β1^step, 1 − β2^step
};

// One element's step, the single and the list kernel alike. Every operation is an explicitly
// rounded intrinsic, so the compiler fuses none of them into an FMA: the two kernels, compiled
// separately, could otherwise contract the same expression differently (seen on the H200: the
// masters of the decayed blocks differed in the last bit).
__device__ __forceinline__ float adamw_element(float& master, float& m, float& v, float grad, float decay,
                                               const AdamWScalars& s) {
  const float g = __fmul_rn(s.grad_scale, grad);
  const float mi = __fadd_rn(__fmul_rn(s.beta1, m), __fmul_rn(1.0f - s.beta1, g));
  const float vi = __fadd_rn(__fmul_rn(s.beta2, v), __fmul_rn(1.0f - s.beta2, __fmul_rn(g, g)));
  m = mi;
  v = vi;
  const float m_hat = __fdiv_rn(mi, s.bias1), v_hat = __fdiv_rn(vi, s.bias2);
  const float p = __fsub_rn(__fmul_rn(master, decay),
                            __fdiv_rn(__fmul_rn(s.lr, m_hat), __fadd_rn(__fsqrt_rn(v_hat), s.eps)));
  master = p;
  return p;
}

// weight: nullptr (no model copy) or [n] of W; it may alias master (W = float).
template <class W>
__global__ void adamw_kernel(float* master, float* m, float* v, const float* grad, W* weight, int64_t n,
                             AdamWScalars s) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float p = adamw_element(master[i], m[i], v[i], grad[i], s.decay, s);
    if (weight != nullptr) weight[i] = cuda::from_float<W>(p);
  }
}

// One block of the list forms: its buffers and, for the update, its own decay factor.
struct ListEntry {
  float* master = nullptr;  // the block (zero_tensors, sum_of_squares: the tensor)
  float* m = nullptr;
  float* v = nullptr;
  const float* grad = nullptr;
  void* weight = nullptr;   // nullptr, or fp32 / bf16 per weight_bf16
  int64_t n = 0;
  int weight_bf16 = 0;
  float decay = 1.0f;       // 1 − lr·wd of this block
};

// 1 − lr·wd, formed the same way for the single and the list form (bit-identical results).
float decay_factor(const AdamWParams& p, bool decay) { return 1.0f - p.lr * (decay ? p.weight_decay : 0.0f); }

__global__ void adamw_list_kernel(const ListEntry* entries, AdamWScalars s) {
  const ListEntry e = entries[blockIdx.y];
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < e.n; i += int64_t(gridDim.x) * blockDim.x) {
    const float p = adamw_element(e.master[i], e.m[i], e.v[i], e.grad[i], e.decay, s);
    if (e.weight != nullptr) {
      if (e.weight_bf16) {
        static_cast<cuda::bf16_t*>(e.weight)[i] = cuda::from_float<cuda::bf16_t>(p);
      } else {
        static_cast<float*>(e.weight)[i] = p;
      }
    }
  }
}

__global__ void zero_list_kernel(const ListEntry* entries) {
  const ListEntry e = entries[blockIdx.y];
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < e.n; i += int64_t(gridDim.x) * blockDim.x) {
    e.master[i] = 0.0f;
  }
}

// The table of a list call in device memory (freed in stream order after the launch that reads it).
std::shared_ptr<void> upload_entries(const std::vector<ListEntry>& entries) {
  HYDRA_ASSERT(entries.size() <= 65535, "{} blocks in one list launch (at most 65535)", entries.size());
  const size_t bytes = entries.size() * sizeof(ListEntry);
  std::shared_ptr<void> table = cuda_allocate(bytes);
  cuda_copy_bytes(table.get(), Device::cuda, entries.data(), Device::host, bytes);
  return table;
}

// Blocks along x for a list launch: enough for the largest entry (grid-stride beyond 1024 blocks).
unsigned list_grid_x(const std::vector<ListEntry>& entries) {
  int64_t most = 1;
  for (const ListEntry& e : entries) most = std::max(most, e.n);
  return static_cast<unsigned>(std::clamp<int64_t>((most + 255) / 256, 1, 1024));
}

constexpr int kSumBlocks = 1024, kSumThreads = 256;

// Block b of tensor blockIdx.y writes block_sums[blockIdx.y·kSumBlocks + b]: the same per-block sums
// as one launch per tensor.
__global__ void __launch_bounds__(kSumThreads) sum_of_squares_kernel(const ListEntry* entries, double* block_sums) {
  const float* x = entries[blockIdx.y].master;
  const int64_t n = entries[blockIdx.y].n;
  block_sums += int64_t(blockIdx.y) * kSumBlocks;
  __shared__ double warp_sums[kSumThreads / 32];
  double acc = 0.0;
  for (int64_t i = blockIdx.x * int64_t(kSumThreads) + threadIdx.x; i < n; i += int64_t(kSumBlocks) * kSumThreads) {
    const double v = x[i];
    acc += v * v;
  }
  for (int o = 16; o > 0; o /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0.0;
    for (int w = 0; w < kSumThreads / 32; ++w) total += warp_sums[w];
    block_sums[blockIdx.x] = total;
  }
}

void expect_flat_f32(const TensorView& t, const char* what, int64_t n) {
  cuda::expect_cuda(t, what, DType::f32);
  HYDRA_ASSERT(t.is_contiguous() && t.numel() == n, "{} must be a contiguous fp32 buffer of {} elements, got {}",
               what, n, t.shape_string());
}
// The model's weight copy of an update: undefined, or a contiguous CUDA fp32/bf16 block of n.
void expect_weight(const TensorView& weight, int64_t n) {
  HYDRA_ASSERT(!weight.defined() || (weight.device() == Device::cuda && weight.is_contiguous() && weight.numel() == n &&
                                     (weight.dtype() == DType::f32 || weight.dtype() == DType::bf16)),
               "AdamW weight must be a contiguous CUDA fp32/bf16 buffer of {} elements, got {} {}", n,
               dtype_name(weight.dtype()), weight.shape_string());
}
}  // namespace

void adamw_update(const TensorView& master, const TensorView& m, const TensorView& v, const TensorView& grad,
                  const TensorView& weight, const AdamWParams& params) {
  const int64_t n = master.numel();
  expect_flat_f32(master, "AdamW master", n);
  expect_flat_f32(m, "AdamW m", n);
  expect_flat_f32(v, "AdamW v", n);
  expect_flat_f32(grad, "AdamW grad", n);
  expect_weight(weight, n);
  HYDRA_ASSERT(params.step >= 1, "AdamW step is 1-based, got {}", params.step);
  const AdamWScalars s{params.lr,
                       params.beta1,
                       params.beta2,
                       params.eps,
                       decay_factor(params, true),
                       params.grad_scale,
                       static_cast<float>(1.0 - std::pow(double(params.beta1), double(params.step))),
                       static_cast<float>(1.0 - std::pow(double(params.beta2), double(params.step)))};
  const int grid = cuda::capped_grid((n + 255) / 256);
  float* mp = master.data_as<float>();
  float* mm = m.data_as<float>();
  float* vp = v.data_as<float>();
  const float* gp = grad.data_as<const float>();
  if (!weight.defined()) {
    adamw_kernel<float><<<grid, 256, 0, current_stream()>>>(mp, mm, vp, gp, nullptr, n, s);
  } else {
    if (weight.dtype() == DType::f32) {
      adamw_kernel<float><<<grid, 256, 0, current_stream()>>>(mp, mm, vp, gp, weight.data_as<float>(), n, s);
    } else {
      adamw_kernel<cuda::bf16_t><<<grid, 256, 0, current_stream()>>>(mp, mm, vp, gp, weight.data_as<cuda::bf16_t>(), n,
                                                                     s);
    }
  }
  HYDRA_CUDA_LAUNCH_CHECK();
}

double sum_of_squares(const TensorView& x) { return sum_of_squares(std::span<const TensorView>(&x, 1)); }

double sum_of_squares(std::span<const TensorView> xs) {
  // Every tensor's block sums land in its own slot of one buffer; one copy back (one synchronisation).
  std::vector<int64_t> sizes;
  for (const TensorView& x : xs) {
    sizes.push_back(x.numel());
    expect_flat_f32(x, "sum_of_squares x", sizes.back());
  }
  if (xs.empty()) return 0.0;
  HYDRA_ASSERT(xs.size() <= 65535, "sum_of_squares of {} tensors in one launch (at most 65535)", xs.size());
  const size_t slot_bytes = kSumBlocks * sizeof(double);
  const std::shared_ptr<void> block_sums = cuda_allocate(xs.size() * slot_bytes);
  double* sums = static_cast<double*>(block_sums.get());
  std::vector<ListEntry> entries(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) {
    entries[i].master = sizes[i] == 0 ? nullptr : const_cast<float*>(xs[i].data_as<const float>());
    entries[i].n = sizes[i];  // an empty tensor's blocks write zeros
  }
  const std::shared_ptr<void> table = upload_entries(entries);
  sum_of_squares_kernel<<<dim3(kSumBlocks, static_cast<unsigned>(xs.size())), kSumThreads, 0, current_stream()>>>(
      static_cast<const ListEntry*>(table.get()), sums);
  HYDRA_CUDA_LAUNCH_CHECK();
  std::vector<double> host(xs.size() * kSumBlocks);
  cuda_copy_bytes(host.data(), Device::host, sums, Device::cuda, xs.size() * slot_bytes);  // syncs
  double total = 0.0;
  for (size_t i = 0; i < xs.size(); ++i) {
    double tensor_total = 0.0;  // each tensor's blocks in block order, then the tensors in order
    for (int b = 0; b < kSumBlocks; ++b) tensor_total += host[i * kSumBlocks + static_cast<size_t>(b)];
    total += tensor_total;
  }
  return total;
}

void adamw_update(std::span<const AdamWSlice> slices, const AdamWParams& params) {
  if (slices.empty()) return;
  const AdamWScalars s{params.lr,
                       params.beta1,
                       params.beta2,
                       params.eps,
                       1.0f,  // per block, in the table
                       params.grad_scale,
                       static_cast<float>(1.0 - std::pow(double(params.beta1), double(params.step))),
                       static_cast<float>(1.0 - std::pow(double(params.beta2), double(params.step)))};
  std::vector<ListEntry> entries;
  entries.reserve(slices.size());
  for (const AdamWSlice& sl : slices) {
    const int64_t n = sl.master.numel();
    expect_flat_f32(sl.master, "AdamW master", n);
    expect_flat_f32(sl.m, "AdamW m", n);
    expect_flat_f32(sl.v, "AdamW v", n);
    expect_flat_f32(sl.grad, "AdamW grad", n);
    expect_weight(sl.weight, n);
    ListEntry e;
    e.master = sl.master.data_as<float>();
    e.m = sl.m.data_as<float>();
    e.v = sl.v.data_as<float>();
    e.grad = sl.grad.data_as<const float>();
    e.weight = sl.weight.defined() ? sl.weight.data() : nullptr;
    e.weight_bf16 = sl.weight.defined() && sl.weight.dtype() == DType::bf16 ? 1 : 0;
    e.n = n;
    e.decay = decay_factor(params, sl.decay);
    entries.push_back(e);
  }
  const std::shared_ptr<void> table = upload_entries(entries);
  adamw_list_kernel<<<dim3(list_grid_x(entries), static_cast<unsigned>(entries.size())), 256, 0, current_stream()>>>(
      static_cast<const ListEntry*>(table.get()), s);
  HYDRA_CUDA_LAUNCH_CHECK();
}

void zero_tensors(std::span<const TensorView> xs) {
  std::vector<ListEntry> entries;
  for (const TensorView& x : xs) {
    expect_flat_f32(x, "zero_tensors x", x.numel());
    if (x.numel() == 0) continue;
    ListEntry e;
    e.master = x.data_as<float>();
    e.n = x.numel();
    entries.push_back(e);
  }
  if (entries.empty()) return;
  const std::shared_ptr<void> table = upload_entries(entries);
  zero_list_kernel<<<dim3(list_grid_x(entries), static_cast<unsigned>(entries.size())), 256, 0, current_stream()>>>(
      static_cast<const ListEntry*>(table.get()));
  HYDRA_CUDA_LAUNCH_CHECK();
}

}  // namespace hydra::ops::cuda_impl
