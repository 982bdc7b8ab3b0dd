// A small RAII layer over the HDF5 C API: files, datasets as tensors, scalar attributes.
//
// Conventions (DESIGN.md §4): one dataset per tensor at the file root, named by its parameter path
// ("model.layers.0.self_attn.q_proj.weight"). float32, int32 and int64 are native HDF5 types. HDF5
// has no bfloat16, so bf16 tensors are stored as uint16 datasets carrying the attribute
// dtype = "bfloat16" (h5py reads them as uint16; `view` them as bfloat16 after a left shift).
// Errors name the file and the dataset; the HDF5 library's own error printing is switched off.
// A file's header is checked against what the file holds before a dataset is read (check_storage):
// every chunk of a chunked dataset written (HDF5 reads an unwritten chunk as zeros), compact and
// contiguous storage of exactly the declared size inside the file, filters this HDF5 decodes, and
// values in this file — external raw storage, virtual datasets and links to other files are refused.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "runtime/tensor.h"

namespace hydra {

struct DatasetInfo {
  std::vector<int64_t> shape;
  DType dtype = DType::f32;
};

class H5File {
 public:
  // Opens an existing file for reading. UserError if missing, unreadable or not HDF5.
  static H5File open_read(const std::string& path);
  // Creates (truncates) `path` for writing. Callers write through AtomicFile's temp path.
  static H5File create(const std::string& path);

  H5File(H5File&& other) noexcept;
  H5File& operator=(H5File&& other) noexcept;
  H5File(const H5File&) = delete;
  H5File& operator=(const H5File&) = delete;
  ~H5File();

  const std::string& path() const { return path_; }
  // Flushes and closes; errors surface here rather than in the destructor.
  void close();

  bool has_dataset(const std::string& name) const;
  std::vector<std::string> dataset_names() const;  // root datasets, sorted
  DatasetInfo dataset_info(const std::string& name) const;
  // Reads a whole dataset into a host tensor of its stored type.
  Tensor read(const std::string& name) const;
  // Reads into an existing host view (shape and dtype must match what is stored, except that a
  // float32 dataset may be read into a bf16 view and vice versa).
  void read_into(const std::string& name, const TensorView& out) const;
  void write(const std::string& name, const TensorView& tensor);
  // A 1-D integer dataset of any width and signedness (uint8 masks, int64 offsets), as int64 values
  // (HDF5 converts; every value of these widths fits), or a 1-D boolean (h5py's bool: an enum
  // FALSE = 0, TRUE = 1 over int8) as 0/1. UserError when it is none of these.
  std::vector<int64_t> read_integer_vector(const std::string& name) const;
  // Whether `name` is a dataset read_integer_vector reads.
  bool is_integer_vector(const std::string& name) const;
  // A 1-D integer dataset as stored (token files read on demand, runtime/token_file.h).
  struct IntegerVectorInfo {
    int64_t length = 0;
    int width = 0;  // bytes per element: 1, 2, 4 or 8
    bool is_signed = false;
    // Where element 0 lies in the file when the values are one unfiltered little-endian block
    // (contiguous layout): such a dataset can be read with pread, without HDF5 and from any thread.
    std::optional<int64_t> file_offset;
  };
  // UserError when `name` is missing or not a 1-D integer dataset (or its storage is damaged).
  IntegerVectorInfo integer_vector_info(const std::string& name) const;
  // Elements [first, first + out.size()) of a 1-D integer dataset, converted by HDF5 (a hyperslab).
  // Every value of the stored width must fit `out`'s type (the caller checks the stored width).
  void read_integer_range(const std::string& name, int64_t first, std::span<int64_t> out) const;
  void read_integer_range(const std::string& name, int64_t first, std::span<int32_t> out) const;
  void read_integer_range(const std::string& name, int64_t first, std::span<uint8_t> out) const;
  // A 1-D uint8 dataset (per-token flags such as loss_mask).
  void write_uint8(const std::string& name, std::span<const uint8_t> values);

  bool has_attribute(const std::string& name) const;
  void set_attribute(const std::string& name, const std::string& value);
  void set_attribute(const std::string& name, int64_t value);
  void set_attribute(const std::string& name, double value);
  std::string string_attribute(const std::string& name) const;
  int64_t int_attribute(const std::string& name) const;
  double double_attribute(const std::string& name) const;

 private:
  H5File(int64_t id, std::string path) : id_(id), path_(std::move(path)) {}
  // UserError naming the file and the dataset when its storage does not hold its declared shape
  // (see the file comment); from the header alone, so a file declaring 2^40 elements is refused at once.
  void check_storage(int64_t dataset, const DatasetInfo& info, const std::string& name) const;
  void read_range(const std::string& name, int64_t first, int64_t count, int64_t memory_type, void* out) const;
  int64_t id_ = -1;  // hid_t
  std::string path_;
};

}  // namespace hydra
