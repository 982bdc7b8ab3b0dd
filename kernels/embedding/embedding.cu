// CUDA embedding lookup: one block per token row, 16-byte copies when the row allows.
//
// Backward (d_table[id] += d_out[t] for every t with ids[t] = id), deterministic: the (id, t) pairs
// are sorted by id with CUB's stable radix sort, so each id's tokens form one run in increasing t;
// one block per run sums its rows in that order and adds the sum to the id's row once. No two blocks
// touch the same row and no atomics are used, so the result has the same bits on every run.
#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/backward.cuh"
#include "kernels/embedding/embedding.h"

namespace hydra::ops::cuda_impl {
namespace {
__global__ void embedding_kernel(bf16_t* out, int64_t out_stride, const bf16_t* table, int64_t table_stride,
                                 const int32_t* ids, int64_t rows, int64_t dim) {
  cuda::wait_for_previous_grid();  // launched through cuda::launch (PDL in a decode step)
  cuda::allow_next_grid();
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const bf16_t* src = table + ids[r] * table_stride;
    bf16_t* dst = out + r * out_stride;
    if (dim % 8 == 0 && table_stride % 8 == 0 && out_stride % 8 == 0) {
      for (int64_t i = threadIdx.x; i < dim / 8; i += blockDim.x)
        reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<const uint4*>(src)[i];
    } else {
      for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) dst[i] = src[i];
    }
  }
}

// Ids as unsigned keys: a negative id sorts after every valid one and is skipped with them.
__global__ void ids_to_keys_kernel(uint32_t* keys, int32_t* order, const int32_t* ids, int64_t ids_stride, int64_t n) {
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < n; t += int64_t(gridDim.x) * blockDim.x) {
    keys[t] = static_cast<uint32_t>(ids[t * ids_stride]);
    order[t] = static_cast<int32_t>(t);
  }
}

// Block p of the sorted sequence works only if p starts a run of equal ids; it sums the run's rows
// of d_out in sorted (= token) order and adds the sum to d_table[id]. Ids ≥ vocab (caller bugs:
// callers validate token ids) are skipped.
__global__ void embedding_backward_kernel(float* d_table, int64_t table_stride, int64_t vocab, cuda::FloatRows d_out,
                                          const uint32_t* keys, const int32_t* order, int64_t n, int64_t dim) {
  for (int64_t p = blockIdx.x; p < n; p += gridDim.x) {
    const uint32_t id = keys[p];
    if ((p > 0 && keys[p - 1] == id) || id >= vocab) continue;  // uniform across the block
    // The run's end by bisection over the sorted keys (a frequent token's run is thousands long: a
    // linear scan cost the small model's step ~0.3 ms in this kernel).
    int64_t lo = p + 1, hi = n;
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (keys[mid] == id) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    const int64_t end = lo;
    float* row = d_table + int64_t(id) * table_stride;
    for (int64_t col = threadIdx.x; col < dim; col += blockDim.x) {
      // Four partial sums (rows p + 4i + j into acc[j]) keep four loads in flight, added in a fixed
      // order at the end: the same result every run.
      float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      int64_t q = p;
      for (; q + 4 <= end; q += 4) {
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[j] += d_out.load(d_out.offset(order[q + j]) + col);
      }
      for (int j = 0; q < end; ++q, ++j) acc[j] += d_out.load(d_out.offset(order[q]) + col);
      row[col] += (acc[0] + acc[1]) + (acc[2] + acc[3]);
    }
  }
}
}  // namespace

void embedding(const TensorView& out, const TensorView& table, const TensorView& ids) {
  cuda::expect_cuda(out, "embedding out", DType::bf16);
  cuda::expect_cuda(table, "embedding table", DType::bf16);
  cuda::expect_cuda(ids, "token ids", DType::i32);
  cuda::launch(embedding_kernel, cuda::capped_grid(out.size(0)), 128, 0, out.data_as<cuda::bf16_t>(), out.stride(0),
               table.data_as<const cuda::bf16_t>(), table.stride(0), ids.data_as<const int32_t>(), out.size(0),
               out.size(1));
  HYDRA_CUDA_LAUNCH_CHECK();
}

void embedding_backward(const TensorView& d_table, const TensorView& d_out, const TensorView& ids) {
  cuda::expect_cuda(d_table, "embedding d_table", DType::f32);
  cuda::expect_cuda(ids, "token ids", DType::i32);
  const cuda::FloatRows fdo = cuda::float_rows(d_out, "embedding d_out");
  HYDRA_ASSERT(d_table.rank() == 2 && d_table.stride(1) == 1 && d_out.rank() == 2 && ids.rank() == 1 &&
                   d_out.size(0) == ids.size(0) && d_out.size(1) == d_table.size(1),
               "embedding_backward: d_table {} (unit column stride), d_out {} and ids {} must be [V, D], [T, D], [T]",
               d_table.shape_string(), d_out.shape_string(), ids.shape_string());
  const int64_t n = ids.size(0), dim = d_out.size(1);
  HYDRA_ASSERT(n < (int64_t{1} << 31), "embedding_backward: {} tokens exceed the sort's 32-bit indices", n);
  if (n == 0 || dim == 0) return;
  Tensor keys_in = Tensor::empty({n}, DType::i32, Device::cuda), keys = Tensor::empty({n}, DType::i32, Device::cuda);
  Tensor order_in = Tensor::empty({n}, DType::i32, Device::cuda), order = Tensor::empty({n}, DType::i32, Device::cuda);
  ids_to_keys_kernel<<<cuda::capped_grid((n + 255) / 256), 256, 0, current_stream()>>>(
      static_cast<uint32_t*>(keys_in.data()), order_in.data_as<int32_t>(), ids.data_as<const int32_t>(), ids.stride(0),
      n);
  HYDRA_CUDA_LAUNCH_CHECK();
  const auto sort = [&](void* temp, size_t& temp_bytes) {
    HYDRA_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, static_cast<const uint32_t*>(keys_in.data()),
                                                     static_cast<uint32_t*>(keys.data()),
                                                     order_in.data_as<const int32_t>(), order.data_as<int32_t>(),
                                                     static_cast<int>(n), 0, 32, current_stream()));
  };
  size_t temp_bytes = 0;
  sort(nullptr, temp_bytes);  // size query only
  Tensor temp = Tensor::empty({static_cast<int64_t>((temp_bytes + 3) / 4)}, DType::i32, Device::cuda);
  sort(temp.data(), temp_bytes);
  embedding_backward_kernel<<<cuda::capped_grid(n), 256, 0, current_stream()>>>(
      d_table.data_as<float>(), d_table.stride(0), d_table.size(0), fdo, static_cast<const uint32_t*>(keys.data()),
      order.data_as<const int32_t>(), n, dim);
  HYDRA_CUDA_LAUNCH_CHECK();
}

}  // namespace hydra::ops::cuda_impl
