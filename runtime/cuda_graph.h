// A CUDA graph of a step that repeats (the decode step at P = 1, model/decode_engine.h): capture()
// records what a function queues on this thread's current stream (and on streams forked from it and
// joined back, runtime/concurrency.h) without running it; launch() queues the recorded work again
// as one launch, which removes the host's per-kernel launch cost from the step.
//
// What a captured function must honour: the graph replays the same kernels with the same arguments,
// so every buffer it touches has a fixed address (runtime/step_arena.h serves the step's tensors
// from the same blocks every step; inputs are written into persistent buffers before launch()) and
// every host-side value baked into a launch (grid sizes, lengths) must stay valid for later
// launches. Nothing inside may synchronise the device, allocate from the driver or copy from
// pageable host memory. In a build without CUDA every call is an error (the callers refuse
// --cuda-graph on the CPU before any work).
#pragma once

#include <functional>

typedef struct CUgraph_st* cudaGraph_t;
typedef struct CUgraphExec_st* cudaGraphExec_t;

namespace hydra {

class CudaGraph {
 public:
  CudaGraph() = default;
  ~CudaGraph();
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  bool captured() const { return exec_ != nullptr; }
  // Records what `work` queues on the current stream (nothing runs) and instantiates it, replacing
  // an earlier capture.
  void capture(const std::function<void()>& work);
  // Queues the captured work on the current stream.
  void launch() const;
  void reset();

 private:
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace hydra
