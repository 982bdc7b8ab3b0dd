// The CPU reference of the GEMM (matmul_reference.cpp), called by its entry point (matmul.cpp) for host
// tensors once shapes are checked: gemm's arguments with op(a) [m, k] and op(b) [k, n] resolved; and the
// thread count of the BLAS it calls. Internal to kernels/matmul/.
#pragma once

#include "kernels/matmul/matmul.h"

namespace hydra::ops::reference {

void gemm(const TensorView& out, const TensorView& a, const TensorView& b, const GemmParams& p, int64_t m, int64_t n,
          int64_t k);
void set_cpu_threads(int threads);

}  // namespace hydra::ops::reference
