// hydra bench --op gemm | attention | gdn: the forward kernels, each after a correctness check
// against the CPU reference on a slice (forward.cpp).
//   gemm: M×N×K bf16 through cuBLAS, TFLOP/s = 2·M·N·K / time.
//   attention: causal FA forward (τ on, as the HydraHead FA heads run), TFLOP/s = 2·T²·d·H / time.
//   gdn: the chunked gated delta rule forward (prepare + state pass + outputs), time and the
//   effective TFLOP/s of model/cost.h's FLOP count.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/kernel_options.h"
#include "launch/bench/result.h"

namespace hydra {

inline bool is_forward_bench_op(const std::string& op) { return op == "attention" || op == "gdn"; }

// Requires a CUDA device (the caller checks). TFLOP/s of an M×N×K bf16 GEMM (no check: cuBLAS).
double gemm_tflops(int64_t m, int64_t n, int64_t k, int warmup, int repeat);

// op: attention or gdn. Requires a CUDA device (the caller checks). Throws if the correctness check
// fails. `kernels`: the attention kernel and the GDN options to time (App::kernels).
KernelBenchResult bench_forward(const std::string& op, int64_t tokens, int64_t heads, int64_t kv_heads,
                                int64_t head_dim, int warmup, int repeat, const ops::KernelOptions& kernels);

}  // namespace hydra
