#include "runtime/concurrency.h"

#include "runtime/memory_timeline.h"

#if HYDRA_CUDA
#include "runtime/cuda_memory.h"
#endif

namespace hydra {

void run_concurrently(Device device, Branches branches, const std::function<void()>& main_work,
                      const std::function<void()>& side_work) {
  // A shape-only run (runtime/memory_timeline.h) holds the side work's buffers first, as the host
  // order is on the GPU too; it launches nothing.
  if (device == Device::host || branches == Branches::serial || ShapeOnlyRun::active()) {
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
