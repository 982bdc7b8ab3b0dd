// hydra bench --op attention-bwd | gdn-bwd: forward + backward of the two heavy kernels, after a
// correctness check against the CPU reference on a small shape (backward.cpp).
#pragma once

#include <cstdint>
#include <string>

#include "kernels/kernel_options.h"
#include "launch/bench/result.h"

namespace hydra {

inline bool is_backward_bench_op(const std::string& op) { return op == "attention-bwd" || op == "gdn-bwd"; }

// Requires a CUDA device (the caller checks). Throws if the correctness check fails. The result:
// what "attention fwd+bwd causal T=… H=… d=…" / "gdn fwd+bwd T=… H=… d=…" (anchors.py's names), ms
// forward + backward, tflops of the FLOP count stated in backward.cpp, extra the shape, the
// backward-only time and the correctness check's error ratios. `kernels`: the
// attention backward kernel and the GDN options to time (App::kernels). attention-bwd also times
// the backward alone with every kernel that runs the shape (backward_ms_by_kernel) and the delta
// pass alone (delta_ms); doc_len > 0 packs the tokens as documents of doc_len tokens (the
// small-model step's shape: 16K tokens as 64 documents of 256).
KernelBenchResult bench_backward(const std::string& op, int64_t tokens, int64_t heads, int64_t kv_heads,
                                   int64_t head_dim, int64_t doc_len, int warmup, int repeat,
                                   const ops::KernelOptions& kernels);

}  // namespace hydra
