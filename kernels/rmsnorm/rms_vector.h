// The rows the CUDA RMSNorm takes on its vector path (rmsnorm.cu, rms_backward.cuh) and how it cuts
// them: a row of n = 8·V·G elements (G a power of two ≤ kVectorThreads, V = 1, or V = 2 with G =
// kVectorThreads: n = 8, 16, ..., 2048, 4096) is owned by a group of G threads, thread j of the
// group holding the V runs of eight columns at 8(v·G + j). Plain C++ (no device code), so a host
// launcher can tell whether a row takes this path: the decode GEMV's fused norm (kernels/gemv)
// reproduces this path's arithmetic and is offered only for these widths.
#pragma once

#include <cstdint>

namespace hydra::ops::rms_vector {

constexpr int kThreads = 256;  // threads per CTA of the vector kernels

// The vector path's shape of a row of n elements: G threads of V runs of eight, or none.
struct VectorShape {
  int group = 0, runs = 0;  // G, V; group == 0: no vector path
};
constexpr VectorShape vector_shape(int64_t n) {
  if (n <= 0 || n % 8 != 0) return {};
  const int64_t eights = n / 8;
  if (eights <= kThreads && (eights & (eights - 1)) == 0) return {static_cast<int>(eights), 1};
  if (eights == 2 * kThreads) return {kThreads, 2};
  return {};
}

}  // namespace hydra::ops::rms_vector
