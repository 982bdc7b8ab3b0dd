#include "runtime/host_memory.h"

#include <sys/resource.h>
#include <unistd.h>

namespace hydra {

double host_peak_memory_gib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / (1024.0 * 1024.0);  // ru_maxrss is KiB on Linux
}

double host_available_memory_bytes() {
  return static_cast<double>(sysconf(_SC_AVPHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
}

}  // namespace hydra
