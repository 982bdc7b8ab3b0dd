// CUDA embedding lookup: one block per token row, 16-byte copies when the row allows.
#include "kernels/cuda/common.cuh"
#include "kernels/embedding/embedding.h"

namespace hydra::ops::cuda_impl {
namespace {
__global__ void embedding_kernel(bf16_t* out, int64_t out_stride, const bf16_t* table, int64_t table_stride,
                                 const int32_t* ids, int64_t rows, int64_t dim) {
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
}  // namespace

void embedding(const TensorView& out, const TensorView& table, const TensorView& ids) {
  cuda::expect_cuda(out, "embedding out", DType::bf16);
  cuda::expect_cuda(table, "embedding table", DType::bf16);
  cuda::expect_cuda(ids, "token ids", DType::i32);
  embedding_kernel<<<cuda::capped_grid(out.size(0)), 128, 0, current_stream()>>>(
      out.data_as<cuda::bf16_t>(), out.stride(0), table.data_as<const cuda::bf16_t>(), table.stride(0),
      ids.data_as<const int32_t>(), out.size(0), out.size(1));
  HYDRA_CUDA_LAUNCH_CHECK();
}

}  // namespace hydra::ops::cuda_impl
