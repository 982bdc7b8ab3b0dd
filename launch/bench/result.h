// What one timed kernel benchmark of hydra bench reports (forward.h, backward.h).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace hydra {

struct KernelBenchResult {
  std::string what;      // the printed label, e.g. "attention causal T=… H=… d=… [kernel]" (anchors.py's names)
  double ms = 0;         // median of the timed launches
  double tflops = 0;     // of the FLOP count the benchmark states
  nlohmann::json extra;  // shape, kernel, further times, the correctness check's errors
};

}  // namespace hydra
