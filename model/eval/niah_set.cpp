#include "model/eval/niah_set.h"

#include <map>

#include "runtime/atomic_file.h"
#include "runtime/hdf5_file.h"

namespace hydra::niah {
namespace {

Tensor i64_tensor(const std::vector<int64_t>& values) {
  Tensor t = Tensor::empty({static_cast<int64_t>(values.size())}, DType::i64);
  std::copy(values.begin(), values.end(), t.data_as<int64_t>());
  return t;
}

// A 1-D integer dataset of `expected` entries (−1: any), widened to int64.
std::vector<int64_t> read_ints(const H5File& file, const std::string& name, int64_t expected) {
  HYDRA_USER_CHECK(file.has_dataset(name), "{}: NIAH eval set has no '{}' dataset", file.path(), name);
  const DatasetInfo info = file.dataset_info(name);
  HYDRA_USER_CHECK(info.dtype == DType::i32 || info.dtype == DType::i64, "{}: '{}' is {}, expected int32 or int64",
                   file.path(), name, dtype_name(info.dtype));
  HYDRA_USER_CHECK(info.shape.size() == 1, "{}: '{}' has {} dimensions, expected 1", file.path(), name, info.shape.size());
  HYDRA_USER_CHECK(expected < 0 || info.shape[0] == expected, "{}: '{}' has {} entries, expected {}", file.path(), name,
                   info.shape[0], expected);
  const Tensor raw = file.read(name);  // sized by the file: H5File::read bounds it by the memory available
  std::vector<int64_t> out(static_cast<size_t>(info.shape[0]));
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = info.dtype == DType::i32 ? raw.data_as<int32_t>()[i] : raw.data_as<int64_t>()[i];
  }
  return out;
}

}  // namespace

void write_eval_set(const std::string& path, const EvalSet& set) {
  require_writable_destination(path, "NIAH eval set");
  HYDRA_USER_CHECK(!set.samples.empty(), "{}: an eval set needs at least one sample", path);
  std::vector<int32_t> ids;
  std::vector<int64_t> offset{0}, start, count, length, depth, index, needle;
  for (const Sample& s : set.samples) {
    ids.insert(ids.end(), s.ids.begin(), s.ids.end());
    offset.push_back(static_cast<int64_t>(ids.size()));
    start.push_back(s.answer_start);
    count.push_back(s.answer_length);
    length.push_back(s.length);
    depth.push_back(s.depth);
    index.push_back(s.index);
    needle.push_back(s.needle_position);
  }
  AtomicFile out(path);
  H5File file = H5File::create(out.temp_path());
  file.set_attribute("format", std::string(kEvalSetFormat));
  file.set_attribute("format_version", kEvalSetVersion);
  file.set_attribute("task", set.task);
  file.set_attribute("source", set.source);
  if (set.item_separator >= 0) file.set_attribute("item_separator", static_cast<int64_t>(set.item_separator));
  file.write("input_ids", TensorView(ids.data(), DType::i32, Device::host, {static_cast<int64_t>(ids.size())}));
  file.write("sample_offset", i64_tensor(offset));
  file.write("answer_start", i64_tensor(start));
  file.write("answer_length", i64_tensor(count));
  file.write("length", i64_tensor(length));
  file.write("depth", i64_tensor(depth));
  file.write("sample_index", i64_tensor(index));
  file.write("needle_position", i64_tensor(needle));
  file.close();
  out.commit();
}

EvalSet read_eval_set(const std::string& path, int64_t vocab_size) {
  const H5File file = H5File::open_read(path);
  HYDRA_USER_CHECK(file.has_attribute("format") && file.string_attribute("format") == kEvalSetFormat,
                   "{}: not a NIAH eval set (root attribute format = \"{}\" expected)", path, kEvalSetFormat);
  const int64_t version = file.has_attribute("format_version") ? file.int_attribute("format_version") : 0;
  HYDRA_USER_CHECK(version >= 1 && version <= kEvalSetVersion,
                   "{}: NIAH eval set format version {} is not supported (this hydra reads 1..{})", path, version,
                   kEvalSetVersion);
  EvalSet set;
  set.task = file.has_attribute("task") ? file.string_attribute("task") : "";
  HYDRA_USER_CHECK(!set.task.empty(), "{}: NIAH eval set has no 'task' attribute", path);
  set.source = file.has_attribute("source") ? file.string_attribute("source") : "";
  if (file.has_attribute("item_separator")) {
    const int64_t sep = file.int_attribute("item_separator");
    HYDRA_USER_CHECK(sep >= -1 && sep < vocab_size,
                     "{}: item_separator {} is outside the model's vocabulary [0, {}) (−1: one item)", path, sep, vocab_size);
    set.item_separator = static_cast<int32_t>(sep);
  }

  const std::vector<int64_t> offset = read_ints(file, "sample_offset", -1);
  HYDRA_USER_CHECK(offset.size() >= 2, "{}: 'sample_offset' needs N + 1 ≥ 2 entries (got {})", path, offset.size());
  const int64_t n = static_cast<int64_t>(offset.size()) - 1;
  const std::vector<int64_t> ids = read_ints(file, "input_ids", -1);
  const std::vector<int64_t> start = read_ints(file, "answer_start", n), count = read_ints(file, "answer_length", n);
  const std::vector<int64_t> length = read_ints(file, "length", n), depth = read_ints(file, "depth", n);
  const std::vector<int64_t> index =
      file.has_dataset("sample_index") ? read_ints(file, "sample_index", n) : std::vector<int64_t>{};
  const std::vector<int64_t> needle =
      file.has_dataset("needle_position") ? read_ints(file, "needle_position", n) : std::vector<int64_t>{};
  HYDRA_USER_CHECK(offset.front() == 0 && offset.back() == static_cast<int64_t>(ids.size()),
                   "{}: 'sample_offset' must run from 0 to the {} entries of 'input_ids' (runs {} .. {})", path,
                   ids.size(), offset.front(), offset.back());
  // Every bound below is checked without forming a sum that could overflow: values come from a
  // file, and a start near 2^62 once passed `start + length <= total` by wrapping around.
  for (int64_t i = 0; i < n; ++i) {
    HYDRA_USER_CHECK(offset[i] >= 0 && offset[i] <= offset[i + 1] && offset[i + 1] <= offset.back(),
                     "{}: 'sample_offset' must not decrease (entry {} is {}, entry {} is {})", path, i, offset[i],
                     i + 1, offset[i + 1]);
  }
  std::map<std::pair<int64_t, int64_t>, int64_t> running;  // cell -> samples so far
  for (int64_t i = 0; i < n; ++i) {
    const int64_t begin = offset[i], total = offset[i + 1] - offset[i];
    HYDRA_USER_CHECK(total >= 2, "{}: sample {} has {} tokens ('sample_offset' must increase; at least 2 tokens)", path,
                     i, total);
    if (!(start[i] >= 1 && count[i] >= 1 && start[i] < total && count[i] <= total - start[i])) {
      int64_t end = 0;
      const bool overflows = __builtin_add_overflow(start[i], count[i], &end);
      HYDRA_USER_FAIL("{}: sample {}: answer [{}, {}) must lie in [1, {}] with at least one token", path, i, start[i],
                      overflows ? std::string("beyond 2^63") : std::to_string(end), total);
    }
    HYDRA_USER_CHECK(depth[i] >= 0 && depth[i] <= 100, "{}: sample {}: depth {} is outside 0..100", path, i, depth[i]);
    HYDRA_USER_CHECK(length[i] >= 1, "{}: sample {}: length label {} is not positive", path, i, length[i]);
    HYDRA_USER_CHECK(needle.empty() || (needle[i] >= -1 && needle[i] < total),
                     "{}: sample {}: needle_position {} is outside the sample's {} tokens", path, i, needle[i], total);
    Sample s;
    s.length = length[i];
    s.depth = depth[i];
    s.index = index.empty() ? running[{length[i], depth[i]}]++ : index[i];
    s.answer_start = start[i];
    s.answer_length = count[i];
    s.needle_position = needle.empty() ? -1 : needle[i];
    s.ids.resize(static_cast<size_t>(total));
    for (int64_t t = 0; t < total; ++t) {
      const int64_t v = ids[static_cast<size_t>(begin + t)];
      HYDRA_USER_CHECK(v >= 0 && v < vocab_size,
                       "{}: sample {}: token id {} at position {} is outside the model's vocabulary [0, {})", path, i,
                       v, t, vocab_size);
      s.ids[static_cast<size_t>(t)] = static_cast<int32_t>(v);
    }
    set.samples.push_back(std::move(s));
  }
  return set;
}

}  // namespace hydra::niah
