#include "launch/model_source.h"

#include <chrono>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "model/params.h"
#include "runtime/atomic_file.h"
#include "runtime/fault.h"

namespace hydra {
namespace {

// "instead of --model: ... (qwen3-tiny, ...)", listing every preset the model layer knows.
const std::string& preset_help() {
  static const std::string text =
      fmt::format("instead of --model: a preset shape with random weights ({})", fmt::join(preset_names(), ", "));
  return text;
}

}  // namespace

void ModelSource::bind(po::options_description& options, OwnSeed own_seed) {
  options.add_options()
      ("model", po::value(&model_path), "hydra checkpoint (.h5) to run")
      ("preset", po::value(&preset), preset_help().c_str())
      ("weight-seed", po::value(&seed)->default_value(0), "weight seed for --preset (the same name in every command)");
  if (own_seed == OwnSeed::no) {
    options.add_options()("seed", po::value(&old_seed), "not taken: the weight seed is --weight-seed");
  }
  bind_allow_nonfinite(options, &allow_nonfinite);
}

void ModelSource::bind_allow_nonfinite(po::options_description& options, bool* flag) {
  options.add_options()
      ("allow-nonfinite", po::bool_switch(flag),
       "load a checkpoint whose weights hold NaN or Inf (refused by default); a run whose output turns non-finite "
       "still stops, naming the first layer where it does");
}

void ModelSource::validate() const {
  HYDRA_USER_CHECK(old_seed.empty(), "--seed is not taken here: the weight seed is --weight-seed (the same name in "
                   "every command; --seed is a sampling, data or task seed where a command has one)");
  HYDRA_USER_CHECK(model_path.empty() != preset.empty(), "give exactly one of --model FILE.h5 or --preset NAME");
  if (!preset.empty()) {
    preset_config(preset);  // throws for an unknown preset, listing the known ones
  } else {
    require_readable_file(model_path, "model");
  }
}

ModelConfig ModelSource::config() const {
  if (!preset.empty()) return preset_config(preset);
  maybe_inject_fault("load");
  return read_model_config(model_path);
}

LoadedCheckpoint ModelSource::parameters() const {
  if (!preset.empty()) {
    LoadedCheckpoint out;
    out.config = preset_config(preset);
    out.params = random_parameters(out.config, seed);
    return out;
  }
  return read_model_checkpoint(model_path, allow_nonfinite ? NonFinite::allow : NonFinite::refuse);
}

Model ModelSource::build(Device device, DType dtype, const ops::KernelOptions& kernels) const {
  auto placed = [&] {
    if (!preset.empty()) {
      const ModelConfig c = preset_config(preset);
      return Model(c, random_parameters(c, seed, device, device == Device::host ? DType::f32 : dtype), device, dtype);
    }
    const LoadedCheckpoint ck = parameters();
    return Model(ck.config, ck.params, device, dtype);
  };
  Model model = placed();
  model.set_kernel_options(kernels);
  return model;
}

void ModelSource::add_contents(RunFingerprint& fingerprint) const {
  if (!model_path.empty()) add_file_datasets(fingerprint, "model", model_path);
}

std::string ModelSource::describe() const {
  return preset.empty() ? model_path : fmt::format("preset {} (weight seed {})", preset, seed);
}

ModelRun ModelRun::begin(App& app, const ModelSource& source, const std::string& device_flag) {
  ModelRun run{source.config(), resolve_device(device_flag, app.mpi, app.gpu_sharing), DType::f32, {}};
  run.dtype = storage_dtype(run.device);
  add_model_fields(run.inputs, run.config, run.device, run.dtype);
  return run;
}

ModelRun::Started ModelRun::start(App& app, const ModelSource& source, const std::string& device_flag,
                                  double nccl_timeout) {
  source.add_contents(inputs);
  agree_on_run(app, inputs);
  DeviceWorld world = make_device_world(device_flag, app.mpi, app.world, app.gpu_sharing, nccl_timeout);
  const auto t0 = std::chrono::steady_clock::now();
  Model model = source.build(device, dtype, app.kernels);
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return Started{std::move(world), std::move(model), load_s};
}

}  // namespace hydra
