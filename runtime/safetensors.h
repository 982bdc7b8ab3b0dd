// Reader for the safetensors format (Hugging Face): an 8-byte little-endian header length, a JSON
// header {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}, then the raw
// little-endian tensor bytes. The JSON is parsed with nlohmann::json; the file is memory-mapped and
// every tensor's byte range is checked against the file size, so a truncated download is reported
// by name instead of being read past its end.
#pragma once

#include <cstdint>
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

float half_to_float(uint16_t h);

}  // namespace hydra
