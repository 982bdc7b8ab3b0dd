#include "runtime/host_memory.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <string>

namespace hydra {
namespace {

std::atomic<size_t> g_host_in_use{0};
std::atomic<size_t> g_host_peak{0};
std::atomic<size_t> g_host_allocations{0};

// The first number in `path` (a cgroup file), or −1 when absent or "max".
double read_number(const char* path) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text) || text.empty() || text.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stod(text);
}

double mem_available() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  double kib = 0;
  while (in >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024.0;
  }
  return static_cast<double>(sysconf(_SC_AVPHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
}

}  // namespace

double host_peak_memory_gib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / (1024.0 * 1024.0);  // ru_maxrss is KiB on Linux
}

double host_available_bytes() {
  double available = mem_available();
  const double v2_max = read_number("/sys/fs/cgroup/memory.max"),
               v2_used = read_number("/sys/fs/cgroup/memory.current");
  if (v2_max > 0 && v2_used >= 0) available = std::min(available, std::max(0.0, v2_max - v2_used));
  const double v1_max = read_number("/sys/fs/cgroup/memory/memory.limit_in_bytes");
  const double v1_used = read_number("/sys/fs/cgroup/memory/memory.usage_in_bytes");
  if (v1_max > 0 && v1_max < 1e18 && v1_used >= 0) available = std::min(available, std::max(0.0, v1_max - v1_used));
  return available;
}

void note_host_allocation(size_t bytes) {
  g_host_allocations.fetch_add(1);
  const size_t now = g_host_in_use.fetch_add(bytes) + bytes;
  size_t peak = g_host_peak.load();
  while (now > peak && !g_host_peak.compare_exchange_weak(peak, now)) {
  }
}

void note_host_free(size_t bytes) { g_host_in_use.fetch_sub(bytes); }

HostTensorStats host_tensor_stats() { return {g_host_in_use.load(), g_host_peak.load(), g_host_allocations.load()}; }

void host_tensor_reset_peak() { g_host_peak.store(g_host_in_use.load()); }

}  // namespace hydra
