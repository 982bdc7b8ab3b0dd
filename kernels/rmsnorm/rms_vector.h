// The rows the CUDA RMSNorm takes on its vector path (rmsnorm.cu, rms_backward.cuh) and on its
// opt-in small-row path (rms_small_rows.cuh), and how they cut them. The vector path: a row of
// n = 8·V·G elements (G a power of two ≤ kVectorThreads, V = 1, or V = 2 with G = kVectorThreads:
// n = 8, 16, ..., 2048, 4096) is owned by a group of G threads, thread j of the group holding the V
// runs of eight columns at 8(v·G + j). Plain C++ (no device code), so a host launcher can tell
// whether a row takes this path: the decode GEMV's fused norm (kernels/gemv) reproduces this path's
// arithmetic and is offered only for these widths.
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

// The small-row path (HYDRA_SMALL_ROWS=1, kernels/small_rows.h; rms_small_rows.cuh): G threads a row,
// G a power of two ≤ 32 so a row never spans two warps, thread j holding the V runs of eight columns
// at 8(v·G + j): n = 8·G for n ≤ 256 (V = 1: the vector path's own shape), n = 256·V above (G = 32,
// V = 2 or 4: rows of 512 or 1024, which the vector path gives 64 or 128 threads and block-wide sums).
// Run v of lane j is then thread v·32 + j of the vector path's group, so the forward can add the
// same sums in the same order (rms_small_rows.cuh). `max_runs` bounds V (the backward keeps five
// arrays of 8·V values a thread, so it takes V ≤ 2). group == 0: no small-row path.
constexpr VectorShape small_shape(int64_t n, int max_runs) {
  if (n <= 0 || n % 8 != 0) return {};
  const int64_t eights = n / 8;
  if (eights <= 32) return (eights & (eights - 1)) == 0 ? VectorShape{static_cast<int>(eights), 1} : VectorShape{};
  const int64_t runs = eights / 32;
  if (eights % 32 != 0 || (runs & (runs - 1)) != 0 || runs > max_runs) return {};
  return {32, static_cast<int>(runs)};
}
constexpr int kSmallForwardRuns = 4, kSmallBackwardRuns = 2;  // n ≤ 1024 forward, n ≤ 512 backward

// The small-row backward's blocks (kThreads threads, kThreads / G groups, one row a group at a time):
// block b owns rows [b·per_block, b·per_block + per_block), at least two rows a group and at most
// kSmallBackwardBlocks blocks, so the weight gradient's partials are at most that many rows. A
// function of the row count and G alone (never of the device): the same partials, the same bits, on
// every GPU.
constexpr int64_t kSmallBackwardBlocks = 512;
struct SmallBlocks {
  int64_t per_block = 0, blocks = 0;
};
constexpr SmallBlocks small_backward_blocks(int64_t rows, int group) {
  if (rows <= 0 || group <= 0) return {};
  const int64_t least = 2 * (kThreads / group);
  const int64_t spread = (rows + kSmallBackwardBlocks - 1) / kSmallBackwardBlocks;
  const int64_t per_block = spread > least ? spread : least;
  return {per_block, (rows + per_block - 1) / per_block};
}

}  // namespace hydra::ops::rms_vector
