// One buffer's shape and element type: what an allocation site publishes so that the memory plan
// (model/memory_plan.h) prices the buffer from the same description the code allocates it from.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/dtype.h"
#include "runtime/tensor.h"

namespace hydra {

struct BufferSpec {
  std::vector<int64_t> shape;  // empty: no buffer
  DType dtype = DType::f32;
  bool exists() const { return !shape.empty(); }
  int64_t numel() const {
    int64_t n = 1;
    for (const int64_t s : shape) n *= s;
    return n;
  }
  double bytes() const { return static_cast<double>(numel()) * static_cast<double>(dtype_size(dtype)); }
  Tensor empty(Device device) const { return Tensor::empty(shape, dtype, device); }
  Tensor zeros(Device device) const { return Tensor::zeros(shape, dtype, device); }
};

}  // namespace hydra
