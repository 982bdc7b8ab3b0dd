// HostReadback (host_readback.h): pinned slots, an asynchronous copy and an event per slot.
#include "runtime/host_readback.h"

#include <cstdlib>
#include <cstring>

#include "runtime/error.h"

#if HYDRA_CUDA
#include <cuda_runtime.h>

#include "runtime/cuda_graph.h"
#include "runtime/cuda_memory.h"
#endif

namespace hydra {

HostReadback::HostReadback(size_t bytes, int slots)
    : bytes_(bytes), host_(static_cast<size_t>(slots), nullptr), events_(static_cast<size_t>(slots), nullptr),
      pending_(static_cast<size_t>(slots), false), pinned_(static_cast<size_t>(slots), false) {
  HYDRA_ASSERT(slots >= 1 && bytes >= 1, "a readback of {} slots of {} bytes", slots, bytes);
  for (size_t i = 0; i < host_.size(); ++i) {
#if HYDRA_CUDA
    int devices = 0;
    if (cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0) {
      HYDRA_CUDA_CHECK(cudaHostAlloc(&host_[i], bytes, cudaHostAllocDefault));
      pinned_[i] = true;
      cudaEvent_t e = nullptr;
      HYDRA_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      events_[i] = e;
      continue;
    }
    cudaGetLastError();  // no device: a CPU run in a CUDA build
#endif
    host_[i] = std::calloc(1, bytes);
    HYDRA_ASSERT(host_[i] != nullptr, "a readback slot of {} bytes", bytes);
  }
}

HostReadback::~HostReadback() {
  for (size_t i = 0; i < host_.size(); ++i) {
#if HYDRA_CUDA
    if (events_[i] != nullptr) {
      // A copy still queued writes into this slot: let it land before the memory goes.
      cudaEventSynchronize(static_cast<cudaEvent_t>(events_[i]));
      cudaEventDestroy(static_cast<cudaEvent_t>(events_[i]));
    }
    if (pinned_[i]) {
      cudaFreeHost(host_[i]);
      continue;
    }
#endif
    std::free(host_[i]);
  }
}

void HostReadback::queue(int slot, const TensorView& src) {
  const auto i = static_cast<size_t>(slot);
  HYDRA_ASSERT(i < host_.size(), "readback slot {} of {}", slot, host_.size());
  HYDRA_ASSERT(!pending_[i], "readback slot {} queued again before it was read", slot);
  HYDRA_ASSERT(src.is_contiguous() && src.nbytes() == bytes_, "a readback of {} bytes given {} ({})", bytes_,
               src.nbytes(), src.shape_string());
  if (src.device() == Device::cuda) {
#if HYDRA_CUDA
    HYDRA_ASSERT(!CudaGraph::capturing(), "a readback queued inside a CUDA graph capture");
    HYDRA_ASSERT(pinned_[i], "a readback of a GPU tensor without a GPU");
    HYDRA_CUDA_CHECK(cudaMemcpyAsync(host_[i], src.data(), bytes_, cudaMemcpyDeviceToHost, current_stream()));
    HYDRA_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(events_[i]), current_stream()));
#else
    HYDRA_ASSERT(false, "a GPU tensor in a build without CUDA");
#endif
  } else {
    std::memcpy(host_[i], src.data(), bytes_);
  }
  pending_[i] = true;
}

const void* HostReadback::wait(int slot) {
  const auto i = static_cast<size_t>(slot);
  HYDRA_ASSERT(i < host_.size(), "readback slot {} of {}", slot, host_.size());
#if HYDRA_CUDA
  if (events_[i] != nullptr) HYDRA_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(events_[i])));
#endif
  pending_[i] = false;
  return host_[i];
}

}  // namespace hydra
