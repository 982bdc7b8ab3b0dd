// hydra import: a Hugging Face folder (a Qwen3 checkpoint, or a `hydra export` of a teacher or a
// hybrid) to a hydra checkpoint.
#include "launch/cli.h"
#include "launch/model_source.h"
#include "model/nonfinite.h"
#include "model/hf_import.h"
#include "model/params.h"
#include "runtime/atomic_file.h"
#include "runtime/log.h"

namespace hydra {
namespace {

struct ImportOptions {
  std::string hf_dir;
  std::string out;
  std::string dtype = "f32";
  bool allow_nonfinite = false;

  void bind(po::options_description& o) {
    o.add_options()
        ("hf", po::value(&hf_dir)->required(), "HF folder (config.json + *.safetensors, sharded or not): a Qwen3 checkpoint or a hydra export (qwen3 or hydrahead)")
        ("out", po::value(&out)->required(), "checkpoint to write (.h5), written atomically")
        ("dtype", po::value(&dtype)->default_value("f32"), "stored element type: f32 or bf16");
    ModelSource::bind_allow_nonfinite(o, &allow_nonfinite);
  }
  void validate() const {
    HYDRA_USER_CHECK(dtype == "f32" || dtype == "bf16", "--dtype must be f32 or bf16 (got '{}')", dtype);
    require_writable_destination(out, "checkpoint");
  }
};

}  // namespace

int run_import(App& app, const std::vector<std::string>& args) {
  ImportOptions opt;
  po::options_description desc("hydra import");
  opt.bind(desc);
  if (!parse_command_line(app, "import", "--hf DIR --out FILE.h5 [--dtype f32|bf16] [--allow-nonfinite]", desc, args)) return 0;
  opt.validate();
  agree_on_run(app, {});
  if (app.world.rank() != 0) return 0;
  LoadedCheckpoint ck = import_hf_checkpoint(opt.hf_dir);
  // What every later command refuses is refused here, before it is written (model/nonfinite.h).
  if (!opt.allow_nonfinite) check_finite_parameters(ck.params, opt.hf_dir);
  if (opt.dtype == "bf16") {
    for (auto& [name, t] : ck.params) t = to(t, Device::host, DType::bf16);
  }
  write_model_checkpoint(opt.out, ck.config, ck.params);
  log::info("imported {} -> {}: {}", opt.hf_dir, opt.out, ck.config.summary());
  return 0;
}

}  // namespace hydra
