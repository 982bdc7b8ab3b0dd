// hydra bench --op gemv: the decode step's bandwidth-bound projections and its arg-max, timed alone
// (gemv.cpp), so that one GPU job compares the GEMV's launch shapes (ops::GemvTuning) per projection.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/gemv/gemv.h"

namespace hydra {

struct GemvBenchOptions {
  std::string preset;                  // the projections of its layer 0: in_proj, o_proj, mlp_in, mlp_down
  std::vector<int64_t> batches;        // rows M (1 to ops::kGemvMaxRows)
  std::vector<ops::GemvTuning> tunings;  // each timed per (projection, batch), in order
  int warmup = 3;
  int repeat = 10;
};

// Requires a CUDA device (the caller checks). Per (projection, batch): each tuning's result against
// the CPU reference first (the run ends on a mismatch), then per tuning and cuBLAS (ops::linear) the
// time of one launch, as the median over rounds of back-to-back launches over copies of the weight
// that together exceed L2 ~10 times (each launch streams its weight from DRAM, as in a decode step),
// without and with programmatic dependent launch: µs, GB/s (weight + x + out bytes) and the fraction
// of a device copy measured in the same run. Then row_argmax over the preset's vocabulary at each
// batch. `emit` gets one JSON object per line printed.
void bench_gemv(const GemvBenchOptions& options, const std::function<void(const nlohmann::json&)>& emit);

}  // namespace hydra
