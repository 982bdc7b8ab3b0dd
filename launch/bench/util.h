// What the hydra bench ops share: seeded random device tensors and the median of CUDA-event timings.
#pragma once

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <string>
#include <vector>

#include "model/params.h"
#include "runtime/cuda_memory.h"
#include "runtime/tensor.h"

namespace hydra::bench {

// A device tensor drawn from N(0, 1) (or `init`), by (seed, name) as parameters are.
inline Tensor random_device(std::initializer_list<int64_t> shape, const std::string& name, uint64_t seed,
                            DType dtype = DType::bf16, Init init = Init::unit_normal) {
  const std::vector<int64_t> dims(shape);
  Tensor t = Tensor::empty(shape, dtype, Device::cuda);
  init_parameter(ParamSpec{name, dims, init}, seed, t);
  return t;
}

// Median milliseconds of `repeat` launches of f on the current stream, after `warmup` untimed ones.
template <class F>
double median_ms(int warmup, int repeat, F&& f) {
  for (int i = 0; i < warmup; ++i) f();
  std::vector<double> ms;
  for (int i = 0; i < repeat; ++i) {
    CudaEvent start(true), stop(true);
    start.record(current_stream());
    f();
    stop.record(current_stream());
    stop.synchronize();
    ms.push_back(stop.elapsed_ms_since(start));
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace hydra::bench
