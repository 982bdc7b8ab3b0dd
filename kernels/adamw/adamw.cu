// AdamW and the gradient's sum of squares on the GPU.
//
// adamw_update: one thread per parameter (grid-stride), fp32 arithmetic in the order of the formula
// in adamw.h; the bias corrections 1 − β^step are formed once on the host in fp64.
// sum_of_squares: a fixed grid of kSumBlocks blocks whatever the device; each thread sums x² in fp64
// over a fixed set of elements, each block adds its threads in a fixed tree; then the block sums are
// added on the device in a fixed order: each tensor's 1024 by tensor_sums_kernel (thread t adds
// blocks t, t+256, t+512, t+768 in turn, then a fixed tree), then the tensors' sums in list order
// from 0 by one thread (ordered_total), and that one fp64 is copied back. The result is the same on
// every run and every GPU. A list of tensors is three launches (blockIdx.y picks the tensor) and one
// synchronisation, however many tensors (the optimizer's global norm: ~450).
// The list forms of the update and of the zeroing are one launch each in the same way, over a table
// of the blocks uploaded for the call (the small model's step had ~120 optimizer launches of a few
// microseconds each; cluster/results/h200-2026-12-07).
// The device update (DeviceUpdate, adamw.h) launches the same kernels over tables uploaded once,
// with the norm's square root, the clip scale and the non-finite guard formed on the device by
// norm_guard_kernel (fp64 sqrt and division are correctly rounded on the host and the device alike)
// and the step's scalars read from device buffers: the eager tail's bits, with nothing read back.
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
  int decay_on = 1;         // the device update: whether the step's 1 − lr·wd (its schedule) applies
};

// The device update's scalars (DeviceUpdate): schedule [5] f64 (lr, step, 1 − β1^step, 1 − β2^step,
// 1 − lr·wd) and result [3] f64 (norm, clip scale, skipped); both null in the eager launches.
struct DeviceScalars {
  const double* schedule = nullptr;
  const double* result = nullptr;
};

// 1 − lr·wd, formed the same way for the single and the list form (bit-identical results).
float decay_factor(const AdamWParams& p, bool decay) { return adamw_decay_factor(p.lr, decay ? p.weight_decay : 0.0f); }

__global__ void adamw_list_kernel(const ListEntry* entries, AdamWScalars s, DeviceScalars d) {
  const ListEntry e = entries[blockIdx.y];
  float decay = e.decay;
  if (d.schedule != nullptr) {  // the device update: this step's values, nothing when skipped
    if (d.result[2] != 0.0) return;
    s.lr = static_cast<float>(d.schedule[0]);
    s.bias1 = static_cast<float>(d.schedule[2]);
    s.bias2 = static_cast<float>(d.schedule[3]);
    s.grad_scale = static_cast<float>(d.result[1]);
    decay = e.decay_on ? static_cast<float>(d.schedule[4]) : 1.0f;
  }
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < e.n; i += int64_t(gridDim.x) * blockDim.x) {
    const float p = adamw_element(e.master[i], e.m[i], e.v[i], e.grad[i], decay, s);
    if (e.weight != nullptr) {
      if (e.weight_bf16) {
        static_cast<cuda::bf16_t*>(e.weight)[i] = cuda::from_float<cuda::bf16_t>(p);
      } else {
        static_cast<float*>(e.weight)[i] = p;
      }
    }
  }
}

// skipped: null, or the device update's result (nothing zeroed when its step was skipped).
__global__ void zero_list_kernel(const ListEntry* entries, const double* result) {
  if (result != nullptr && result[2] != 0.0) return;
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

// A kSumThreads block's sum of acc, valid in thread 0: each warp's butterfly sum, then thread 0 adds
// the warps' sums in warp order (the one order both sum kernels use).
__device__ double block_total(double acc, double* warp_sums) {
  for (int o = 16; o > 0; o /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = acc;
  __syncthreads();
  double total = 0.0;
  if (threadIdx.x == 0) {
    for (int w = 0; w < kSumThreads / 32; ++w) total += warp_sums[w];
  }
  return total;
}

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
  const double total = block_total(acc, warp_sums);
  if (threadIdx.x == 0) block_sums[blockIdx.x] = total;
}

// Tensor blockIdx.x's 1024 block sums added in a fixed order into tensor_sums[blockIdx.x].
__global__ void __launch_bounds__(kSumThreads) tensor_sums_kernel(const double* block_sums, double* tensor_sums) {
  static_assert(kSumBlocks == 4 * kSumThreads, "four block sums a thread");
  const double* b = block_sums + int64_t(blockIdx.x) * kSumBlocks;
  __shared__ double warp_sums[kSumThreads / 32];
  double acc = b[threadIdx.x];
  for (int k = 1; k < 4; ++k) acc += b[threadIdx.x + k * kSumThreads];
  const double total = block_total(acc, warp_sums);
  if (threadIdx.x == 0) tensor_sums[blockIdx.x] = total;
}

// The tensors' sums added in list order from 0: Σ x² of the list (one thread).
__device__ double ordered_total(const double* tensor_sums, int64_t count) {
  double total = 0.0;
  for (int64_t i = 0; i < count; ++i) total += tensor_sums[i];
  return total;
}

__global__ void total_kernel(const double* tensor_sums, int64_t count, double* out) {
  *out = ordered_total(tensor_sums, count);
}

// The device update's norm, clip scale and guard (one thread), as the eager trainer forms them:
// ‖g‖ = sqrt(Σ x²); the step is skipped (sticky) when the summed loss ((0 + s_0) + s_1 + …) or ‖g‖
// is not finite; otherwise the scale is float(clip / ‖g‖) when ‖g‖ > clip > 0, else 1.
__global__ void norm_guard_kernel(const double* tensor_sums, int64_t count, const double* loss_sums, int64_t groups,
                                  double grad_clip, double* result) {
  const double norm = sqrt(ordered_total(tensor_sums, count));
  double loss = 0.0;
  for (int64_t g = 0; g < groups; ++g) loss += loss_sums[2 * g];
  result[0] = norm;
  result[1] = 1.0;
  if (result[2] != 0.0 || !isfinite(loss) || !isfinite(norm)) {
    result[2] = 1.0;
    return;
  }
  if (grad_clip > 0.0 && norm > grad_clip) result[1] = static_cast<float>(grad_clip / norm);
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
                       adamw_bias_correction(params.beta1, params.step),
                       adamw_bias_correction(params.beta2, params.step)};
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
  // Each tensor's blocks, then the tensors in order (the device update's order: see the top).
  const std::shared_ptr<void> tensor_sums = cuda_allocate((xs.size() + 1) * sizeof(double));
  double* per_tensor = static_cast<double*>(tensor_sums.get());
  tensor_sums_kernel<<<static_cast<unsigned>(xs.size()), kSumThreads, 0, current_stream()>>>(sums, per_tensor);
  HYDRA_CUDA_LAUNCH_CHECK();
  total_kernel<<<1, 1, 0, current_stream()>>>(per_tensor, static_cast<int64_t>(xs.size()), per_tensor + xs.size());
  HYDRA_CUDA_LAUNCH_CHECK();
  double total = 0.0;
  cuda_copy_bytes(&total, Device::host, per_tensor + xs.size(), Device::cuda, sizeof(double));  // syncs
  return total;
}

namespace {

AdamWScalars list_scalars(const AdamWParams& params) {
  return AdamWScalars{params.lr,
                      params.beta1,
                      params.beta2,
                      params.eps,
                      1.0f,  // per block, in the table
                      params.grad_scale,
                      adamw_bias_correction(params.beta1, params.step),
                      adamw_bias_correction(params.beta2, params.step)};
}

std::vector<ListEntry> adamw_entries(std::span<const AdamWSlice> slices, const AdamWParams& params) {
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
    e.decay_on = sl.decay ? 1 : 0;
    entries.push_back(e);
  }
  return entries;
}

std::vector<ListEntry> zero_entries(std::span<const TensorView> xs) {
  std::vector<ListEntry> entries;
  for (const TensorView& x : xs) {
    expect_flat_f32(x, "zero_tensors x", x.numel());
    if (x.numel() == 0) continue;
    ListEntry e;
    e.master = x.data_as<float>();
    e.n = x.numel();
    entries.push_back(e);
  }
  return entries;
}

}  // namespace

void adamw_update(std::span<const AdamWSlice> slices, const AdamWParams& params) {
  if (slices.empty()) return;
  const std::vector<ListEntry> entries = adamw_entries(slices, params);
  const std::shared_ptr<void> table = upload_entries(entries);
  adamw_list_kernel<<<dim3(list_grid_x(entries), static_cast<unsigned>(entries.size())), 256, 0, current_stream()>>>(
      static_cast<const ListEntry*>(table.get()), list_scalars(params), DeviceScalars{});
  HYDRA_CUDA_LAUNCH_CHECK();
}

void zero_tensors(std::span<const TensorView> xs) {
  const std::vector<ListEntry> entries = zero_entries(xs);
  if (entries.empty()) return;
  const std::shared_ptr<void> table = upload_entries(entries);
  zero_list_kernel<<<dim3(list_grid_x(entries), static_cast<unsigned>(entries.size())), 256, 0, current_stream()>>>(
      static_cast<const ListEntry*>(table.get()), nullptr);
  HYDRA_CUDA_LAUNCH_CHECK();
}

// The device update's tables and scratch, uploaded once (DeviceUpdate): a graph that replays its
// launches reads them at fixed addresses, and nothing is uploaded or allocated per step.
struct DeviceUpdateTables {
  std::vector<ListEntry> adamw, zero, norm;
  std::shared_ptr<void> adamw_table, zero_table, norm_table;
  std::shared_ptr<void> block_sums, tensor_sums;  // [norm × 1024], [norm] f64
};

DeviceUpdateTables* make_device_update(std::span<const AdamWSlice> slices, std::span<const TensorView> norm_of,
                                       std::span<const TensorView> zero) {
  auto t = std::make_unique<DeviceUpdateTables>();
  t->adamw = adamw_entries(slices, AdamWParams{});
  t->zero = zero_entries(zero);
  for (const TensorView& x : norm_of) {
    expect_flat_f32(x, "sum_of_squares x", x.numel());
    ListEntry e;
    e.master = x.numel() == 0 ? nullptr : const_cast<float*>(x.data_as<const float>());
    e.n = x.numel();
    t->norm.push_back(e);
  }
  HYDRA_ASSERT(t->norm.size() <= 65535, "a gradient norm over {} tensors in one launch (at most 65535)", t->norm.size());
  if (!t->adamw.empty()) t->adamw_table = upload_entries(t->adamw);
  if (!t->zero.empty()) t->zero_table = upload_entries(t->zero);
  if (!t->norm.empty()) t->norm_table = upload_entries(t->norm);
  t->block_sums = cuda_allocate(std::max<size_t>(t->norm.size(), 1) * kSumBlocks * sizeof(double));
  t->tensor_sums = cuda_allocate(std::max<size_t>(t->norm.size(), 1) * sizeof(double));
  return t.release();
}

void free_device_update(DeviceUpdateTables* tables) { delete tables; }

void launch_device_update(const DeviceUpdateTables& t, const AdamWParams& fixed, double grad_clip,
                          const TensorView& schedule, const TensorView& loss_sums, const TensorView& result) {
  cudaStream_t stream = current_stream();
  double* block_sums = static_cast<double*>(t.block_sums.get());
  double* tensor_sums = static_cast<double*>(t.tensor_sums.get());
  const auto count = static_cast<unsigned>(t.norm.size());
  if (count > 0) {
    sum_of_squares_kernel<<<dim3(kSumBlocks, count), kSumThreads, 0, stream>>>(
        static_cast<const ListEntry*>(t.norm_table.get()), block_sums);
    HYDRA_CUDA_LAUNCH_CHECK();
    tensor_sums_kernel<<<count, kSumThreads, 0, stream>>>(block_sums, tensor_sums);
    HYDRA_CUDA_LAUNCH_CHECK();
  }
  double* out = result.data_as<double>();
  norm_guard_kernel<<<1, 1, 0, stream>>>(tensor_sums, count, loss_sums.data_as<const double>(), loss_sums.size(0),
                                         grad_clip, out);
  HYDRA_CUDA_LAUNCH_CHECK();
  const DeviceScalars d{schedule.data_as<const double>(), out};
  if (!t.adamw.empty()) {
    AdamWParams p = fixed;
    p.step = 1;  // the bias corrections, lr and scale come from the device (d)
    adamw_list_kernel<<<dim3(list_grid_x(t.adamw), static_cast<unsigned>(t.adamw.size())), 256, 0, stream>>>(
        static_cast<const ListEntry*>(t.adamw_table.get()), list_scalars(p), d);
    HYDRA_CUDA_LAUNCH_CHECK();
  }
  if (!t.zero.empty()) {
    zero_list_kernel<<<dim3(list_grid_x(t.zero), static_cast<unsigned>(t.zero.size())), 256, 0, stream>>>(
        static_cast<const ListEntry*>(t.zero_table.get()), out);
    HYDRA_CUDA_LAUNCH_CHECK();
  }
}

}  // namespace hydra::ops::cuda_impl
