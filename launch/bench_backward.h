// hydra bench --op attention-bwd | gdn-bwd: forward + backward of the two heavy kernels, after a
// correctness check against the CPU reference on a small shape (bench_backward.cpp).
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "kernels/kernel_options.h"

namespace hydra {

inline bool is_backward_bench_op(const std::string& op) { return op == "attention-bwd" || op == "gdn-bwd"; }

struct BackwardBenchResult {
  std::string what;     // "attention fwd+bwd causal T=… H=… d=…" / "gdn fwd+bwd T=… H=… d=…" (anchors.py's names)
  double ms = 0;        // forward + backward, median
  double tflops = 0;    // of the FLOP count stated in bench_backward.cpp
  nlohmann::json extra;  // shape, backward-only time, the correctness check's error ratios
};

// Requires a CUDA device (the caller checks). Throws if the correctness check fails. `kernels`: the
// attention backward kernel and the GDN options to time (App::kernels).
BackwardBenchResult bench_backward(const std::string& op, int64_t tokens, int64_t heads, int64_t kv_heads,
                                   int64_t head_dim, int warmup, int repeat, const ops::KernelOptions& kernels);

}  // namespace hydra
