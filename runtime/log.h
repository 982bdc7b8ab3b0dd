// Logging: one line per event on stderr, prefixed with the time since start. Progress and info
// lines come from rank 0 only (the launcher sets the rank); warnings and errors from any rank
// carry their rank. Results meant for scripts go to stdout, never through here.
#pragma once

#include <string>

#include <fmt/format.h>

namespace hydra::log {

void set_rank(int rank, int world_size);
void write_line(const char* level, bool all_ranks, const std::string& text);

template <class... Args>
void info(fmt::format_string<Args...> f, Args&&... args) {
  write_line("info", false, fmt::format(f, std::forward<Args>(args)...));
}
template <class... Args>
void warn(fmt::format_string<Args...> f, Args&&... args) {
  write_line("warning", true, fmt::format(f, std::forward<Args>(args)...));
}
double seconds_since_start();

}  // namespace hydra::log
