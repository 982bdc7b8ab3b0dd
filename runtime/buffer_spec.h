// One buffer's shape and element type, published beside the code that allocates from it (a layer's
// table, model/layer_buffers.h; an op's workspaces) so that tests and tools read the same shapes.
// The allocation names the buffer (runtime/memory_label.h); the memory plans record it there.
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
  Tensor empty(Device device, MemoryLabel label = {}) const { return Tensor::empty(shape, dtype, device, label); }
  Tensor zeros(Device device, MemoryLabel label = {}) const { return Tensor::zeros(shape, dtype, device, label); }
};

}  // namespace hydra
