// Device helpers shared by the backward (training) kernels of the small ops: element access for
// views whose float type (bf16 or fp32) is chosen at run time, a row-tiled element-wise loop, and
// the deterministic column reduction behind every weight gradient. Included only by .cu files.
//
// Why a run-time element type: a backward op mixes fp32 accumulators (attention, delta rule) with
// bf16 activations and bf16 GEMM operands, in more combinations than templates would keep readable.
// The branch on the type is uniform across a warp and costs nothing next to the memory traffic of
// these bandwidth-bound kernels.
//
// Why no float atomics in weight gradients: a gradient summed with atomicAdd depends on the order
// in which blocks finish, so two training runs would differ in the last bits. reduce_columns cuts
// the rows into splits whose number depends only on the row count (never on the device), sums each
// split in a fixed order into its own partial, and adds the partials in a fixed order in a second
// kernel: the same shapes give the same bits on every run and every GPU.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace hydra::cuda {

// Rows ([N, n] or [N, H, n], unit last stride) of a bf16 or fp32 device view.
struct FloatRows {
  void* data = nullptr;
  bool bf16 = false;
  RowLayout layout;

  // Element offset of the first element of `row` (row < 2³¹, checked when the view is made).
  __device__ __forceinline__ int64_t offset(int64_t row) const {
    if (layout.inner == 1) return row * layout.stride_outer;
    const uint32_t r = static_cast<uint32_t>(row), inner = static_cast<uint32_t>(layout.inner);
    return int64_t(r / inner) * layout.stride_outer + int64_t(r % inner) * layout.stride_inner;
  }
  __device__ __forceinline__ float load(int64_t at) const {
    return bf16 ? __bfloat162float(static_cast<const bf16_t*>(data)[at]) : static_cast<const float*>(data)[at];
  }
  __device__ __forceinline__ void store(int64_t at, float v) const {
    if (bf16) {
      static_cast<bf16_t*>(data)[at] = __float2bfloat16_rn(v);
    } else {
      static_cast<float*>(data)[at] = v;
    }
  }
};

inline bool is_float_type(DType t) { return t == DType::bf16 || t == DType::f32; }

// A CUDA view of bf16 or fp32 rows; anything else is an internal error naming `what`.
inline FloatRows float_rows(const TensorView& v, const char* what) {
  HYDRA_ASSERT(v.device() == Device::cuda && is_float_type(v.dtype()),
               "{} must be a CUDA bfloat16 or float32 tensor (is {} {})", what, device_name(v.device()),
               dtype_name(v.dtype()));
  FloatRows r{v.data(), v.dtype() == DType::bf16, row_layout(v)};
  HYDRA_ASSERT(r.layout.rows < (int64_t{1} << 31), "{}: {} rows exceed the kernels' 32-bit row index", what,
               r.layout.rows);
  return r;
}

// Whether every row of r starts on a `bytes` boundary (bytes a power of two), so that vectors of
// that many bytes at row offsets that are multiples of it are aligned.
inline bool row_starts_aligned(const FloatRows& r, int64_t bytes) {
  const int64_t size = r.bf16 ? 2 : 4;
  return reinterpret_cast<uintptr_t>(r.data) % static_cast<uintptr_t>(bytes) == 0 &&
         (r.layout.stride_outer * size) % bytes == 0 && (r.layout.inner == 1 || (r.layout.stride_inner * size) % bytes == 0);
}

// Whether two row views cover the same rows (count, head split) of the same length.
inline bool same_rows(const RowLayout& a, const RowLayout& b) {
  return a.rows == b.rows && a.inner == b.inner && a.length == b.length;
}

// Visits every (row, col) of a rows × cols grid with blocks of blockDim.x threads: one block step
// covers blockDim.x columns of one row, so the index division happens per block step, not per element.
template <class F>
__device__ __forceinline__ void for_each_element(int64_t rows, int64_t cols, F&& f) {
  const int64_t tiles = (cols + blockDim.x - 1) / blockDim.x;
  for (int64_t b = blockIdx.x; b < rows * tiles; b += gridDim.x) {
    const int64_t row = b / tiles, col = (b % tiles) * blockDim.x + threadIdx.x;
    if (col < cols) f(row, col);
  }
}
constexpr int kElementwiseThreads = 256;
inline int elementwise_grid(int64_t rows, int64_t cols) {
  return capped_grid(rows * ((cols + kElementwiseThreads - 1) / kElementwiseThreads));
}

// Sum over the 32 lanes of a warp, the same tree (and so the same bits) every time.
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// ---- Deterministic column reduction: out[c] (+)= Σ_rows f(row, c) ----

struct ColumnSplits {
  int64_t count = 0;           // number of row splits (0 when there are no rows)
  int64_t rows_per_split = 0;  // every split but the last has exactly this many rows
};
// A function of the row count alone (about 256 rows per split, at most 1024 splits).
inline ColumnSplits column_splits(int64_t rows) {
  if (rows <= 0) return {};
  const int64_t wanted = std::clamp<int64_t>((rows + 255) / 256, 1, 1024);
  const int64_t per = (rows + wanted - 1) / wanted;
  return {(rows + per - 1) / per, per};
}

constexpr int kReduceColumns = 32, kReduceRowLanes = 8;

// partial[split][c] = Σ_{rows of split} f(row, c): thread (x, y) sums rows y, y + 8, ... of its
// split for column x of the block's 32, then the 8 sums are added in order of y.
template <class F>
__global__ void __launch_bounds__(kReduceColumns* kReduceRowLanes)
    column_partials_kernel(F f, int64_t rows, int64_t cols, int64_t rows_per_split, float* partial) {
  __shared__ float sums[kReduceRowLanes][kReduceColumns + 1];
  const int64_t col = int64_t(blockIdx.x) * kReduceColumns + threadIdx.x;
  const int64_t begin = int64_t(blockIdx.y) * rows_per_split;
  const int64_t end = begin + rows_per_split < rows ? begin + rows_per_split : rows;
  float acc = 0.0f;
  if (col < cols) {
    for (int64_t r = begin + threadIdx.y; r < end; r += kReduceRowLanes) acc += f(r, col);
  }
  sums[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    float s = 0.0f;
    for (int y = 0; y < kReduceRowLanes; ++y) s += sums[y][threadIdx.x];
    partial[int64_t(blockIdx.y) * cols + col] = s;
  }
}

// finish(c, Σ_split partial[split][c]) in fp64, in a fixed order: thread (x, y) of a 32 × 8 block adds
// the splits y, y + 8, ... of column x of the block's 32, then the 8 sums are added in order of y.
// (One thread per column adding all splits in turn ran 8 blocks for 2048 columns: latency-bound,
// one of the larger entries of the training profile; cluster/results/h200-2026-12-05.)
template <class G>
__global__ void __launch_bounds__(kReduceColumns* kReduceRowLanes)
    column_finish_kernel(const float* partial, int64_t splits, int64_t cols, G finish) {
  __shared__ double sums[kReduceRowLanes][kReduceColumns + 1];
  for (int64_t c0 = int64_t(blockIdx.x) * kReduceColumns; c0 < cols; c0 += int64_t(gridDim.x) * kReduceColumns) {
    const int64_t col = c0 + threadIdx.x;
    double s = 0.0;
    if (col < cols) {
      for (int64_t k = threadIdx.y; k < splits; k += kReduceRowLanes) s += partial[k * cols + col];
    }
    sums[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && col < cols) {
      double total = 0.0;
      for (int y = 0; y < kReduceRowLanes; ++y) total += sums[y][threadIdx.x];
      finish(col, static_cast<float>(total));
    }
    __syncthreads();  // sums is rewritten by the next column tile
  }
}

template <class G>
void launch_column_finish(const float* partial, int64_t splits, int64_t cols, const G& finish) {
  if (cols == 0) return;
  column_finish_kernel<<<capped_grid((cols + kReduceColumns - 1) / kReduceColumns), dim3(kReduceColumns, kReduceRowLanes),
                         0, current_stream()>>>(partial, splits, cols, finish);
  HYDRA_CUDA_LAUNCH_CHECK();
}

// Runs both kernels on the current stream. f(row, col) -> float and finish(col, total) are device
// functors (passed by value). Nothing is launched when rows or cols is 0.
template <class F, class G>
void reduce_columns(int64_t rows, int64_t cols, const F& f, const G& finish) {
  const ColumnSplits s = column_splits(rows);
  if (s.count == 0 || cols == 0) return;
  Tensor partial = Tensor::empty({s.count, cols}, DType::f32, Device::cuda);  // freed in stream order
  const dim3 grid(static_cast<unsigned>((cols + kReduceColumns - 1) / kReduceColumns), static_cast<unsigned>(s.count));
  column_partials_kernel<<<grid, dim3(kReduceColumns, kReduceRowLanes), 0, current_stream()>>>(
      f, rows, cols, s.rows_per_split, partial.data_as<float>());
  HYDRA_CUDA_LAUNCH_CHECK();
  launch_column_finish(partial.data_as<const float>(), s.count, cols, finish);
}

// The usual finish: out[c] += total (an fp32 gradient accumulator with unit stride).
struct AddTo {
  float* out;
  __device__ void operator()(int64_t col, float total) const { out[col] += total; }
};

}  // namespace hydra::cuda
