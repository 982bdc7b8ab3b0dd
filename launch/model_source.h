// Where a subcommand's model comes from: a checkpoint (--model FILE.h5) or a preset with random
// weights (--preset NAME --seed N or --weight-seed N, nothing read from disk: speed runs and demos). Shared by every
// subcommand that runs a model, with one set of flags and one validation.
#pragma once

#include <cstdint>
#include <string>

#include "launch/cli.h"
#include "model/model.h"

namespace hydra {

struct ModelSource {
  std::string model_path;
  std::string preset;
  uint64_t seed = 0;
  bool allow_nonfinite = false;  // load a checkpoint whose weights hold NaN/Inf (model/nonfinite.h)

  // `seed_flag` names the preset's weight seed: "seed", or "weight-seed" where a command's own
  // --seed means something else (a task or data-order seed).
  void bind(po::options_description& options, const char* seed_flag = "seed");
  // --allow-nonfinite alone (commands that bind --model/--preset themselves).
  static void bind_allow_nonfinite(po::options_description& options, bool* flag);
  // Exactly one of --model / --preset; a named preset must exist; the file must be readable.
  void validate() const;
  // The config alone (cheap: reads only the checkpoint's attributes), for input checks.
  ModelConfig config() const;
  // Config and host f32 parameters.
  LoadedCheckpoint parameters() const;
  // The model placed on `device` in `dtype` (host: f32; cuda: bf16), running with `kernels`
  // (App::kernels). A preset draws its weights directly on the device; a checkpoint is read on the
  // host and placed.
  Model build(Device device, DType dtype, const ops::KernelOptions& kernels) const;
  std::string describe() const;
};

}  // namespace hydra
