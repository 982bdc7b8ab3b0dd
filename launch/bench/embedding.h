// hydra bench --op embedding-bwd: the token embedding's backward (kernels/embedding/) alone.
#pragma once

#include <cstdint>

#include <nlohmann/json.hpp>

namespace hydra {

// Requires a CUDA device (the caller checks). Checks the kernel against the CPU reference first
// (throws on a mismatch), then times it at [tokens, dim] fp32 gradient rows into [vocab, dim] for
// skewed and uniform ids; logs one line per id pattern and returns the JSON report.
nlohmann::json bench_embedding_backward(int64_t tokens, int64_t vocab, int64_t dim, int warmup, int repeat);

}  // namespace hydra
