// Shared by the CLI tests: a training run's train.jsonl lines and losses, and structureless tokens.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace hydra::test {

// The lines of `type` ("step", "eval") of a run's train.jsonl.
inline std::vector<nlohmann::json> log_lines(const std::string& out_dir, const std::string& type = "step") {
  std::ifstream in(std::filesystem::path(out_dir) / "train.jsonl");
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.at("type") == type) lines.push_back(j);
  }
  return lines;
}

inline std::vector<double> losses(const std::string& out_dir) {
  std::vector<double> out;
  for (const auto& j : log_lines(out_dir)) out.push_back(j.at("loss").get<double>());
  return out;
}

// Pseudo-random tokens (a fixed LCG), so a sequence has no structure to learn but itself.
inline std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint64_t seed) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& id : ids) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    id = static_cast<int32_t>((x >> 33) % static_cast<uint64_t>(vocab));
  }
  return ids;
}

}  // namespace hydra::test
