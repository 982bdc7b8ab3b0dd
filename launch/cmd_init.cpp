// hydra init: a model of a preset shape (or a JSON config's), any vocabulary, with random weights,
// written as a checkpoint.
#include <nlohmann/json.hpp>

#include "launch/cli.h"
#include "launch/model_source.h"
#include "model/params.h"
#include "runtime/atomic_file.h"
#include "runtime/checkpoint.h"
#include "runtime/log.h"

namespace hydra {
namespace {

struct InitOptions {
  std::string preset;
  std::string config_file;
  int64_t vocab = 0;
  uint64_t seed = 0;
  std::string old_seed;
  std::string out;
  std::string dtype = "f32";

  void bind(po::options_description& o) {
    o.add_options()
        ("preset", po::value(&preset), "shape: qwen3-tiny, hydrahead-tiny, qwen3-1.7b, hydrahead-1.7b, qwen3-4b, hydrahead-4b, qwen3-8b, hydrahead-8b, qwen3-synth, qwen3-synth-cpu, qwen3-text, qwen3-text-cpu")
        ("config", po::value(&config_file), "instead of --preset: the shape of a JSON config (an HF config.json of model_type qwen3 or hydrahead, or hydra's own config)")
        ("vocab", po::value(&vocab)->default_value(0), "the vocabulary size instead of the preset's or config's (a tokenizer's, e.g. from cluster/train_tokenizer.py; 0: theirs)")
        ("weight-seed", po::value(&seed)->default_value(0), "weight seed (same seed, same weights; the name every command uses)")
        ("seed", po::value(&old_seed), "not taken: the weight seed is --weight-seed")
        ("out", po::value(&out)->required(), "checkpoint to write (.h5), written atomically")
        ("dtype", po::value(&dtype)->default_value("f32"), "stored element type: f32 or bf16");
  }
  void validate() const {
    HYDRA_USER_CHECK(old_seed.empty(), "--seed is not taken here: the weight seed is --weight-seed (the same name in "
                     "every command)");
    HYDRA_USER_CHECK(preset.empty() != config_file.empty(), "give one of --preset NAME or --config FILE.json");
    HYDRA_USER_CHECK(vocab >= 0, "--vocab must be a vocabulary size (got {})", vocab);
    shape_config(preset, config_file, vocab);
    HYDRA_USER_CHECK(dtype == "f32" || dtype == "bf16", "--dtype must be f32 or bf16 (got '{}')", dtype);
    require_writable_destination(out, "checkpoint");
  }
};

}  // namespace

int run_init(App& app, const std::vector<std::string>& args) {
  InitOptions opt;
  po::options_description desc("hydra init");
  opt.bind(desc);
  if (!parse_command_line(app, "init", "(--preset NAME | --config FILE.json) [--vocab N] [--weight-seed N] --out FILE.h5 [--dtype f32|bf16]", desc, args)) return 0;
  opt.validate();
  agree_on_run(app, {});
  if (app.world.rank() != 0) return 0;  // one writer
  const ModelConfig config = shape_config(opt.preset, opt.config_file, opt.vocab);
  const DType dtype = opt.dtype == "bf16" ? DType::bf16 : DType::f32;
  // Streamed: one tensor in memory at a time, so the 1.7B presets need no 8 GB of host memory.
  AtomicFile out(opt.out);
  H5File file = H5File::create(out.temp_path());
  file.set_attribute("format", std::string(kCheckpointFormat));
  file.set_attribute("format_version", kCheckpointVersion);
  file.set_attribute("config", config_to_json(config).dump());
  for (const ParamSpec& spec : parameter_specs(config)) {
    Tensor t = Tensor::empty(spec.shape, DType::f32);
    init_parameter(spec, opt.seed, t);
    file.write(spec.name, dtype == DType::f32 ? t : to(t, Device::host, dtype));
  }
  file.close();
  out.commit();
  log::info("wrote {} ({}, vocabulary {}, {} parameters, {}, seed {})", opt.out,
            opt.preset.empty() ? opt.config_file : opt.preset, config.vocab_size, parameter_count(config), dtype_name(dtype),
            opt.seed);
  return 0;
}

}  // namespace hydra
