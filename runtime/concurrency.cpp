#include "runtime/concurrency.h"

#include <cstdlib>
#include <string>

#include "runtime/error.h"

#if HYDRA_CUDA
#include "runtime/cuda_memory.h"
#endif

namespace hydra {

bool serial_branches() {
  static const bool serial = [] {
    const char* env = std::getenv("HYDRA_SERIAL_BRANCHES");
    const std::string value = env ? env : "";
    HYDRA_USER_CHECK(value.empty() || value == "0" || value == "1", "HYDRA_SERIAL_BRANCHES must be 0 or 1 (got '{}')",
                     value);
    return value == "1";
  }();
  return serial;
}

void run_concurrently(Device device, const std::function<void()>& main_work, const std::function<void()>& side_work) {
  if (device == Device::host || serial_branches()) {
    side_work();
    main_work();
    return;
  }
#if HYDRA_CUDA
  thread_local CudaStream side;  // one side stream per host thread, reused across layers
  CudaEvent forked, joined;
  forked.record(current_stream());
  forked.wait_on(side.get());
  {
    StreamGuard guard(side.get());
    side_work();
  }
  joined.record(side.get());
  main_work();
  joined.wait_on(current_stream());
#else
  side_work();
  main_work();
#endif
}

}  // namespace hydra
