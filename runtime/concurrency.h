// Two independent pieces of work run concurrently on the GPU: `main_work` on the calling thread's
// current stream and `side_work` on a second stream that first waits for everything already queued
// on the current stream; the current stream then waits for the side stream before anything queued
// later. On the host (and for host work) the two run one after the other, side_work first.
//
// Used for the FA and GDN branches of a HydraHead layer (DESIGN.md §3.5: the branches are independent, so
// the ring's transfers and attention overlap the GDN scan). Tensors created inside side_work are
// allocated and freed in the side stream's order; inputs come from before the fork, outputs are
// read after the join, so the stream-ordered allocator never hands out memory still in use.
//
// A shape-only run (runtime/memory_timeline.h) runs them one after the other, side_work first.
// Branches::serial runs both on the current stream, side_work first (a measurement knob,
// HYDRA_SERIAL_BRANCHES=1 via launch/: the step or prefill time with and without it is what the
// overlap buys).
//
// SideWork is the open-ended form: work forked onto a side stream that the current stream joins
// only where the caller says, so the kernels queued on the current stream in between never wait
// for it. Used for the decode step's L2 prefetch of a layer's weights (model_forward.cpp), which
// must not delay the layer's own chain of kernels.
#pragma once

#include <functional>

#include "runtime/dtype.h"

namespace hydra {

enum class Branches { concurrent, serial };

void run_concurrently(Device device, Branches branches, const std::function<void()>& main_work,
                      const std::function<void()>& side_work);

// A CUDA graph cut inside main_work (runtime/cuda_graph.h: CudaGraph::outside, the decode step's
// all-gather in the FA branch while the GDN branch runs on the side stream): a capture can only end
// once every stream forked from it has joined it again. join_open_branches makes the current stream
// wait for the side streams of the run_concurrently calls open on this thread; reopen_branches makes
// them wait for the current stream again (in the next segment's capture), so their work after the cut
// (none: side_work was queued before main_work) and their own join stay ordered as without the cut.
// No-ops on a build without CUDA.
// SideWork's open side stream counts among them too.
void join_open_branches();
void reopen_branches();

// start(): a side stream (one per host thread, not run_concurrently's) waits for everything queued
// so far on the current stream, then `work` is queued on it; the host does not block. join(): the
// current stream waits for everything queued on that side stream (device-side; a no-op when nothing
// was started or it was joined already). Until join() the side stream is one of this thread's open
// branches (join_open_branches above), so a graph cut in between stays legal. Under CUDA graph
// capture the fork and the join become the graph's edges, so the work must be joined before the
// capture ends. Joins nest with run_concurrently's: a SideWork started before a run_concurrently
// call is joined after it returns. On the host, in a shape-only run, or with Branches::serial,
// start() runs `work` at once on the current stream.
class SideWork {
 public:
  SideWork() = default;
  ~SideWork();  // an open side stream (an exception before join()) leaves the open branches
  SideWork(const SideWork&) = delete;
  SideWork& operator=(const SideWork&) = delete;
  void start(Device device, Branches branches, const std::function<void()>& work);  // at most once
  void join();
  bool started() const { return started_; }

 private:
  bool started_ = false;
  bool open_ = false;  // forked onto the side stream and not joined yet (GPU only)
};

}  // namespace hydra
