#include "runtime/token_file.h"

#include <algorithm>

#include "runtime/atomic_file.h"
#include "runtime/hdf5_file.h"

namespace hydra {

namespace {
DatasetInfo input_ids_info(const H5File& file, const std::string& path) {
  HYDRA_USER_CHECK(file.has_dataset("input_ids"), "{}: no 'input_ids' dataset", path);
  const DatasetInfo info = file.dataset_info("input_ids");
  HYDRA_USER_CHECK(info.dtype == DType::i32 || info.dtype == DType::i64,
                   "{}: 'input_ids' is {}, expected int32 or int64", path, dtype_name(info.dtype));
  HYDRA_USER_CHECK(info.shape.size() == 1, "{}: 'input_ids' has {} dimensions, expected 1 ([T])", path,
                   info.shape.size());
  HYDRA_USER_CHECK(info.shape[0] > 0, "{}: input is empty (input_ids has 0 tokens)", path);
  return info;
}
}  // namespace

int64_t token_file_length(const std::string& path) {
  const H5File file = H5File::open_read(path);
  return input_ids_info(file, path).shape[0];
}

std::vector<int32_t> read_token_file(const std::string& path, int64_t vocab_size) {
  H5File file = H5File::open_read(path);
  const DatasetInfo info = input_ids_info(file, path);
  Tensor raw = file.read("input_ids");
  std::vector<int32_t> ids(static_cast<size_t>(info.shape[0]));
  for (size_t i = 0; i < ids.size(); ++i) {
    const int64_t v = info.dtype == DType::i32 ? raw.data_as<int32_t>()[i] : raw.data_as<int64_t>()[i];
    HYDRA_USER_CHECK(v >= 0 && v < vocab_size, "{}: token id {} at position {} is outside the vocabulary [0, {})", path,
                     v, i, vocab_size);
    ids[i] = static_cast<int32_t>(v);
  }
  return ids;
}

void write_token_file(const std::string& path, const std::vector<int32_t>& ids) { write_token_data(path, ids, {}); }

void write_token_data(const std::string& path, const std::vector<int32_t>& ids, const std::vector<uint8_t>& loss_mask,
                      const std::vector<int64_t>& document_offsets) {
  HYDRA_ASSERT(loss_mask.empty() || loss_mask.size() == ids.size(), "loss mask of {} for {} tokens", loss_mask.size(),
               ids.size());
  require_writable_destination(path, "token file");
  AtomicFile out(path);
  H5File file = H5File::create(out.temp_path());
  file.write("input_ids", TensorView(const_cast<int32_t*>(ids.data()), DType::i32, Device::host,
                                     {static_cast<int64_t>(ids.size())}));
  if (!loss_mask.empty()) file.write_uint8("loss_mask", loss_mask);
  if (!document_offsets.empty()) {
    file.write("document_offsets", TensorView(const_cast<int64_t*>(document_offsets.data()), DType::i64, Device::host,
                                              {static_cast<int64_t>(document_offsets.size())}));
  }
  file.close();
  out.commit();
}

TokenData read_token_data(const std::string& path, int64_t vocab_size) {
  TokenData data;
  data.ids = read_token_file(path, vocab_size);
  const int64_t t = static_cast<int64_t>(data.ids.size());
  const H5File file = H5File::open_read(path);
  if (file.has_dataset("loss_mask")) {
    const std::vector<int64_t> mask = file.read_integer_vector("loss_mask");
    HYDRA_USER_CHECK(static_cast<int64_t>(mask.size()) == t, "{}: loss_mask has {} entries, input_ids {}", path,
                     mask.size(), t);
    data.loss_mask.resize(mask.size());
    for (size_t i = 0; i < mask.size(); ++i) {
      HYDRA_USER_CHECK(mask[i] == 0 || mask[i] == 1, "{}: loss_mask[{}] is {}; it must be 0 or 1", path, i, mask[i]);
      data.loss_mask[i] = static_cast<uint8_t>(mask[i]);
    }
  }
  if (file.has_dataset("answer_start") || file.has_dataset("answer_length")) {
    const std::vector<int64_t> start = file.read_integer_vector("answer_start");
    const std::vector<int64_t> length = file.read_integer_vector("answer_length");
    HYDRA_USER_CHECK(start.size() == length.size(), "{}: answer_start has {} entries, answer_length {}", path,
                     start.size(), length.size());
    data.answer.assign(data.ids.size(), 0);
    for (size_t j = 0; j < start.size(); ++j) {
      HYDRA_USER_CHECK(start[j] >= 1 && length[j] >= 1 && length[j] <= t && start[j] <= t - length[j],
                       "{}: answer span {} ([{}, +{})) lies outside the {} tokens (or starts at 0)", path, j, start[j],
                       length[j], t);
      std::fill(data.answer.begin() + start[j], data.answer.begin() + start[j] + length[j], uint8_t{1});
    }
  }
  if (file.has_dataset("document_offsets")) {
    data.document_offsets = file.read_integer_vector("document_offsets");
    const std::vector<int64_t>& o = data.document_offsets;
    HYDRA_USER_CHECK(o.size() >= 2 && o.front() == 0 && o.back() == t,
                     "{}: document_offsets must run from 0 to the {} tokens (got {} entries{})", path, t, o.size(),
                     o.empty() ? "" : fmt::format(", {} .. {}", o.front(), o.back()));
    for (size_t i = 1; i < o.size(); ++i) {
      HYDRA_USER_CHECK(o[i] > o[i - 1], "{}: document_offsets[{}] = {} does not exceed document_offsets[{}] = {} "
                       "(documents must be non-empty, in order)", path, i, o[i], i - 1, o[i - 1]);
    }
  }
  return data;
}

}  // namespace hydra
