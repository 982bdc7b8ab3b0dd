#include "runtime/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <set>
#include <cerrno>
#include <cstring>

#include <nlohmann/json.hpp>

#include "runtime/atomic_file.h"
#include "runtime/json_integer.h"

namespace hydra {

float half_to_float(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1f;
  uint32_t mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;
    } else {  // subnormal half: renormalise
      int e = -1;
      do {
        ++e;
        mantissa <<= 1;
      } while ((mantissa & 0x400u) == 0);
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mantissa & 0x3ffu) << 13;
    }
  } else if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | mantissa << 13;
  } else {
    bits = sign | (exponent + 127 - 15) << 23 | mantissa << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  require_readable_file(path, "safetensors");
  const int fd = ::open(path.c_str(), O_RDONLY);
  HYDRA_USER_CHECK(fd >= 0, "{}: cannot open ({})", path, std::strerror(errno));
  struct stat st {};
  fstat(fd, &st);
  map_size_ = static_cast<size_t>(st.st_size);
  if (map_size_ < 8) {
    ::close(fd);
    HYDRA_USER_FAIL("{}: truncated safetensors file ({} bytes, no header)", path, map_size_);
  }
  void* p = mmap(nullptr, map_size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  HYDRA_USER_CHECK(p != MAP_FAILED, "{}: cannot map file ({})", path, std::strerror(errno));
  map_ = static_cast<const unsigned char*>(p);
  try {
    parse_header();
  } catch (...) {  // the destructor does not run for a constructor that throws
    munmap(const_cast<unsigned char*>(map_), map_size_);
    map_ = nullptr;
    throw;
  }
}

void SafetensorsFile::parse_header() {
  const std::string& path = path_;
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = header_len << 8 | map_[i];
  HYDRA_USER_CHECK(header_len <= map_size_ - 8, "{}: truncated safetensors file (header of {} bytes, file of {})",
                   path, header_len, map_size_);
  data_offset_ = 8 + header_len;
  nlohmann::json header;
  // JSON keeps the last of two equal keys: a tensor named twice would silently read the second.
  std::set<std::string> names;
  std::string repeated;
  const auto no_repeats = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    if (depth == 1 && event == nlohmann::json::parse_event_t::key && !names.insert(parsed.get<std::string>()).second &&
        repeated.empty()) {
      repeated = parsed.get<std::string>();
    }
    return true;
  };
  try {
    header = nlohmann::json::parse(map_ + 8, map_ + 8 + header_len, no_repeats);
  } catch (const nlohmann::json::exception& e) {
    HYDRA_USER_FAIL("{}: not a safetensors file (header is not JSON: {})", path, e.what());
  }
  HYDRA_USER_CHECK(header.is_object(), "{}: not a safetensors file (header is not a JSON object)", path);
  HYDRA_USER_CHECK(repeated.empty(), "{}: the header names tensor '{}' twice", path, repeated);
  const uint64_t data_size = map_size_ - data_offset_;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") continue;
    SafetensorsEntry e;
    try {
      HYDRA_USER_CHECK(value.is_object(), "{}: header entry for '{}' is not an object", path, name);
      e.dtype = value.at("dtype").get<std::string>();
      const nlohmann::json& shape = value.at("shape");
      const nlohmann::json& offsets = value.at("data_offsets");
      HYDRA_USER_CHECK(shape.is_array() && shape.size() <= static_cast<size_t>(kMaxRank),
                       "{}: tensor '{}' has a shape that is not a list of at most {} sizes", path, name, kMaxRank);
      for (const nlohmann::json& d : shape) {
        e.shape.push_back(json_integer(d, fmt::format("{}: shape of '{}'", path, name)));
      }
      HYDRA_USER_CHECK(checked_numel(e.shape) >= 0, "{}: tensor '{}' has shape {} (negative or too large)", path, name,
                       format_shape(e.shape));
      HYDRA_USER_CHECK(offsets.is_array() && offsets.size() == 2, "{}: tensor '{}' has bad data_offsets", path, name);
      const int64_t begin = json_integer(offsets[0], fmt::format("{}: data_offsets of '{}'", path, name));
      const int64_t end = json_integer(offsets[1], fmt::format("{}: data_offsets of '{}'", path, name));
      HYDRA_USER_CHECK(begin >= 0 && begin <= end, "{}: tensor '{}' has bad data_offsets [{}, {}]", path, name, begin,
                       end);
      e.begin = static_cast<uint64_t>(begin);
      e.end = static_cast<uint64_t>(end);
    } catch (const nlohmann::json::exception& ex) {
      HYDRA_USER_FAIL("{}: malformed header entry for '{}' ({})", path, name, ex.what());
    }
    HYDRA_USER_CHECK(e.end <= data_size,
                     "{}: truncated safetensors file: tensor '{}' ends at byte {} of a {}-byte data section", path,
                     name, e.end, data_size);
    entries_.emplace(name, std::move(e));
  }
  // Each tensor's bytes are its own: overlapping ranges would alias two tensors.
  std::vector<std::pair<const std::string*, const SafetensorsEntry*>> by_offset;
  for (const auto& [name, e] : entries_) {
    if (e.end > e.begin) by_offset.emplace_back(&name, &e);
  }
  std::sort(by_offset.begin(), by_offset.end(), [](const auto& a, const auto& b) { return a.second->begin < b.second->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const SafetensorsEntry& prev = *by_offset[i - 1].second;
    const SafetensorsEntry& next = *by_offset[i].second;
    HYDRA_USER_CHECK(next.begin >= prev.end, "{}: tensors '{}' [{}, {}) and '{}' [{}, {}) overlap in the data section",
                     path, *by_offset[i - 1].first, prev.begin, prev.end, *by_offset[i].first, next.begin, next.end);
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) munmap(const_cast<unsigned char*>(map_), map_size_);
}

Tensor SafetensorsFile::read(const std::string& name, DType dtype) const {
  const auto it = entries_.find(name);
  HYDRA_USER_CHECK(it != entries_.end(), "{}: tensor '{}' is missing", path_, name);
  const SafetensorsEntry& e = it->second;
  HYDRA_ASSERT(dtype == DType::f32 || dtype == DType::bf16, "safetensors read as {}", dtype_name(dtype));
  const int64_t n = checked_numel(e.shape);  // checked when the header was read
  const size_t element = e.dtype == "F32" ? 4 : (e.dtype == "BF16" || e.dtype == "F16") ? 2 : 0;
  HYDRA_USER_CHECK(element != 0, "{}: tensor '{}' has dtype {}; supported are BF16, F16 and F32", path_, name,
                   e.dtype);
  HYDRA_USER_CHECK(n >= 0 && static_cast<uint64_t>(n) * element == e.end - e.begin,
                   "{}: tensor '{}' has {} bytes for shape of {} {} elements", path_, name, e.end - e.begin, n,
                   e.dtype);
  Tensor out = Tensor::empty(e.shape, dtype, Device::host);
  const unsigned char* src = map_ + data_offset_ + e.begin;
  if ((e.dtype == "F32" && dtype == DType::f32) || (e.dtype == "BF16" && dtype == DType::bf16)) {
    std::memcpy(out.data(), src, out.nbytes());
    return out;
  }
  for (int64_t i = 0; i < n; ++i) {
    float v;
    if (e.dtype == "F32") {
      std::memcpy(&v, src + 4 * i, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, src + 2 * i, 2);
      v = e.dtype == "BF16" ? bf16_to_float(bf16{h}) : half_to_float(h);
    }
    if (dtype == DType::f32) {
      out.data_as<float>()[i] = v;
    } else {
      out.data_as<bf16>()[i] = float_to_bf16(v);
    }
  }
  return out;
}

// ---- Writer ---------------------------------------------------------------------------------------

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian: host bytes are written as they are");

std::string safetensors_dtype(DType dtype) {
  HYDRA_ASSERT(dtype == DType::f32 || dtype == DType::bf16, "safetensors write of {}", dtype_name(dtype));
  return dtype == DType::f32 ? "F32" : "BF16";
}

uint64_t safetensors_bytes(DType dtype, const std::vector<int64_t>& shape) {
  const int64_t n = checked_numel(shape);
  HYDRA_ASSERT(n >= 0, "safetensors tensor of shape {}", format_shape(shape));
  return static_cast<uint64_t>(n) * dtype_size(dtype);
}

SafetensorsWriter::SafetensorsWriter(const std::string& path, std::vector<SafetensorsTensorSpec> tensors,
                                     const std::map<std::string, std::string>& metadata)
    : path_(path), tensors_(std::move(tensors)) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  for (const SafetensorsTensorSpec& t : tensors_) {
    HYDRA_ASSERT(!t.name.empty() && t.name != "__metadata__" && !header.contains(t.name), "safetensors tensor name '{}'",
                 t.name);
    const uint64_t bytes = safetensors_bytes(t.dtype, t.shape);
    header[t.name] = {{"dtype", safetensors_dtype(t.dtype)}, {"shape", t.shape},
                      {"data_offsets", {data_bytes_, data_bytes_ + bytes}}};
    data_bytes_ += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // data section 8-byte aligned (8 + header length)
  file_ = std::fopen(path_.c_str(), "wb");
  HYDRA_USER_CHECK(file_ != nullptr, "{}: cannot create ({})", destination_of(path_), std::strerror(errno));
  unsigned char length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(static_cast<uint64_t>(text.size()) >> (8 * i));
  HYDRA_USER_CHECK(std::fwrite(length, 1, 8, file_) == 8 && std::fwrite(text.data(), 1, text.size(), file_) == text.size(),
                   "{}: writing failed (disk full or over a file size limit?)", destination_of(path_));
}

SafetensorsWriter::~SafetensorsWriter() {
  if (file_) std::fclose(file_);
}

void SafetensorsWriter::write(const TensorView& tensor) {
  HYDRA_ASSERT(file_ != nullptr && next_ < tensors_.size(), "{}: more tensors written than declared", path_);
  const SafetensorsTensorSpec& spec = tensors_[next_];
  HYDRA_ASSERT(tensor.on_host() && tensor.dtype() == spec.dtype &&
                   std::equal(spec.shape.begin(), spec.shape.end(), tensor.shape().begin(), tensor.shape().end()),
               "{}: tensor '{}' written as {} {}, declared {} {}", path_, spec.name, dtype_name(tensor.dtype()),
               tensor.shape_string(), dtype_name(spec.dtype), format_shape(spec.shape));
  Tensor contiguous;
  const TensorView* src = &tensor;
  if (!tensor.is_contiguous()) {
    contiguous = clone(tensor);
    src = &contiguous.view();
  }
  HYDRA_USER_CHECK(std::fwrite(src->data(), 1, src->nbytes(), file_) == src->nbytes(),
                   "{}: writing tensor '{}' failed (disk full or over a file size limit?)", destination_of(path_),
                   spec.name);
  ++next_;
}

void SafetensorsWriter::close() {
  HYDRA_ASSERT(file_ != nullptr && next_ == tensors_.size(), "{}: {} of {} declared tensors written", path_, next_,
               tensors_.size());
  const bool flushed = std::fflush(file_) == 0;
  const bool closed = std::fclose(file_) == 0;
  file_ = nullptr;
  HYDRA_USER_CHECK(flushed && closed, "{}: writing failed (disk full or over a file size limit?)",
                   destination_of(path_));
}

}  // namespace hydra
