#include "launch/model_source.h"

#include <chrono>
#include <fstream>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "model/hf_import.h"
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

ModelConfig shape_config(const std::string& preset, const std::string& config_file, int64_t vocab) {
  ModelConfig c;
  if (!preset.empty()) {
    c = preset_config(preset);
  } else {
    std::ifstream in(config_file);
    HYDRA_USER_CHECK(in.good(), "--config {}: cannot be read", config_file);
    const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    HYDRA_USER_CHECK(j.is_object(), "--config {}: not a JSON object", config_file);
    if (j.contains("model_type")) {
      c = config_from_hf_json(j, config_file);  // an HF config.json: qwen3, or a hydra export's hydrahead
    } else {
      HYDRA_USER_CHECK(j.contains("arch"), "--config {}: neither an HF config.json (model_type qwen3 or hydrahead) nor "
                       "hydra's config (arch qwen3 or hydrahead)", config_file);
      c = config_from_json(j, config_file);
    }
  }
  if (vocab > 0) {
    c.vocab_size = vocab;
    try {
      c.validate();
    } catch (const UserError& e) {
      HYDRA_USER_FAIL("--vocab {}: {}", vocab, e.what());
    }
  }
  return c;
}

void ModelSource::bind(po::options_description& options, OwnSeed own_seed) {
  options.add_options()
      ("model", po::value(&model_path), "hydra checkpoint (.h5) to run")
      ("preset", po::value(&preset), preset_help().c_str())
      ("config", po::value(&config_file), "instead of --model: random weights of the shape a JSON config gives (an HF "
       "config.json of model_type qwen3 or hydrahead, or hydra's own config)")
      ("vocab", po::value(&vocab)->default_value(0), "with --preset or --config: the vocabulary size instead of theirs "
       "(a tokenizer's, e.g. from cluster/train_tokenizer.py; 0: theirs)")
      ("weight-seed", po::value(&seed)->default_value(0), "weight seed for --preset or --config (the same name in every command)");
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
  const int given = (model_path.empty() ? 0 : 1) + (preset.empty() ? 0 : 1) + (config_file.empty() ? 0 : 1);
  HYDRA_USER_CHECK(given == 1, "give exactly one of --model FILE.h5, --preset NAME or --config FILE.json");
  HYDRA_USER_CHECK(vocab >= 0, "--vocab must be a vocabulary size (got {})", vocab);
  HYDRA_USER_CHECK(vocab == 0 || model_path.empty(), "--vocab goes with --preset or --config: a checkpoint's vocabulary "
                   "is its embedding's");
  if (!model_path.empty()) {
    require_readable_file(model_path, "model");
  } else {
    shape_config(preset, config_file, vocab);  // an unknown preset lists the known ones; a bad config is named
  }
}

ModelConfig ModelSource::config() const {
  if (random_weights()) return shape_config(preset, config_file, vocab);
  maybe_inject_fault("load");
  return read_model_config(model_path);
}

LoadedCheckpoint ModelSource::parameters() const {
  if (random_weights()) {
    LoadedCheckpoint out;
    out.config = config();
    out.params = random_parameters(out.config, seed);
    return out;
  }
  return read_model_checkpoint(model_path, allow_nonfinite ? NonFinite::allow : NonFinite::refuse);
}

Model ModelSource::build(Device device, DType dtype, const ops::KernelOptions& kernels) const {
  auto placed = [&] {
    if (random_weights()) {
      const ModelConfig c = config();
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
  if (!model_path.empty()) return model_path;
  const std::string shape = preset.empty() ? "config " + config_file : "preset " + preset;
  return vocab > 0 ? fmt::format("{} (vocabulary {}, weight seed {})", shape, vocab, seed)
                   : fmt::format("{} (weight seed {})", shape, seed);
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
