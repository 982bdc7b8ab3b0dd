// HDF5 checkpoints (DESIGN.md §4): one dataset per tensor named by its parameter path, and root
// attributes format = "hydrahead-checkpoint", format_version, config (the full model config as
// JSON, every layer's FA head set included). Writes are atomic (AtomicFile: temp + rename).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "runtime/hdf5_file.h"

namespace hydra {

inline constexpr const char* kCheckpointFormat = "hydrahead-checkpoint";
inline constexpr int64_t kCheckpointVersion = 1;

using NamedTensors = std::map<std::string, Tensor>;

// Writes every tensor (host tensors; stored in their own dtype) and the root attributes.
void write_checkpoint(const std::string& path, const std::string& config_json, const NamedTensors& tensors);

class CheckpointReader {
 public:
  // UserError if the file is missing, not HDF5, not a hydrahead checkpoint, or from a newer format.
  explicit CheckpointReader(const std::string& path);
  const std::string& path() const { return file_.path(); }
  const std::string& config_json() const { return config_json_; }
  int64_t format_version() const { return version_; }
  std::vector<std::string> names() const { return file_.dataset_names(); }
  bool contains(const std::string& name) const { return file_.has_dataset(name); }
  DatasetInfo info(const std::string& name) const { return file_.dataset_info(name); }
  // Reads a tensor converted to `dtype` (f32 or bf16) on the host.
  Tensor read(const std::string& name, DType dtype) const;

 private:
  H5File file_;
  std::string config_json_;
  int64_t version_ = 0;
};

}  // namespace hydra
