// The CUDA side of the runtime: device selection, the caching allocator, streams and copies.
//
// Allocation goes through one stream-ordered memory pool per device (cudaMallocAsync on the
// device's default pool with its release threshold raised to "never"), so after warm-up no
// allocation reaches the driver: freed blocks are reused by later allocations of the same
// stream order. Peak and current bytes in use are tracked here for the memory planner.
//
// Streams: every op launches on the calling thread's current stream (set with StreamGuard);
// the default is a non-blocking stream created per device at first use. Only this header and
// the .cu files include CUDA headers; everything else sees opaque handles.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "runtime/tensor.h"

typedef struct CUstream_st* cudaStream_t;
typedef struct CUevent_st* cudaEvent_t;

namespace hydra {

// Number of usable CUDA devices; 0 (never an error) when there is no driver or no GPU.
int cuda_device_count();
// Binds this process to `device` and records it in the error context.
void cuda_set_device(int device);

// Streaming multiprocessors of the current device (queried once per device, then cached): what
// grid sizes are capped by, here and in the kernels (kernels/cuda/common.cuh sm_count).
int cuda_sm_count();
// The current device's name as the driver gives it (e.g. "NVIDIA H100 80GB HBM3").
std::string cuda_device_name();

std::shared_ptr<void> cuda_allocate(size_t bytes);
void cuda_memset_zero(void* ptr, size_t bytes);
void cuda_copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);
// Device -> device copy of any strides, converting float32 <-> bfloat16 when the types differ.
void cuda_convert(const TensorView& dst, const TensorView& src);
void cuda_fill(const TensorView& dst, float value);

struct CudaMemoryStats {
  size_t in_use = 0;     // bytes held by live tensors
  size_t peak = 0;       // high-water mark of in_use since the last reset
  size_t free_device = 0;  // cudaMemGetInfo free
  size_t total_device = 0;
};
CudaMemoryStats cuda_memory_stats();
void cuda_reset_peak();
// Returns the pool's unused blocks to the driver (a device synchronisation), so that free_device
// counts them again: for a process that frees one large working set before sizing the next (the
// decode benchmark's cells). Never needed for correctness.
void cuda_release_cached_memory();

// The stream ops on this thread launch on.
cudaStream_t current_stream();
class StreamGuard {
 public:
  explicit StreamGuard(cudaStream_t stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  cudaStream_t previous_;
};

// An owned stream / event (RAII).
class CudaStream {
 public:
  CudaStream();
  ~CudaStream();
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

class CudaEvent {
 public:
  explicit CudaEvent(bool timing = false);
  ~CudaEvent();
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  void record(cudaStream_t stream);
  // Makes `stream` wait for this event (device-side; the host does not block).
  void wait_on(cudaStream_t stream) const;
  void synchronize() const;
  // Whether the work before the event has finished (cudaEventQuery; errors are raised).
  bool ready() const;
  // Milliseconds between `start` and this event (both recorded with timing = true).
  float elapsed_ms_since(const CudaEvent& start) const;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};


}  // namespace hydra
