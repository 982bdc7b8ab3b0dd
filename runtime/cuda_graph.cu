#include "runtime/cuda_graph.h"

#include <cuda_runtime.h>

#include "runtime/cuda_memory.h"
#include "runtime/error.h"

namespace hydra {

CudaGraph::~CudaGraph() { reset(); }

void CudaGraph::reset() {
  if (exec_) cudaGraphExecDestroy(exec_);
  if (graph_) cudaGraphDestroy(graph_);
  exec_ = nullptr;
  graph_ = nullptr;
}

void CudaGraph::capture(const std::function<void()>& work) {
  reset();
  cudaStream_t stream = current_stream();
  // Relaxed: the step's ops create events (runtime/concurrency.cpp), which the global mode refuses;
  // the step arena keeps allocation out of the captured region.
  HYDRA_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  try {
    work();
  } catch (...) {
    cudaGraph_t partial = nullptr;
    cudaStreamEndCapture(stream, &partial);  // leave the stream usable; the error is the work's
    if (partial) cudaGraphDestroy(partial);
    cudaGetLastError();
    throw;
  }
  HYDRA_CUDA_CHECK(cudaStreamEndCapture(stream, &graph_));
  HYDRA_CUDA_CHECK(cudaGraphInstantiate(&exec_, graph_, 0));
}

void CudaGraph::launch() const {
  HYDRA_ASSERT(exec_ != nullptr, "a CUDA graph launched before it was captured");
  HYDRA_CUDA_CHECK(cudaGraphLaunch(exec_, current_stream()));
}

}  // namespace hydra
