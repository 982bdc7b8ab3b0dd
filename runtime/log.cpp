#include "runtime/log.h"

#include <chrono>
#include <cstdio>

namespace hydra::log {
namespace {
int g_rank = 0;
int g_world = 1;
const auto g_start = std::chrono::steady_clock::now();
}  // namespace

void set_rank(int rank, int world_size) {
  g_rank = rank;
  g_world = world_size;
}

double seconds_since_start() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - g_start).count();
}

void write_line(const char* level, bool all_ranks, const std::string& text) {
  if (!all_ranks && g_rank != 0) return;
  std::string line = fmt::format("[hydra {:8.2f}s] ", seconds_since_start());
  if (all_ranks && g_world > 1) line += fmt::format("rank {}: ", g_rank);
  if (std::string_view(level) != "info") line += fmt::format("{}: ", level);
  line += text;
  line += '\n';
  std::fputs(line.c_str(), stderr);
  std::fflush(stderr);
}

}  // namespace hydra::log
