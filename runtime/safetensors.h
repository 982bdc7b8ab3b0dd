// Reader and writer for the safetensors format (Hugging Face): an 8-byte little-endian header
// length, a JSON header {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}},
// then the raw little-endian tensor bytes. The JSON is parsed and written with nlohmann::json.
//
// Reading: the file is memory-mapped and every tensor's byte range is checked against the file
// size, so a truncated download is reported by name instead of being read past its end.
// Writing (SafetensorsWriter): the header is padded with spaces so the data section starts at a
// multiple of 8 bytes (the format allows trailing whitespace in the header), and the tensors follow
// back to back in the order given, with no holes (safetensors' own loader refuses gaps). Tensors are
// streamed one at a time, so a file far larger than memory can be written.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "runtime/tensor.h"

namespace hydra {

struct SafetensorsEntry {
  std::string dtype;  // "BF16", "F16", "F32", ...
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte range inside the data section
  uint64_t end = 0;
};

class SafetensorsFile {
 public:
  // UserError naming the file if it is missing, truncated or not safetensors.
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, SafetensorsEntry>& entries() const { return entries_; }
  bool contains(const std::string& name) const { return entries_.count(name) != 0; }
  // Reads one tensor converted to `dtype` (f32 or bf16) on the host. BF16, F16 and F32 inputs.
  Tensor read(const std::string& name, DType dtype) const;

 private:
  void parse_header();
  std::string path_;
  std::map<std::string, SafetensorsEntry> entries_;
  const unsigned char* map_ = nullptr;
  size_t map_size_ = 0;
  size_t data_offset_ = 0;
};

// Writes one safetensors file at `path` (callers pass a temporary path: AtomicFile, or a file inside
// a temporary directory). Tensors are declared up front (the header needs every shape) and then
// written in that order with write(); close() checks that all of them arrived and flushes. A write
// that fails (disk full) is a UserError naming the file; an unclosed writer leaves a partial file,
// which the caller's temporary removes.
struct SafetensorsTensorSpec {
  std::string name;
  DType dtype = DType::f32;  // f32 ("F32") or bf16 ("BF16")
  std::vector<int64_t> shape;
};

class SafetensorsWriter {
 public:
  // `metadata`: string pairs for "__metadata__" (transformers wants {"format": "pt"}).
  SafetensorsWriter(const std::string& path, std::vector<SafetensorsTensorSpec> tensors,
                    const std::map<std::string, std::string>& metadata);
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // The next declared tensor's data: a host view of its dtype and shape (any strides).
  void write(const TensorView& tensor);
  void close();
  // Bytes of the data section (the sum of the tensors' sizes).
  uint64_t data_bytes() const { return data_bytes_; }

 private:
  std::string path_;
  std::vector<SafetensorsTensorSpec> tensors_;
  size_t next_ = 0;
  uint64_t data_bytes_ = 0;
  std::FILE* file_ = nullptr;
};

// The header's dtype string of a tensor dtype ("F32", "BF16"); internal error for others.
std::string safetensors_dtype(DType dtype);
// Bytes a safetensors tensor of this dtype and shape occupies.
uint64_t safetensors_bytes(DType dtype, const std::vector<int64_t>& shape);

float half_to_float(uint16_t h);

}  // namespace hydra
