#include "runtime/tensor.h"

#include "runtime/host_memory.h"
#include "runtime/memory_timeline.h"
#include "runtime/step_arena.h"

#include <cmath>
#include <cstdlib>
#include <cstring>

#if HYDRA_CUDA
#include "runtime/cuda_memory.h"
#endif

namespace hydra {

TensorView::TensorView(void* data, DType dtype, Device device, std::span<const int64_t> shape)
    : data_(data), dtype_(dtype), device_(device), rank_(static_cast<int>(shape.size())) {
  HYDRA_ASSERT(rank_ <= kMaxRank, "rank {} > {}", rank_, kMaxRank);
  int64_t stride = 1;
  for (int d = rank_ - 1; d >= 0; --d) {
    HYDRA_ASSERT(shape[d] >= 0, "negative size {} in dimension {}", shape[d], d);
    shape_[d] = shape[d];
    stride_[d] = stride;
    stride *= shape[d];
  }
}

TensorView::TensorView(void* data, DType dtype, Device device, std::span<const int64_t> shape,
                       std::span<const int64_t> strides)
    : data_(data), dtype_(dtype), device_(device), rank_(static_cast<int>(shape.size())) {
  HYDRA_ASSERT(rank_ <= kMaxRank && strides.size() == shape.size(), "bad rank/strides");
  for (int d = 0; d < rank_; ++d) {
    shape_[d] = shape[d];
    stride_[d] = strides[d];
  }
}

int64_t TensorView::size(int dim) const {
  HYDRA_ASSERT(dim >= 0 && dim < rank_, "dimension {} of a rank-{} view", dim, rank_);
  return shape_[dim];
}

int64_t TensorView::stride(int dim) const {
  HYDRA_ASSERT(dim >= 0 && dim < rank_, "dimension {} of a rank-{} view", dim, rank_);
  return stride_[dim];
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int d = 0; d < rank_; ++d) n *= shape_[d];
  return n;
}

bool TensorView::is_contiguous() const {
  int64_t stride = 1;
  for (int d = rank_ - 1; d >= 0; --d) {
    if (shape_[d] != 1 && stride_[d] != stride) return false;
    stride *= shape_[d];
  }
  return true;
}

TensorView TensorView::narrow(int dim, int64_t begin, int64_t length) const {
  HYDRA_ASSERT(dim >= 0 && dim < rank_ && begin >= 0 && length >= 0 && begin + length <= shape_[dim],
               "narrow({}, {}, {}) of {}", dim, begin, length, shape_string());
  TensorView v = *this;
  v.data_ = static_cast<char*>(data_) + begin * stride_[dim] * static_cast<int64_t>(element_size());
  v.shape_[dim] = length;
  return v;
}

TensorView TensorView::select(int dim, int64_t index) const {
  HYDRA_ASSERT(dim >= 0 && dim < rank_ && index >= 0 && index < shape_[dim], "select({}, {}) of {}",
               dim, index, shape_string());
  TensorView v = narrow(dim, index, 1);
  for (int d = dim; d + 1 < rank_; ++d) {
    v.shape_[d] = v.shape_[d + 1];
    v.stride_[d] = v.stride_[d + 1];
  }
  v.rank_ = rank_ - 1;
  return v;
}

TensorView TensorView::reshape(std::initializer_list<int64_t> shape) const {
  HYDRA_ASSERT(is_contiguous(), "reshape of a non-contiguous view {}", shape_string());
  std::array<int64_t, kMaxRank> dims{};
  int n = 0, infer = -1;
  int64_t known = 1;
  for (int64_t s : shape) {
    HYDRA_ASSERT(n < kMaxRank, "reshape to rank > {}", kMaxRank);
    if (s == -1) {
      HYDRA_ASSERT(infer < 0, "reshape with two -1 entries");
      infer = n;
    } else {
      known *= s;
    }
    dims[n++] = s;
  }
  if (infer >= 0) dims[infer] = known == 0 ? 0 : numel() / known;
  int64_t total = 1;
  for (int d = 0; d < n; ++d) total *= dims[d];
  HYDRA_ASSERT(total == numel(), "reshape of {} elements {} to {} elements", numel(), shape_string(),
               total);
  return TensorView(data_, dtype_, device_, std::span<const int64_t>(dims.data(), n));
}

TensorView TensorView::split_dim(int dim, int64_t outer, int64_t inner) const {
  HYDRA_ASSERT(dim >= 0 && dim < rank_ && rank_ < kMaxRank && outer * inner == shape_[dim],
               "split_dim({}, {}, {}) of {}", dim, outer, inner, shape_string());
  TensorView v = *this;
  for (int d = rank_; d > dim + 1; --d) {
    v.shape_[d] = shape_[d - 1];
    v.stride_[d] = stride_[d - 1];
  }
  v.shape_[dim] = outer;
  v.stride_[dim] = stride_[dim] * inner;
  v.shape_[dim + 1] = inner;
  v.stride_[dim + 1] = stride_[dim];
  v.rank_ = rank_ + 1;
  return v;
}

void* TensorView::element_ptr(std::initializer_list<int64_t> index) const {
  HYDRA_ASSERT(!is_meta(), "an element of a meta tensor {} (a shape-only run has none) was addressed", shape_string());
  HYDRA_ASSERT(static_cast<int>(index.size()) <= rank_, "too many indices for {}", shape_string());
  int64_t offset = 0;
  int d = 0;
  for (int64_t i : index) {
    HYDRA_ASSERT(i >= 0 && i < shape_[d], "index {} out of range in dimension {} of {}", i, d,
                 shape_string());
    offset += i * stride_[d++];
  }
  return static_cast<char*>(data_) + offset * static_cast<int64_t>(element_size());
}

std::string TensorView::shape_string() const {
  std::string s = "[";
  for (int d = 0; d < rank_; ++d) s += (d ? ", " : "") + std::to_string(shape_[d]);
  return s + "]";
}

void expect_shape(const TensorView& view, const char* what,
                  std::initializer_list<std::pair<const char*, int64_t>> dims) {
  bool ok = view.defined() && view.rank() == static_cast<int>(dims.size());
  int d = 0;
  for (const auto& [name, size] : dims) {
    if (!ok) break;
    if (size >= 0 && view.size(d) != size) ok = false;
    ++d;
  }
  if (ok) return;
  std::string expected = "[";
  d = 0;
  for (const auto& [name, size] : dims) {
    expected += fmt::format("{}{}={}", d++ ? ", " : "", name, size < 0 ? std::string("*") : std::to_string(size));
  }
  expected += "]";
  detail::fail_statement("expect_shape", __FILE__, __LINE__,
                         fmt::format("{} has shape {}, expected {}", what,
                                     view.defined() ? view.shape_string() : "(undefined)", expected));
}

void expect_dtype(const TensorView& view, const char* what, DType dtype) {
  HYDRA_ASSERT(view.dtype() == dtype, "{} is {}, expected {}", what, dtype_name(view.dtype()),
               dtype_name(dtype));
}

void expect_same_device(std::initializer_list<TensorView> views) {
  const TensorView* first = nullptr;
  for (const TensorView& v : views) {
    if (!v.defined()) continue;
    if (!first) first = &v;
    HYDRA_ASSERT(v.device() == first->device(), "tensors on {} and {} in one op",
                 device_name(first->device()), device_name(v.device()));
  }
}

int64_t checked_numel(std::span<const int64_t> shape) {
  int64_t n = 1;
  for (int64_t s : shape) {
    if (s < 0 || (s > 0 && n > kMaxElements / s)) return -1;
    n *= s;
  }
  return n;
}

std::string format_shape(std::span<const int64_t> shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::shared_ptr<void> allocate_storage(size_t bytes, Device device, MemoryLabel label) {
  if (MemoryTimeline* plan = ShapeOnlyRun::active()) return plan->meta_storage(bytes, device, label);
  if (StepArena* arena = StepArena::active()) return arena->take(bytes, device);  // a repeated step's block
  if (device == Device::host) {
    const size_t rounded = ((bytes + 63) / 64) * 64;
    void* p = rounded < bytes ? nullptr : std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
    if (!p) {
      const double g = 1024.0 * 1024.0 * 1024.0;
      HYDRA_USER_FAIL("out of host memory: an allocation of {} bytes ({:.2f} GiB) failed on {} ({:.1f} GiB available); "
                      "use more ranks, fewer ranks per node or a shorter input",
                      bytes, static_cast<double>(bytes) / g, describe_location(), host_available_bytes() / g);
    }
    const size_t held = rounded == 0 ? 64 : rounded;
    note_host_allocation(held);
    return std::shared_ptr<void>(p, [held](void* q) {
      std::free(q);
      note_host_free(held);
    });
  }
#if HYDRA_CUDA
  return cuda_allocate(bytes);
#else
  HYDRA_USER_FAIL("a CUDA tensor was requested but this build has no CUDA path (HYDRA_CUDA=OFF)");
#endif
}

Tensor Tensor::empty(std::span<const int64_t> shape, DType dtype, Device device, MemoryLabel label) {
  Tensor t;
  const int64_t n = checked_numel(shape);
  HYDRA_USER_CHECK(n >= 0, "a {} tensor of shape {} is too large to allocate (more than 2^50 elements) or has a "
                   "negative size", dtype_name(dtype), format_shape(shape));
  t.storage_ = allocate_storage(static_cast<size_t>(n) * dtype_size(dtype), device, label);
  t.view_ = TensorView(t.storage_.get(), dtype, device, shape);
  return t;
}

Tensor Tensor::zeros(std::span<const int64_t> shape, DType dtype, Device device, MemoryLabel label) {
  Tensor t = empty(shape, dtype, device, label);
  if (t.is_meta()) return t;
  if (device == Device::host) {
    std::memset(t.data(), 0, t.nbytes());
  } else {
#if HYDRA_CUDA
    cuda_memset_zero(t.data(), t.nbytes());
#endif
  }
  return t;
}

namespace {
// Host element conversions go through double: exact for f32, bf16, f64 and int32 values, so an
// f32 -> f32 or f32 -> bf16 conversion rounds exactly as a direct one. f64 -> bf16 rounds twice
// (to f32, then to bf16), which matters only for values within 2^-24 of a bf16 tie.
double load_as_double(const void* p, DType t) {
  switch (t) {
    case DType::f32: return *static_cast<const float*>(p);
    case DType::bf16: return bf16_to_float(*static_cast<const bf16*>(p));
    case DType::i32: return static_cast<double>(*static_cast<const int32_t*>(p));
    case DType::i64: return static_cast<double>(*static_cast<const int64_t*>(p));
    case DType::f64: return *static_cast<const double*>(p);
  }
  return 0;
}

void store_from_double(void* p, DType t, double v) {
  switch (t) {
    case DType::f32: *static_cast<float*>(p) = static_cast<float>(v); break;
    case DType::bf16: *static_cast<bf16*>(p) = float_to_bf16(static_cast<float>(v)); break;
    case DType::i32: *static_cast<int32_t*>(p) = static_cast<int32_t>(v); break;
    case DType::i64: *static_cast<int64_t*>(p) = static_cast<int64_t>(v); break;
    case DType::f64: *static_cast<double*>(p) = v; break;
  }
}

bool is_integer(DType t) { return t == DType::i32 || t == DType::i64; }

// Host copy of arbitrary strided views, converting element type when they differ.
void host_copy(const TensorView& dst, const TensorView& src) {
  const int rank = dst.rank();
  std::array<int64_t, kMaxRank> idx{};
  const int64_t n = dst.numel();
  if (dst.is_contiguous() && src.is_contiguous() && dst.dtype() == src.dtype()) {
    std::memcpy(dst.data(), src.data(), dst.nbytes());
    return;
  }
  HYDRA_ASSERT(is_integer(dst.dtype()) == is_integer(src.dtype()), "copy between {} and {}",
               dtype_name(src.dtype()), dtype_name(dst.dtype()));
  const size_t es_d = dst.element_size(), es_s = src.element_size();
  for (int64_t i = 0; i < n; ++i) {
    int64_t od = 0, os = 0;
    for (int d = 0; d < rank; ++d) {
      od += idx[d] * dst.stride(d);
      os += idx[d] * src.stride(d);
    }
    char* pd = static_cast<char*>(dst.data()) + od * static_cast<int64_t>(es_d);
    const char* ps = static_cast<const char*>(src.data()) + os * static_cast<int64_t>(es_s);
    if (dst.dtype() == src.dtype()) {
      std::memcpy(pd, ps, es_d);
    } else if (dst.dtype() == DType::i64 && src.dtype() == DType::i32) {
      *reinterpret_cast<int64_t*>(pd) = *reinterpret_cast<const int32_t*>(ps);
    } else if (dst.dtype() == DType::i32 && src.dtype() == DType::i64) {
      *reinterpret_cast<int32_t*>(pd) = static_cast<int32_t>(*reinterpret_cast<const int64_t*>(ps));
    } else {
      store_from_double(pd, dst.dtype(), load_as_double(ps, src.dtype()));
    }
    for (int d = rank - 1; d >= 0; --d) {
      if (++idx[d] < dst.size(d)) break;
      idx[d] = 0;
    }
  }
}
}  // namespace

void copy_into(const TensorView& dst, const TensorView& src) {
  HYDRA_ASSERT(dst.rank() == src.rank(), "copy {} -> {}", src.shape_string(), dst.shape_string());
  for (int d = 0; d < dst.rank(); ++d) {
    HYDRA_ASSERT(dst.size(d) == src.size(d), "copy {} -> {}", src.shape_string(), dst.shape_string());
  }
  if (dst.numel() == 0 || dst.is_meta() || src.is_meta()) return;
  if (dst.on_host() && src.on_host()) {
    host_copy(dst, src);
    return;
  }
#if HYDRA_CUDA
  if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous()) {
    cuda_copy_bytes(dst.data(), dst.device(), src.data(), src.device(), dst.nbytes());
    return;
  }
  if (dst.on_host()) {  // device -> host, strided or converting: bring it over contiguous, then convert
    Tensor staged = Tensor::empty(src.shape(), src.dtype(), Device::cuda);
    cuda_convert(staged, src);
    Tensor host = Tensor::empty(src.shape(), src.dtype(), Device::host);
    cuda_copy_bytes(host.data(), Device::host, staged.data(), Device::cuda, host.nbytes());
    host_copy(dst, host);
    return;
  }
  if (src.on_host()) {  // host -> device: convert on the host into a contiguous buffer, then send
    Tensor staged = Tensor::empty(dst.shape(), dst.dtype(), Device::host);
    host_copy(staged, src);
    if (dst.is_contiguous()) {
      cuda_copy_bytes(dst.data(), Device::cuda, staged.data(), Device::host, dst.nbytes());
    } else {
      copy_into(dst, to_device(staged, Device::cuda));
    }
    return;
  }
  cuda_convert(dst, src);  // device -> device, strided and/or converting
#else
  HYDRA_USER_FAIL("a CUDA tensor was used but this build has no CUDA path (HYDRA_CUDA=OFF)");
#endif
}

Tensor to(const TensorView& src, Device device, DType dtype, MemoryLabel label) {
  Tensor t = Tensor::empty(src.shape(), dtype, device, label);
  copy_into(t, src);
  return t;
}

double rms_ratio(const TensorView& got, const TensorView& ref) {
  HYDRA_ASSERT(got.numel() == ref.numel(), "rms_ratio of {} against {}", got.shape_string(), ref.shape_string());
  const Tensor a = to(got, Device::host, DType::f32), b = to(ref, Device::host, DType::f32);
  double num = 0, den = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = a.data_as<float>()[i], y = b.data_as<float>()[i];
    if (!std::isfinite(x)) return INFINITY;
    num += (x - y) * (x - y);
    den += y * y;
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

void fill(const TensorView& dst, double value) {
  if (dst.is_meta()) return;
  if (dst.on_host()) {
    const int rank = dst.rank();
    std::array<int64_t, kMaxRank> idx{};
    char* base = static_cast<char*>(dst.data());
    for (int64_t i = 0; i < dst.numel(); ++i) {
      int64_t offset = 0;
      for (int d = 0; d < rank; ++d) offset += idx[d] * dst.stride(d);
      store_from_double(base + offset * static_cast<int64_t>(dst.element_size()), dst.dtype(), value);
      for (int d = rank - 1; d >= 0; --d) {
        if (++idx[d] < dst.size(d)) break;
        idx[d] = 0;
      }
    }
    return;
  }
#if HYDRA_CUDA
  HYDRA_ASSERT(dst.is_contiguous(), "device fill of a strided view {}", dst.shape_string());
  cuda_fill(dst, static_cast<float>(value));
#endif
}

}  // namespace hydra
