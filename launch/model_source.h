// Where a subcommand's model comes from: a checkpoint (--model FILE.h5) or a preset with random
// weights (--preset NAME --weight-seed N, nothing read from disk: speed runs and demos). Shared by
// every subcommand that runs a model, with one set of flags and one validation. The weights' seed is
// --weight-seed in every command; --seed, where a command has none of its own, is refused by name
// (it used to be the weight seed there, while generate, train, eval-niah and select-heads use it for
// their sampling, data or task seed).
#pragma once

#include <cstdint>
#include <string>

#include "launch/cli.h"
#include "model/model.h"
#include "parallel/device_world.h"

namespace hydra {

struct ModelSource {
  std::string model_path;
  std::string preset;
  uint64_t seed = 0;              // --weight-seed
  std::string old_seed;           // --seed where the command has no seed of its own: refused
  bool allow_nonfinite = false;  // load a checkpoint whose weights hold NaN/Inf (model/nonfinite.h)

  enum class OwnSeed { no, yes };  // yes: the command binds a --seed of its own (sampling, data order)
  void bind(po::options_description& options, OwnSeed own_seed = OwnSeed::no);
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
  // The weights for the ranks' agreement: a checkpoint's every dataset (add_file_datasets); a
  // preset's weights are fixed by its name and --weight-seed, which the options already hold.
  void add_contents(RunFingerprint& fingerprint) const;
};

// The start every command that runs a model shares (eval-lm, eval-niah, forward, generate, gradients,
// prefill, select-heads), in two halves around the command's own input checks, which add to `inputs`:
//   ModelRun run = ModelRun::begin(app, opt.model, opt.device);  // config, device, dtype, fingerprint
//   ... the command's checks; run.inputs.add(...) ...
//   ModelRun::Started started = run.start(app, opt.model, opt.device, opt.nccl_timeout);
struct ModelRun {
  ModelConfig config;     // the model's (cheap: a checkpoint's attributes)
  Device device;          // --device on this rank (resolve_device)
  DType dtype;            // the device's storage type
  RunFingerprint inputs;  // what the ranks agree on, begun with the model's fields
  static ModelRun begin(App& app, const ModelSource& source, const std::string& device_flag);

  // The weights join the fingerprint and the ranks agree on it (before the first collective); then
  // the device world is made and the model built (load_s: the build's wall time).
  struct Started {
    DeviceWorld world;
    Model model;
    double load_s = 0;
  };
  Started start(App& app, const ModelSource& source, const std::string& device_flag, double nccl_timeout);
};

}  // namespace hydra
