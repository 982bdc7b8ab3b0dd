// runtime/cuda_graph.h in a build without CUDA: nothing can be captured (the commands refuse
// --cuda-graph on the CPU before any work, so reaching capture or launch is a programming error);
// outside() runs its function, as it does outside a capture with CUDA.
#include "runtime/cuda_graph.h"

#include "runtime/error.h"
#include "runtime/step_arena.h"

namespace hydra {

CudaGraph::~CudaGraph() = default;
void CudaGraph::reset() {}
void CudaGraph::capture(const std::function<void()>&) {
  HYDRA_ASSERT(false, "CUDA graph capture in a build without CUDA (HYDRA_CUDA=OFF)");
}
size_t CudaGraph::kernel_nodes() const { return 0; }
void CudaGraph::launch() const { HYDRA_ASSERT(false, "CUDA graph launch in a build without CUDA (HYDRA_CUDA=OFF)"); }
void CudaGraph::outside(const std::function<void()>& fn) {
  const StepArenaPause pause;  // as with CUDA: the step's arena is not fn's memory
  fn();
}
bool CudaGraph::capturing() { return false; }
bool CudaGraph::upload_in_capture(void*, const void*, size_t) { return false; }
size_t CudaGraph::frozen_upload_bytes() const { return 0; }

}  // namespace hydra
