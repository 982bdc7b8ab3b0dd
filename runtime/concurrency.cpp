#include "runtime/concurrency.h"

#include <vector>

#include "runtime/error.h"
#include "runtime/memory_timeline.h"

#if HYDRA_CUDA
#include "runtime/cuda_memory.h"
#endif

namespace hydra {
namespace {

#if HYDRA_CUDA
// The side streams of this thread's run_concurrently calls whose main_work is running, and of its
// started and not yet joined SideWork, innermost last.
std::vector<cudaStream_t>& open_sides() {
  thread_local std::vector<cudaStream_t> sides;
  return sides;
}

cudaStream_t side_work_stream() {
  thread_local CudaStream side;  // this thread's side stream for SideWork (not run_concurrently's)
  return side.get();
}
#endif

}  // namespace

void join_open_branches() {
#if HYDRA_CUDA
  for (cudaStream_t side : open_sides()) {
    CudaEvent done;
    done.record(side);
    done.wait_on(current_stream());
  }
#endif
}

void reopen_branches() {
#if HYDRA_CUDA
  for (cudaStream_t side : open_sides()) {
    CudaEvent now;
    now.record(current_stream());
    now.wait_on(side);
  }
#endif
}

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
  open_sides().push_back(side.get());
  try {
    main_work();
  } catch (...) {
    open_sides().pop_back();
    throw;
  }
  open_sides().pop_back();
  // Recorded at the join, not after side_work: a graph cut inside main_work (CudaGraph::outside)
  // ends the capture the side's work was recorded in and rejoins the side stream to the next one,
  // and a wait on an event of the ended capture is refused (cudaStreamWaitEvent: invalid argument,
  // the first P-rank graph run on a GPU). Nothing else is queued on this side stream in between
  // (a nested run_concurrently's side work is joined into main_work before it returns).
  joined.record(side.get());
  joined.wait_on(current_stream());
#else
  side_work();
  main_work();
#endif
}

SideWork::~SideWork() {
#if HYDRA_CUDA
  if (open_ && !open_sides().empty() && open_sides().back() == side_work_stream()) open_sides().pop_back();
#endif
}

void SideWork::start(Device device, Branches branches, const std::function<void()>& work) {
  HYDRA_ASSERT(!started_, "side work started twice");
  started_ = true;
  if (device == Device::host || branches == Branches::serial || ShapeOnlyRun::active()) {
    work();
    return;
  }
#if HYDRA_CUDA
  const cudaStream_t side = side_work_stream();
  CudaEvent forked;
  forked.record(current_stream());
  forked.wait_on(side);
  {
    StreamGuard guard(side);
    work();
  }
  open_sides().push_back(side);
  open_ = true;
#else
  work();
#endif
}

void SideWork::join() {
#if HYDRA_CUDA
  if (!open_) return;
  const cudaStream_t side = side_work_stream();
  HYDRA_ASSERT(!open_sides().empty() && open_sides().back() == side, "side work joined out of order");
  open_sides().pop_back();
  open_ = false;
  // Recorded now rather than at start(): after a graph cut (CudaGraph::outside) the side stream
  // rejoined the capture in progress, and the event must belong to it.
  CudaEvent done;
  done.record(side);
  done.wait_on(current_stream());
#endif
}

}  // namespace hydra
