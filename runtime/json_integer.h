// Integers read from JSON written by someone else (checkpoint configs, HF config.json, safetensors
// headers, training manifests): nlohmann's get<int64_t>() casts a float such as 1e300 to an integer,
// which is undefined behaviour, truncates 1.5 to 1 and wraps negative numbers into uint64_t silently.
// Every number read from such a file goes through these, before any cast.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace hydra {

// An integer-valued JSON number (an integer, or a float such as 1e7 with an integral value within
// ±2^53); UserError naming `what` otherwise.
int64_t json_integer(const nlohmann::json& value, const std::string& what);
// The same, and within [lo, hi]: UserError naming `what`, the value and the range otherwise.
int64_t json_integer_in(const nlohmann::json& value, const std::string& what, int64_t lo, int64_t hi);

}  // namespace hydra
