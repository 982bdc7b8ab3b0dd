#include "runtime/cuda_graph.h"

#include <cuda_runtime.h>

#include <cstring>
#include <vector>

#include "runtime/concurrency.h"
#include "runtime/cuda_memory.h"
#include "runtime/error.h"
#include "runtime/step_arena.h"

namespace hydra {
namespace {

thread_local CudaGraph* t_capturing = nullptr;  // the graph capture() is recording on this thread
thread_local cudaStream_t t_origin = nullptr;     // the stream it captures

void begin_capture() {
  // Relaxed: the step's ops create events (runtime/concurrency.cpp), which the global mode refuses;
  // the step arena keeps allocation out of the captured region.
  HYDRA_CUDA_CHECK(cudaStreamBeginCapture(current_stream(), cudaStreamCaptureModeRelaxed));
}

}  // namespace

CudaGraph::~CudaGraph() { reset(); }

void CudaGraph::reset() {
  for (Segment& s : segments_) {
    if (s.exec) cudaGraphExecDestroy(s.exec);
    if (s.graph) cudaGraphDestroy(s.graph);
  }
  segments_.clear();
  // The graphs that read these blocks are gone; a launch of them completed before any later host
  // work that could reset (the callers synchronise once a step).
  for (const auto& [p, bytes] : frozen_) cudaFreeHost(p);
  frozen_.clear();
}

bool CudaGraph::capturing() { return t_capturing != nullptr; }

bool CudaGraph::upload_in_capture(void* dst, const void* src, size_t bytes) {
  CudaGraph* graph = t_capturing;
  if (graph == nullptr) return false;
  void* pinned = nullptr;
  HYDRA_CUDA_CHECK(cudaHostAlloc(&pinned, bytes == 0 ? 1 : bytes, cudaHostAllocDefault));  // allowed in a relaxed capture
  graph->frozen_.emplace_back(pinned, bytes);
  std::memcpy(pinned, src, bytes);
  HYDRA_CUDA_CHECK(cudaMemcpyAsync(dst, pinned, bytes, cudaMemcpyHostToDevice, current_stream()));
  return true;
}

size_t CudaGraph::frozen_upload_bytes() const {
  size_t total = 0;
  for (const auto& [p, bytes] : frozen_) total += bytes;
  return total;
}

void CudaGraph::close_segment(std::function<void()> after) {
  Segment& s = segments_.emplace_back();  // destroyed by reset(), whatever fails below
  s.after = std::move(after);
  HYDRA_CUDA_CHECK(cudaStreamEndCapture(current_stream(), &s.graph));
  HYDRA_CUDA_CHECK(cudaGraphInstantiate(&s.exec, s.graph, 0));
}

void CudaGraph::capture(const std::function<void()>& work) {
  reset();
  HYDRA_ASSERT(t_capturing == nullptr, "a CUDA graph capture inside another on the same thread");
  begin_capture();
  t_capturing = this;
  t_origin = current_stream();
  try {
    work();
    t_capturing = nullptr;
    close_segment({});
  } catch (...) {
    t_capturing = nullptr;
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(current_stream(), &status) == cudaSuccess && status != cudaStreamCaptureStatusNone) {
      cudaGraph_t partial = nullptr;
      cudaStreamEndCapture(current_stream(), &partial);  // leave the stream usable; the error is the work's
      if (partial) cudaGraphDestroy(partial);
    }
    cudaGetLastError();
    reset();
    throw;
  }
}

void CudaGraph::outside(const std::function<void()>& fn) {
  CudaGraph* graph = t_capturing;
  if (graph == nullptr) {
    const StepArenaPause pause;  // not the step's memory: a capture defers fn (step_arena.h)
    fn();
    return;
  }
  HYDRA_ASSERT(current_stream() == t_origin, "CudaGraph::outside on a side stream of the capture (cut the graph on its own stream)");
  t_capturing = nullptr;  // while the segment closes (an error there is the capture's: capture() cleans up)
  join_open_branches();   // a capture ends only with its forked streams joined (runtime/concurrency.h)
  graph->close_segment(fn);
  begin_capture();
  reopen_branches();
  t_capturing = graph;
}

size_t CudaGraph::kernel_nodes() const {
  size_t kernels = 0;
  for (const Segment& s : segments_) {
    size_t n = 0;
    HYDRA_CUDA_CHECK(cudaGraphGetNodes(s.graph, nullptr, &n));
    std::vector<cudaGraphNode_t> nodes(n);
    HYDRA_CUDA_CHECK(cudaGraphGetNodes(s.graph, nodes.data(), &n));
    for (cudaGraphNode_t node : nodes) {
      cudaGraphNodeType type{};
      HYDRA_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
      kernels += type == cudaGraphNodeTypeKernel ? 1 : 0;
    }
  }
  return kernels;
}

void CudaGraph::launch() const {
  HYDRA_ASSERT(captured(), "a CUDA graph launched before it was captured");
  for (const Segment& s : segments_) {
    HYDRA_CUDA_CHECK(cudaGraphLaunch(s.exec, current_stream()));
    if (s.after) {
      const StepArenaPause pause;  // as outside() runs it in an eager step
      s.after();
    }
  }
}

}  // namespace hydra
