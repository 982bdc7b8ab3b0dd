// Weight initialisation on the GPU: the same counter-based streams and formulas as the host
// (model/params.h init_value), so `--preset hydrahead-1.7b` draws its 2B weights in milliseconds
// instead of a minute on the host, and equals the host draw.
#include "kernels/cuda/common.cuh"
#include "model/params.h"

namespace hydra {
namespace {
template <class T>
__global__ void init_kernel(T* out, int64_t n, Init init, RandomStream rng, double kernel) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    out[i] = cuda::from_float<T>(static_cast<float>(init_value(init, rng, static_cast<uint64_t>(i), kernel)));
  }
}
}  // namespace

void init_parameter_cuda(Init init, const RandomStream& rng, double kernel, const TensorView& out) {
  HYDRA_ASSERT(out.is_contiguous(), "init of a strided view");
  const int64_t n = out.numel();
  const int grid = cuda::capped_grid((n + 255) / 256);
  if (out.dtype() == DType::bf16) {
    init_kernel<<<grid, 256, 0, current_stream()>>>(out.data_as<cuda::bf16_t>(), n, init, rng, kernel);
  } else {
    cuda::expect_cuda(out, "parameter", DType::f32);
    init_kernel<<<grid, 256, 0, current_stream()>>>(out.data_as<float>(), n, init, rng, kernel);
  }
  HYDRA_CUDA_LAUNCH_CHECK();
}

}  // namespace hydra
