// A CUDA graph of a step that repeats (the decode step, model/decode_engine.h): capture() records
// what a function queues on this thread's current stream (and on streams forked from it and joined
// back, runtime/concurrency.h) without running it; launch() queues the recorded work again as one
// launch, which removes the host's per-kernel launch cost from the step.
//
// Host work inside a step (a collective staged through the host, or one whose communicator waits
// on the host): the step calls it through CudaGraph::outside(fn). Outside a capture that just runs
// fn. During a capture it closes the graph recorded so far (a segment), keeps fn, and opens the next
// segment, so a captured step is segment, fn, segment, fn, ..., segment, and launch() replays them
// in that order: each segment as one launch, each fn run on the host between them (the decode step
// over P ranks: one segment a layer, the layer's all-gather between; one rank: one segment).
//
// What a captured function must honour: the graph replays the same kernels with the same arguments,
// so every buffer it touches has a fixed address (runtime/step_arena.h serves the step's tensors
// from the same blocks every step; inputs are written into persistent buffers before launch()) and
// every host-side value baked into a launch (grid sizes, lengths) must stay valid for later
// launches; a function given to outside() is kept and called at every launch, so it may capture
// only what stays valid as long as the graph (fixed buffers, the communicator). Nothing captured
// may synchronise the device, allocate from the driver or copy from pageable host memory (the
// functions given to outside() may: they run on the host); a host-to-device upload inside a capture
// is recorded from a pinned copy made at capture (upload_in_capture), a device-to-host copy is refused.
// In a build without CUDA capture and
// launch are errors (the callers refuse --cuda-graph on the CPU before any work); outside() runs fn.
#pragma once

#include <cstddef>
#include <functional>
#include <utility>
#include <vector>

typedef struct CUgraph_st* cudaGraph_t;
typedef struct CUgraphExec_st* cudaGraphExec_t;

namespace hydra {

class CudaGraph {
 public:
  CudaGraph() = default;
  ~CudaGraph();
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  bool captured() const { return !segments_.empty(); }
  // Graphs a launch replays (outside() calls + 1); 0 before a capture.
  int segments() const { return static_cast<int>(segments_.size()); }
  // Records what `work` queues on the current stream (nothing runs) and instantiates it, replacing
  // an earlier capture.
  void capture(const std::function<void()>& work);
  // Queues the captured work on the current stream, running the outside() functions between its
  // segments on the host.
  void launch() const;
  void reset();
  // The kernel launches of the captured work, every segment (0 before a capture): what a test
  // counts to see that work forked onto a side stream was captured.
  size_t kernel_nodes() const;

  // Runs `fn` now, or, inside capture() on this thread, records it to run between two segments at
  // every launch (see the top of this file).
  static void outside(const std::function<void()>& fn);

  // Whether capture() is recording on this thread.
  static bool capturing();
  // A host-to-device upload inside capture() on this thread (runtime/cuda_memory.cu cuda_copy_bytes
  // asks first): the bytes are copied into pinned memory the graph keeps while it lives, and the
  // copy from there is recorded, so every launch uploads what the host held AT CAPTURE — right for
  // what is the same every step (RoPE positions and document bounds of a fixed layout), wrong for
  // what changes (token ids, targets: a captured step reads those from persistent device buffers
  // written before launch()). Returns false outside a capture (the caller uploads as usual).
  static bool upload_in_capture(void* dst, const void* src, size_t bytes);
  // Pinned bytes kept by the captured uploads (0: none).
  size_t frozen_upload_bytes() const;

 private:
  struct Segment {
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    std::function<void()> after;  // host work between this segment and the next (none after the last)
  };
  void close_segment(std::function<void()> after);  // ends the capture in progress into a segment
  std::vector<Segment> segments_;
  std::vector<std::pair<void*, size_t>> frozen_;  // pinned host blocks the captured uploads read (upload_in_capture)
};

}  // namespace hydra
