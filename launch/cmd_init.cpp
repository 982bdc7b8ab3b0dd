// hydra init: a model of a preset shape with random weights, written as a checkpoint.
#include <nlohmann/json.hpp>

#include "launch/cli.h"
#include "model/params.h"
#include "runtime/atomic_file.h"
#include "runtime/checkpoint.h"
#include "runtime/log.h"

namespace hydra {
namespace {

struct InitOptions {
  std::string preset;
  uint64_t seed = 0;
  std::string old_seed;
  std::string out;
  std::string dtype = "f32";

  void bind(po::options_description& o) {
    o.add_options()
        ("preset", po::value(&preset)->required(), "shape: qwen3-tiny, hydrahead-tiny, qwen3-1.7b, hydrahead-1.7b, qwen3-4b, hydrahead-4b, qwen3-8b, hydrahead-8b, qwen3-synth, qwen3-synth-cpu, qwen3-text, qwen3-text-cpu")
        ("weight-seed", po::value(&seed)->default_value(0), "weight seed (same seed, same weights; the name every command uses)")
        ("seed", po::value(&old_seed), "not taken: the weight seed is --weight-seed")
        ("out", po::value(&out)->required(), "checkpoint to write (.h5), written atomically")
        ("dtype", po::value(&dtype)->default_value("f32"), "stored element type: f32 or bf16");
  }
  void validate() const {
    HYDRA_USER_CHECK(old_seed.empty(), "--seed is not taken here: the weight seed is --weight-seed (the same name in "
                     "every command)");
    preset_config(preset);
    HYDRA_USER_CHECK(dtype == "f32" || dtype == "bf16", "--dtype must be f32 or bf16 (got '{}')", dtype);
    require_writable_destination(out, "checkpoint");
  }
};

}  // namespace

int run_init(App& app, const std::vector<std::string>& args) {
  InitOptions opt;
  po::options_description desc("hydra init");
  opt.bind(desc);
  if (!parse_command_line(app, "init", "--preset NAME [--weight-seed N] --out FILE.h5 [--dtype f32|bf16]", desc, args)) return 0;
  opt.validate();
  agree_on_run(app, {});
  if (app.world.rank() != 0) return 0;  // one writer
  const ModelConfig config = preset_config(opt.preset);
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
  log::info("wrote {} ({}, {} parameters, {}, seed {})", opt.out, opt.preset, parameter_count(config),
            dtype_name(dtype), opt.seed);
  return 0;
}

}  // namespace hydra
