// Helpers shared by the multi-rank suites (they run under mpirun, one process per rank): the
// world communicator, a rank's zigzag rows of a global tensor, and lengths the layout admits.
#pragma once

#include <cstdint>
#include <vector>

#include "parallel/layout.h"
#include "parallel/mpi_communicator.h"
#include "runtime/tensor.h"

namespace hydra::test {

inline MpiCommunicator& world() {
  static MpiCommunicator comm;
  return comm;
}

// The rows of `global` [T, ...] that this rank owns, in local order.
inline Tensor local_rows(const SequenceLayout& layout, const TensorView& global) { return layout.local_rows(global); }

// Admissible lengths for P ranks: `multiples` of the layout's granularity (2P), so segments of
// 3·… and 37·… tokens cross chunk boundaries at odd places.
inline std::vector<int64_t> admissible_lengths(int p, std::initializer_list<int64_t> multiples) {
  const int64_t g = SequenceLayout::granularity(p);
  std::vector<int64_t> out;
  for (int64_t m : multiples) out.push_back(g * m);
  return out;
}

}  // namespace hydra::test
