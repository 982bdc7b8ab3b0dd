#include "runtime/token_file.h"

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

void write_token_file(const std::string& path, const std::vector<int32_t>& ids) {
  require_writable_destination(path, "token file");
  AtomicFile out(path);
  H5File file = H5File::create(out.temp_path());
  file.write("input_ids", TensorView(const_cast<int32_t*>(ids.data()), DType::i32, Device::host,
                                     {static_cast<int64_t>(ids.size())}));
  file.close();
  out.commit();
}

}  // namespace hydra
