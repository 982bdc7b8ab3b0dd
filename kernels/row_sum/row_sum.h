// Sums of per-row values added into a device accumulator: how a training step's loss head keeps its
// loss sums on the device (model/train/objective.h), so a step replayed as a CUDA graph reads them
// once after the replay instead of reading each chunk's row losses back on the host.
// The CPU implementation adds the rows one after the other in fp64 (the order the host sum had);
// the CUDA kernel (row_sum.cu, one block) adds each thread's rows in fp64 and merges the threads in a
// fixed tree, so its sums are deterministic (and may differ from the sequential sum in the last bits).
#pragma once

#include "runtime/tensor.h"

namespace hydra::ops {

// sums[0] += Σ_i values[i];  sums[1] += Σ_i values[i] · [marks[i] ≠ 0].
// sums [2] f64; values [n] f32 (f64 on the host too); marks [n] i32 or undefined (then sums[1] is
// left as it is). All on one device.
void add_row_sums(const TensorView& sums, const TensorView& values, const TensorView& marks = TensorView());

#if HYDRA_CUDA
namespace cuda_impl {  // row_sum.cu
void add_row_sums(const TensorView& sums, const TensorView& values, const TensorView& marks);
}  // namespace cuda_impl
#endif

}  // namespace hydra::ops
