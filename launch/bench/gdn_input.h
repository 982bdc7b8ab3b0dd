// hydra bench --op gdn-input: the bandwidth-bound kernels around the delta rule (gdn_input.cpp).
#pragma once

#include <cstdint>

#include <nlohmann/json.hpp>

namespace hydra {

// Requires a CUDA device (the caller checks). Checks each kernel against the CPU path first (throws
// on a mismatch), then times it; logs one line per kernel and returns the JSON report.
nlohmann::json bench_gdn_input(int64_t tokens, int64_t gdn_heads, int64_t head_dim, int warmup, int repeat);

}  // namespace hydra
