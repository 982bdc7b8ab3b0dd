// Integers read from JSON written by someone else (checkpoint configs, HF config.json, safetensors
// headers): nlohmann's get<int64_t>() casts a float such as 1e300 to an integer, which is undefined
// behaviour, and wraps negative numbers into uint64_t silently.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace hydra {

// An integer-valued JSON number (an integer, or a float such as 1e7 with an integral value within
// ±2^53); UserError naming `what` otherwise.
int64_t json_integer(const nlohmann::json& value, const std::string& what);

}  // namespace hydra
