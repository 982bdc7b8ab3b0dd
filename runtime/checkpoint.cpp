#include "runtime/checkpoint.h"

#include "runtime/atomic_file.h"

namespace hydra {

void write_checkpoint(const std::string& path, const std::string& config_json, const NamedTensors& tensors) {
  require_writable_destination(path, "checkpoint");
  AtomicFile out(path);
  H5File file = H5File::create(out.temp_path());
  file.set_attribute("format", std::string(kCheckpointFormat));
  file.set_attribute("format_version", kCheckpointVersion);
  file.set_attribute("config", config_json);
  for (const auto& [name, tensor] : tensors) file.write(name, tensor);
  file.close();
  out.commit();
}

CheckpointReader::CheckpointReader(const std::string& path) : file_(H5File::open_read(path)) {
  HYDRA_USER_CHECK(file_.has_attribute("format"),
                   "{}: not a hydrahead checkpoint (no 'format' attribute; HF checkpoints go through "
                   "`hydra import`)", path);
  const std::string format = file_.string_attribute("format");
  HYDRA_USER_CHECK(format == kCheckpointFormat, "{}: wrong format '{}' (expected '{}')", path, format,
                   kCheckpointFormat);
  version_ = file_.int_attribute("format_version");
  HYDRA_USER_CHECK(version_ >= 1, "{}: checkpoint format version {} is not a version any hydra wrote (versions "
                   "start at 1): the file is damaged or was written by another tool", path, version_);
  HYDRA_USER_CHECK(version_ <= kCheckpointVersion,
                   "{}: checkpoint format version {} is newer than this hydra understands ({}); upgrade hydra",
                   path, version_, kCheckpointVersion);
  config_json_ = file_.string_attribute("config");
}

Tensor CheckpointReader::read(const std::string& name, DType dtype) const {
  const DatasetInfo info = file_.dataset_info(name);
  Tensor t = Tensor::empty(info.shape, dtype, Device::host);
  file_.read_into(name, t);
  return t;
}

}  // namespace hydra
