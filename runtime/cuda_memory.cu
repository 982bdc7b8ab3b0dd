#include "runtime/cuda_memory.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <deque>
#include <mutex>
#include <vector>
#include <unistd.h>

#include "runtime/cuda_graph.h"

namespace hydra {
namespace {

std::atomic<size_t> g_in_use{0};
std::atomic<size_t> g_peak{0};
thread_local cudaStream_t t_current_stream = nullptr;
thread_local bool t_stream_set = false;

cudaStream_t default_stream_for_device() {
  // One non-blocking stream per process (a process drives one device; see cuda_set_device).
  static cudaStream_t stream = [] {
    cudaStream_t s;
    HYDRA_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return s;
  }();
  return stream;
}

void configure_pool(int device) {
  cudaMemPool_t pool;
  HYDRA_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
  uint64_t threshold = UINT64_MAX;  // keep freed memory in the pool: no driver calls after warm-up
  HYDRA_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
}

__global__ void fill_f32(float* p, int64_t n, float v) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) p[i] = v;
}
__global__ void fill_bf16(__nv_bfloat16* p, int64_t n, float v) {
  const __nv_bfloat16 b = __float2bfloat16_rn(v);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) p[i] = b;
}

int grid_for(int64_t n) { return static_cast<int>(std::min<int64_t>((n + 255) / 256, int64_t{16} * cuda_sm_count())); }

}  // namespace

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return count;
}

void cuda_set_device(int device) {
  HYDRA_CUDA_CHECK(cudaSetDevice(device));
  configure_pool(device);
  ErrorContext context = error_context();
  context.device = device;
  set_error_context(context);
}

int cuda_sm_count() {
  static std::array<std::atomic<int>, 64> cache{};  // 0: not queried yet
  int device = 0;
  HYDRA_CUDA_CHECK(cudaGetDevice(&device));
  std::atomic<int>& slot = cache[static_cast<size_t>(device) % cache.size()];
  int n = slot.load(std::memory_order_relaxed);
  if (n == 0) {
    HYDRA_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
    slot.store(n, std::memory_order_relaxed);
  }
  return n;
}

std::string cuda_device_name() {
  int device = 0;
  HYDRA_CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  HYDRA_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return prop.name;
}

std::shared_ptr<void> cuda_allocate(size_t bytes) {
  void* p = nullptr;
  const size_t rounded = ((bytes + 255) / 256) * 256;
  cudaStream_t stream = current_stream();
  const cudaError_t status = cudaMallocAsync(&p, rounded == 0 ? 256 : rounded, stream);
  if (status != cudaSuccess) {
    cudaGetLastError();
    size_t free_bytes = 0, total_bytes = 0;
    cudaMemGetInfo(&free_bytes, &total_bytes);
    // A user error: the run asks for more than the GPU holds (the memory plans refuse most such runs
    // before they start; this is the backstop, with the size asked for).
    throw UserError(fmt::format("out of GPU memory: an allocation of {:.2f} GiB failed ({}); {:.2f} GiB in use by "
                            "this process, {:.2f} GiB free on the device [{}]; use more GPUs or a shorter input",
                            bytes / 1073741824.0, cudaGetErrorString(status),
                            g_in_use.load() / 1073741824.0, free_bytes / 1073741824.0,
                            describe_location()));
  }
  const size_t now = g_in_use.fetch_add(rounded) + rounded;
  size_t peak = g_peak.load();
  while (now > peak && !g_peak.compare_exchange_weak(peak, now)) {
  }
  // The block is returned to the pool in the order of the stream that frees it: every use of a
  // tensor is on the current stream or joined back to it with an event before the tensor dies.
  return std::shared_ptr<void>(p, [rounded](void* q) {
    cudaFreeAsync(q, current_stream());
    g_in_use.fetch_sub(rounded);
  });
}

void cuda_memset_zero(void* ptr, size_t bytes) {
  HYDRA_CUDA_CHECK(cudaMemsetAsync(ptr, 0, bytes, current_stream()));
}

namespace {

// Host -> device uploads through a pinned staging ring. The bytes are copied into pinned memory on
// the host and the DMA is queued on the current stream; the call returns without waiting for the
// GPU. (Before, every upload from pageable memory was followed by a stream synchronisation: ~25 a
// training step of the small model — ids, targets, positions, document bounds per layer — each
// draining the GPU's queue while the host still had the rest of the step to issue.) Regions are
// taken in address order; within one pass over the ring a new region lies above every region still
// being read, so nothing is waited for. Before a pass starts again at the bottom, every copy of the
// last pass must have completed (its event). The queue of events is kept short by retiring its
// oldest entry (long complete) beyond kMaxPending, so many tiny uploads (a decode loop's) cost O(1)
// each. Uploads above a quarter of the ring take the old path.
class UploadRing {
 public:
  static constexpr size_t kBytes = size_t{32} << 20;
  static constexpr size_t kMaxPending = 1024;

  bool upload(void* dst, const void* src, size_t bytes) {
    if (bytes > kBytes / 4) return false;
    const std::lock_guard<std::mutex> lock(mutex_);
    if (base_ == nullptr) HYDRA_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&base_), kBytes, cudaHostAllocDefault));
    size_t begin = (head_ + 255) / 256 * 256;
    if (begin + bytes > kBytes) {  // a new pass from the bottom: the last pass's copies must be done
      while (!pending_.empty()) retire_oldest();
      begin = 0;
    }
    while (pending_.size() >= kMaxPending) retire_oldest();
    std::memcpy(base_ + begin, src, bytes);
    cudaStream_t stream = current_stream();
    HYDRA_CUDA_CHECK(cudaMemcpyAsync(dst, base_ + begin, bytes, cudaMemcpyHostToDevice, stream));
    cudaEvent_t done = nullptr;
    if (free_events_.empty()) {
      HYDRA_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    } else {
      done = free_events_.back();
      free_events_.pop_back();
    }
    HYDRA_CUDA_CHECK(cudaEventRecord(done, stream));
    pending_.push_back(done);
    head_ = begin + bytes;
    return true;
  }

 private:
  void retire_oldest() {
    HYDRA_CUDA_CHECK(cudaEventSynchronize(pending_.front()));
    free_events_.push_back(pending_.front());
    pending_.pop_front();
  }
  std::mutex mutex_;
  char* base_ = nullptr;  // pinned, kBytes; kept for the life of the process
  size_t head_ = 0;
  std::deque<cudaEvent_t> pending_;  // events behind the copies not yet retired, oldest first
  std::vector<cudaEvent_t> free_events_;
};

UploadRing& upload_ring() {
  static UploadRing* ring = new UploadRing();  // never destroyed: no CUDA calls at exit
  return *ring;
}

}  // namespace

void cuda_copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (src_device == Device::host && dst_device == Device::cuda) {
    // Inside a CUDA graph capture: recorded from a pinned copy the graph keeps (runtime/cuda_graph.h).
    if (CudaGraph::upload_in_capture(dst, src, bytes)) return;
    if (upload_ring().upload(dst, src, bytes)) return;
  }
  HYDRA_ASSERT(dst_device != Device::host || !CudaGraph::capturing(),
               "a device-to-host copy of {} bytes inside a CUDA graph capture (a captured step reads nothing back: "
               "its results stay in device buffers read after the launch)", bytes);
  HYDRA_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, current_stream()));
  if (dst_device == Device::host || src_device == Device::host) {
    // Pageable host memory: the host side must see the data (or may reuse its buffer) on return.
    HYDRA_CUDA_CHECK(cudaStreamSynchronize(current_stream()));
  }
}

namespace {
struct StridedDesc {
  int64_t size[kMaxRank];
  int64_t dst_stride[kMaxRank];
  int64_t src_stride[kMaxRank];
  int rank;
};

__device__ __forceinline__ float load_f(const void* p, int64_t i, int t) {
  return t == 0 ? static_cast<const float*>(p)[i] : __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
}

// Element-wise strided copy with optional float32 <-> bfloat16 conversion (t: 0 f32, 1 bf16,
// 2 raw 4-byte, 3 raw 8-byte).
__global__ void strided_copy(void* dst, int dst_type, const void* src, int src_type, StridedDesc d, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t rest = i, od = 0, os = 0;
    for (int k = d.rank - 1; k >= 0; --k) {
      const int64_t idx = rest % d.size[k];
      rest /= d.size[k];
      od += idx * d.dst_stride[k];
      os += idx * d.src_stride[k];
    }
    if (dst_type == 2) {
      static_cast<uint32_t*>(dst)[od] = static_cast<const uint32_t*>(src)[os];
    } else if (dst_type == 3) {
      static_cast<uint64_t*>(dst)[od] = static_cast<const uint64_t*>(src)[os];
    } else if (dst_type == 0) {
      static_cast<float*>(dst)[od] = load_f(src, os, src_type);
    } else {
      static_cast<__nv_bfloat16*>(dst)[od] = __float2bfloat16_rn(load_f(src, os, src_type));
    }
  }
}

int type_code(DType t, bool raw) {
  if (t == DType::bf16) return 1;
  if (t == DType::f32) return raw ? 2 : 0;
  if (t == DType::i32) return 2;
  return 3;
}

// The copy as rows: dst and src with their adjacent dimensions merged wherever both are laid out
// contiguously across them (a [T, H, d] head view of a [T, N] matrix becomes [T, H·d] rows).
struct Rows {
  int64_t rows = 1, cols = 1, dst_stride = 0, src_stride = 0;
};
bool as_rows(const TensorView& dst, const TensorView& src, Rows& out) {
  int64_t size[kMaxRank], ds[kMaxRank], ss[kMaxRank];
  int rank = 0;
  for (int k = 0; k < dst.rank(); ++k) {
    if (dst.size(k) == 1) continue;  // a unit dimension's stride is irrelevant
    if (rank > 0 && ds[rank - 1] == dst.size(k) * dst.stride(k) && ss[rank - 1] == src.size(k) * src.stride(k)) {
      size[rank - 1] *= dst.size(k);
      ds[rank - 1] = dst.stride(k);
      ss[rank - 1] = src.stride(k);
      continue;
    }
    size[rank] = dst.size(k);
    ds[rank] = dst.stride(k);
    ss[rank] = src.stride(k);
    ++rank;
  }
  if (rank == 0) {  // a single element
    out = Rows{};
    return true;
  }
  if (rank > 2 || ds[rank - 1] != 1 || ss[rank - 1] != 1) return false;
  out.cols = size[rank - 1];
  out.rows = rank == 2 ? size[0] : 1;
  out.dst_stride = rank == 2 ? ds[0] : out.cols;
  out.src_stride = rank == 2 ? ss[0] : out.cols;
  return true;
}

// Rows with an fp32 <-> bf16 conversion, four elements per thread, 16/8-byte accesses when every
// row start is aligned for them. A row takes `lanes` threads (a power of two, the fewest whose four
// elements each cover it, at most the block's 256), so a block step covers 256 / lanes rows of one
// tile of 4·lanes columns: rows of 256 fill the block with 4 rows a step (one row a step left 192 of
// the 256 threads idle: qwen3-synth's [16384, 256] conversions ran at ~2.1 TB/s). The row and tile
// come from one division per block step, not per element.
constexpr int kConvertThreads = 256;
struct Four {
  float v[4];
};
template <class T>
__device__ __forceinline__ Four load4(const T* p, bool vector);
template <>
__device__ __forceinline__ Four load4<float>(const float* p, bool vector) {
  if (vector) {
    const float4 f = *reinterpret_cast<const float4*>(p);
    return {{f.x, f.y, f.z, f.w}};
  }
  return {{p[0], p[1], p[2], p[3]}};
}
template <>
__device__ __forceinline__ Four load4<__nv_bfloat16>(const __nv_bfloat16* p, bool vector) {
  if (vector) {
    const uint2 u = *reinterpret_cast<const uint2*>(p);
    const __nv_bfloat162 a = *reinterpret_cast<const __nv_bfloat162*>(&u.x), b = *reinterpret_cast<const __nv_bfloat162*>(&u.y);
    return {{__low2float(a), __high2float(a), __low2float(b), __high2float(b)}};
  }
  return {{__bfloat162float(p[0]), __bfloat162float(p[1]), __bfloat162float(p[2]), __bfloat162float(p[3])}};
}
__device__ __forceinline__ void store4(float* p, const Four& f, bool vector) {
  if (vector) {
    *reinterpret_cast<float4*>(p) = make_float4(f.v[0], f.v[1], f.v[2], f.v[3]);
  } else {
    for (int i = 0; i < 4; ++i) p[i] = f.v[i];
  }
}
__device__ __forceinline__ void store4(__nv_bfloat16* p, const Four& f, bool vector) {
  if (vector) {
    const __nv_bfloat162 a = __floats2bfloat162_rn(f.v[0], f.v[1]), b = __floats2bfloat162_rn(f.v[2], f.v[3]);
    uint2 u;
    u.x = *reinterpret_cast<const uint32_t*>(&a);
    u.y = *reinterpret_cast<const uint32_t*>(&b);
    *reinterpret_cast<uint2*>(p) = u;
  } else {
    for (int i = 0; i < 4; ++i) p[i] = __float2bfloat16_rn(f.v[i]);
  }
}
__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ void put(float* p, float v) { *p = v; }
__device__ __forceinline__ void put(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

template <class D, class S>
__global__ void __launch_bounds__(kConvertThreads) convert_rows(D* dst, const S* src, Rows r, int lanes, bool vector) {
  const int64_t tile_cols = 4 * int64_t(lanes), tiles = (r.cols + tile_cols - 1) / tile_cols;
  const int64_t rows_per_step = kConvertThreads / lanes, row_groups = (r.rows + rows_per_step - 1) / rows_per_step;
  for (int64_t b = blockIdx.x; b < row_groups * tiles; b += gridDim.x) {
    const int64_t row = (b / tiles) * rows_per_step + threadIdx.x / lanes;
    const int64_t col = (b % tiles) * tile_cols + 4 * int64_t(threadIdx.x % lanes);
    if (row >= r.rows) continue;
    D* d = dst + row * r.dst_stride;
    const S* s = src + row * r.src_stride;
    if (col + 4 <= r.cols) {
      store4(d + col, load4(s + col, vector), vector);
    } else {
      for (int64_t c = col; c < r.cols; ++c) put(d + c, to_f(s[c]));
    }
  }
}

template <class D, class S>
void launch_convert_rows(void* dst, const void* src, const Rows& r) {
  const auto aligned = [](const void* p, int64_t stride, size_t bytes) {
    return reinterpret_cast<uintptr_t>(p) % (4 * bytes) == 0 && stride % 4 == 0;
  };
  const bool vector = aligned(dst, r.dst_stride, sizeof(D)) && aligned(src, r.src_stride, sizeof(S));
  int lanes = 1;
  while (lanes < kConvertThreads && 4 * int64_t(lanes) < r.cols) lanes *= 2;
  const int64_t rows_per_step = kConvertThreads / lanes, tile_cols = 4 * int64_t(lanes);
  const int64_t blocks = (r.rows + rows_per_step - 1) / rows_per_step * ((r.cols + tile_cols - 1) / tile_cols);
  convert_rows<D, S><<<static_cast<int>(std::min<int64_t>(blocks, int64_t{32} * cuda_sm_count())), kConvertThreads, 0, current_stream()>>>(
      static_cast<D*>(dst), static_cast<const S*>(src), r, lanes, vector);
}
}  // namespace

void cuda_convert(const TensorView& dst, const TensorView& src) {
  const bool same = dst.dtype() == src.dtype();
  HYDRA_ASSERT(same || ((dst.dtype() == DType::f32 || dst.dtype() == DType::bf16) &&
                        (src.dtype() == DType::f32 || src.dtype() == DType::bf16)),
               "device copy {} -> {}", dtype_name(src.dtype()), dtype_name(dst.dtype()));
  const int64_t n = dst.numel();
  if (n == 0) return;
  Rows rows;
  if (as_rows(dst, src, rows) && rows.dst_stride >= rows.cols && rows.src_stride >= rows.cols) {
    if (same) {  // a pitched copy (cudaMemcpy2DAsync): no per-element index arithmetic
      const size_t e = dst.element_size();
      HYDRA_CUDA_CHECK(cudaMemcpy2DAsync(dst.data(), rows.dst_stride * e, src.data(), rows.src_stride * e,
                                         rows.cols * e, rows.rows, cudaMemcpyDeviceToDevice, current_stream()));
      return;
    }
    if (dst.dtype() == DType::bf16) {
      launch_convert_rows<__nv_bfloat16, float>(dst.data(), src.data(), rows);
    } else {
      launch_convert_rows<float, __nv_bfloat16>(dst.data(), src.data(), rows);
    }
    HYDRA_CUDA_CHECK(cudaGetLastError());
    return;
  }
  StridedDesc d{};
  d.rank = dst.rank();
  for (int k = 0; k < d.rank; ++k) {
    d.size[k] = dst.size(k);
    d.dst_stride[k] = dst.stride(k);
    d.src_stride[k] = src.stride(k);
  }
  // bf16 -> bf16 copies go through the converting path (exact), others move raw words.
  const int dt = same && dst.dtype() != DType::bf16 ? type_code(dst.dtype(), true) : type_code(dst.dtype(), false);
  const int st = type_code(src.dtype(), false);
  strided_copy<<<grid_for(n), 256, 0, current_stream()>>>(dst.data(), dt, src.data(), st, d, n);
  HYDRA_CUDA_CHECK(cudaGetLastError());
}

void cuda_fill(const TensorView& dst, float value) {
  const int64_t n = dst.numel();
  if (dst.dtype() == DType::f32) {
    fill_f32<<<grid_for(n), 256, 0, current_stream()>>>(static_cast<float*>(dst.data()), n, value);
  } else if (dst.dtype() == DType::bf16) {
    fill_bf16<<<grid_for(n), 256, 0, current_stream()>>>(static_cast<__nv_bfloat16*>(dst.data()), n, value);
  } else {
    HYDRA_ASSERT(false, "device fill of {}", dtype_name(dst.dtype()));
  }
  HYDRA_CUDA_CHECK(cudaGetLastError());
}

CudaMemoryStats cuda_memory_stats() {
  CudaMemoryStats s;
  s.in_use = g_in_use.load();
  s.peak = g_peak.load();
  HYDRA_CUDA_CHECK(cudaMemGetInfo(&s.free_device, &s.total_device));
  return s;
}

void cuda_reset_peak() { g_peak.store(g_in_use.load()); }

void cuda_release_cached_memory() {
  int device = 0;
  HYDRA_CUDA_CHECK(cudaGetDevice(&device));
  HYDRA_CUDA_CHECK(cudaDeviceSynchronize());  // frees still pending in stream order land in the pool first
  cudaMemPool_t pool;
  HYDRA_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
  HYDRA_CUDA_CHECK(cudaMemPoolTrimTo(pool, 0));
}

cudaStream_t current_stream() { return t_stream_set ? t_current_stream : default_stream_for_device(); }

StreamGuard::StreamGuard(cudaStream_t stream) : previous_(current_stream()) {
  t_current_stream = stream;
  t_stream_set = true;
}
StreamGuard::~StreamGuard() { t_current_stream = previous_; }

CudaStream::CudaStream() { HYDRA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
CudaStream::~CudaStream() {
  if (stream_) cudaStreamDestroy(stream_);
}

CudaEvent::CudaEvent(bool timing) {
  HYDRA_CUDA_CHECK(cudaEventCreateWithFlags(&event_, timing ? cudaEventDefault : cudaEventDisableTiming));
}
CudaEvent::~CudaEvent() {
  if (event_) cudaEventDestroy(event_);
}
void CudaEvent::record(cudaStream_t stream) { HYDRA_CUDA_CHECK(cudaEventRecord(event_, stream)); }
void CudaEvent::wait_on(cudaStream_t stream) const { HYDRA_CUDA_CHECK(cudaStreamWaitEvent(stream, event_, 0)); }
void CudaEvent::synchronize() const { HYDRA_CUDA_CHECK(cudaEventSynchronize(event_)); }
bool CudaEvent::ready() const {
  const cudaError_t e = cudaEventQuery(event_);
  if (e == cudaErrorNotReady) return false;
  HYDRA_CUDA_CHECK(e);
  return true;
}
float CudaEvent::elapsed_ms_since(const CudaEvent& start) const {
  float ms = 0;
  HYDRA_CUDA_CHECK(cudaEventElapsedTime(&ms, start.event_, event_));
  return ms;
}


}  // namespace hydra
