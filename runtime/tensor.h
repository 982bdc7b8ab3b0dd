// Tensors: a non-owning strided view (TensorView) and an owning handle (Tensor).
//
// Conventions:
//  - Row-major, element strides (not bytes), rank <= 4. Shapes are written in comments as
//    `// [T, H, d]`; checks name the dimensions they expect (expect_shape).
//  - A view never owns memory; a Tensor owns its storage through a shared_ptr so views taken from
//    it stay valid while any copy of the Tensor lives.
//  - Ops take views and dispatch on view.device(); the CPU path is fp32 (or fp64 for gradient
//    checks), the CUDA path stores bf16 (DESIGN.md §2). Host<->device copies and dtype conversion live here (copy_into, to_device, cast).
//  - Every allocation may carry a MemoryLabel (runtime/memory_label.h): the buffer's name and part,
//    which a shape-only run (runtime/memory_timeline.h) records for the memory plans. There every
//    tensor is a meta tensor (is_meta): a shape and element type over an address range no process
//    maps, so any view derived from one is meta too, and copies and fills of it do nothing.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "runtime/dtype.h"
#include "runtime/error.h"
#include "runtime/memory_label.h"

namespace hydra {

constexpr int kMaxRank = 4;

// The storage address of a meta tensor (a shape-only run's): 2^62, far above any address a process
// maps, and the views of it (offsets below 2^53 bytes) stay above it.
inline constexpr uintptr_t kMetaAddress = uintptr_t{1} << 62;

class TensorView {
 public:
  TensorView() = default;
  // Contiguous row-major view.
  TensorView(void* data, DType dtype, Device device, std::span<const int64_t> shape);
  TensorView(void* data, DType dtype, Device device, std::initializer_list<int64_t> shape)
      : TensorView(data, dtype, device, std::span<const int64_t>(shape.begin(), shape.size())) {}
  // Arbitrary element strides.
  TensorView(void* data, DType dtype, Device device, std::span<const int64_t> shape,
             std::span<const int64_t> strides);

  void* data() const { return data_; }
  template <class T>
  T* data_as() const {
    HYDRA_ASSERT(dtype_of<std::remove_const_t<T>>() == dtype_, "view holds {}, accessed as {}",
                 dtype_name(dtype_), dtype_name(dtype_of<std::remove_const_t<T>>()));
    HYDRA_ASSERT(!is_meta(), "the elements of a meta tensor {} (a shape-only run has none) were read", shape_string());
    return static_cast<T*>(data_);
  }
  // A shape-only run's view (runtime/memory_timeline.h): shape and type, no elements.
  bool is_meta() const { return reinterpret_cast<uintptr_t>(data_) >= kMetaAddress; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  bool on_host() const { return device_ == Device::host; }
  int rank() const { return rank_; }
  int64_t size(int dim) const;
  int64_t stride(int dim) const;
  std::span<const int64_t> shape() const { return {shape_.data(), static_cast<size_t>(rank_)}; }
  std::span<const int64_t> strides() const { return {stride_.data(), static_cast<size_t>(rank_)}; }
  int64_t numel() const;
  size_t element_size() const { return dtype_size(dtype_); }
  bool defined() const { return data_ != nullptr; }
  bool is_contiguous() const;
  // Bytes spanned by a contiguous view.
  size_t nbytes() const { return static_cast<size_t>(numel()) * element_size(); }

  // Sub-range [begin, begin+length) of one dimension.
  TensorView narrow(int dim, int64_t begin, int64_t length) const;
  // Drops one dimension at `index`.
  TensorView select(int dim, int64_t index) const;
  // New shape over the same elements; the view must be contiguous. One entry may be -1.
  TensorView reshape(std::initializer_list<int64_t> shape) const;
  // Splits dimension `dim` into (outer, inner) with outer*inner == size(dim).
  TensorView split_dim(int dim, int64_t outer, int64_t inner) const;
  // Address of element (i0, i1, ...) with fewer indices meaning the leading ones.
  void* element_ptr(std::initializer_list<int64_t> index) const;

  std::string shape_string() const;  // "[12, 64]"

 private:
  void* data_ = nullptr;
  DType dtype_ = DType::f32;
  Device device_ = Device::host;
  int rank_ = 0;
  std::array<int64_t, kMaxRank> shape_{};
  std::array<int64_t, kMaxRank> stride_{};
};

// Checks rank and sizes; `dims` pairs a dimension name with its expected size (-1: any).
// Failure is an internal error naming the tensor and every dimension.
void expect_shape(const TensorView& view, const char* what,
                  std::initializer_list<std::pair<const char*, int64_t>> dims);
void expect_dtype(const TensorView& view, const char* what, DType dtype);
void expect_same_device(std::initializer_list<TensorView> views);

// Raw storage on a device; CUDA storage comes from the caching allocator (runtime/cuda_memory).
// A host allocation that fails is a UserError giving the size asked for and the memory available.
// In a shape-only run, meta storage held on the run's timeline under `label`.
std::shared_ptr<void> allocate_storage(size_t bytes, Device device, MemoryLabel label = {});

// Shapes that come from files: the element count of `shape`, or −1 when a size is negative or the
// count exceeds kMaxElements (never overflows), and the shape as text without any check.
inline constexpr int64_t kMaxElements = int64_t{1} << 50;
int64_t checked_numel(std::span<const int64_t> shape);
std::string format_shape(std::span<const int64_t> shape);  // "[2, -48]"

class Tensor {
 public:
  Tensor() = default;
  static Tensor empty(std::span<const int64_t> shape, DType dtype, Device device = Device::host, MemoryLabel label = {});
  static Tensor empty(std::initializer_list<int64_t> shape, DType dtype, Device device = Device::host,
                      MemoryLabel label = {}) {
    return empty(std::span<const int64_t>(shape.begin(), shape.size()), dtype, device, label);
  }
  static Tensor zeros(std::span<const int64_t> shape, DType dtype, Device device = Device::host, MemoryLabel label = {});
  static Tensor zeros(std::initializer_list<int64_t> shape, DType dtype, Device device = Device::host,
                      MemoryLabel label = {}) {
    return zeros(std::span<const int64_t>(shape.begin(), shape.size()), dtype, device, label);
  }

  const TensorView& view() const { return view_; }
  operator const TensorView&() const { return view_; }  // NOLINT: views are the op interface

  void* data() const { return view_.data(); }
  template <class T>
  T* data_as() const { return view_.data_as<T>(); }
  DType dtype() const { return view_.dtype(); }
  Device device() const { return view_.device(); }
  int rank() const { return view_.rank(); }
  int64_t size(int dim) const { return view_.size(dim); }
  std::span<const int64_t> shape() const { return view_.shape(); }
  int64_t numel() const { return view_.numel(); }
  size_t nbytes() const { return view_.nbytes(); }
  bool defined() const { return view_.defined(); }
  bool is_meta() const { return view_.is_meta(); }
  std::string shape_string() const { return view_.shape_string(); }

 private:
  std::shared_ptr<void> storage_;
  TensorView view_;
};

// Copies src into dst (same shape). Handles host<->cuda transfers and, on the host, conversion
// between f32, bf16 and f64 (and between i32 and i64). Strided views are copied element by element on the host; device copies need
// contiguous views. Nothing to copy where either is meta.
void copy_into(const TensorView& dst, const TensorView& src);
// A contiguous copy on `device` with element type `dtype`.
Tensor to(const TensorView& src, Device device, DType dtype, MemoryLabel label = {});
inline Tensor to_device(const TensorView& src, Device device, MemoryLabel label = {}) {
  return to(src, device, src.dtype(), label);
}
inline Tensor clone(const TensorView& src, MemoryLabel label = {}) { return to(src, src.device(), src.dtype(), label); }
// ‖got − ref‖ / ‖ref‖ over all entries of two equally shaped float tensors (any device, any float
// type; ‖got − ref‖ alone when ref is zero); +inf when got has a non-finite entry. How the GPU
// tests and the benchmarks' correctness checks compare a kernel with its reference.
double rms_ratio(const TensorView& got, const TensorView& ref);
// Fills a float view with a constant (host: f32/bf16/f64, any strides; device: f32/bf16, contiguous);
// nothing for a meta view.
void fill(const TensorView& dst, double value);

}  // namespace hydra
