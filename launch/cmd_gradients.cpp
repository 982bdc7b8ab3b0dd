// hydra gradients: the mean next-token loss of a token sequence and the gradient of every
// parameter, named as in the checkpoint — how a user (and a test) checks gradients from outside.
// Sequence parallel under mpirun (each rank its zigzag share, gradients summed over the ranks);
// rank 0 writes GRADS.h5: root attributes `loss` (mean next-token cross-entropy), `tokens` (the
// predictions it averages: T − 1), `model`; one float32 dataset per parameter.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>

#include <nlohmann/json.hpp>

#include "launch/cli.h"
#include "launch/model_source.h"
#include "model/nonfinite.h"
#include "model/sequence_length.h"
#include "model/train/objective.h"
#include "parallel/device_world.h"
#include "runtime/atomic_file.h"
#include "runtime/hdf5_file.h"
#include "runtime/log.h"
#include "runtime/token_file.h"

namespace hydra {
namespace {

struct GradientsOptions {
  ModelSource model;
  std::string input;
  std::string loss = "ce";
  std::string out;
  std::string device = "auto";
  double nccl_timeout = 600;

  void bind(po::options_description& o) {
    model.bind(o);
    o.add_options()
        ("input", po::value(&input)->required(), "token file (.h5 with input_ids [T], int32/int64, T >= 2)")
        ("loss", po::value(&loss)->default_value("ce"), "ce: mean next-token cross-entropy (the only loss with no teacher)")
        ("out", po::value(&out)->required(), "gradient file to write (.h5; attribute loss, one float32 dataset per parameter)")
        ("device", po::value(&device)->default_value("auto"), "cpu (fp32, the reference), cuda (bf16 weights, fp32 gradients) or auto (cuda when a GPU is present)")
        ("nccl-timeout", po::value(&nccl_timeout)->default_value(600), "seconds before a stuck NCCL operation ends the job");
  }
  void validate() const {
    model.validate();
    HYDRA_USER_CHECK(loss == "ce", "--loss {} is not known (ce: next-token cross-entropy; distillation and alignment "
                     "need a teacher: use hydra train)", loss);
    require_readable_file(input, "input");
    require_writable_destination(out, "gradient output");
    require_not_an_input(out, {input, model.model_path}, "--out");
  }
};

}  // namespace

int run_gradients(App& app, const std::vector<std::string>& args) {
  GradientsOptions opt;
  po::options_description desc("hydra gradients");
  opt.bind(desc);
  if (!parse_command_line(app, "gradients",
                          "(--model FILE.h5 | --preset NAME) --input TOKENS.h5 [--loss ce] --out GRADS.h5 [--device cpu|cuda]",
                          desc, args)) {
    return 0;
  }
  opt.validate();
  ModelRun job = ModelRun::begin(app, opt.model, opt.device);  // config, device, the inputs' fingerprint
  const ModelConfig& config = job.config;
  const TokenData data = read_token_data(opt.input, config.vocab_size);
  const std::vector<int32_t>& ids = data.ids;
  HYDRA_USER_CHECK(ids.size() >= 2, "{}: holds {} token(s); next-token gradients need at least 2", opt.input, ids.size());
  HYDRA_USER_CHECK(data.loss_mask.empty() || std::count(data.loss_mask.begin() + 1, data.loss_mask.end(), 1) > 0,
                   "{}: its loss_mask counts no target (positions 1..{} are all 0): the mean loss is undefined",
                   opt.input, ids.size() - 1);
  check_sequence_length(config, static_cast<int64_t>(ids.size()), app.world.size());  // before any work
  RunFingerprint& inputs = job.inputs;
  inputs.add_tokens("input tokens", ids);
  add_file_datasets(inputs, "input", opt.input);  // loss_mask and document_offsets too
  ModelRun::Started ready = job.start(app, opt.model, opt.device, opt.nccl_timeout);
  DeviceWorld& world = ready.world;
  const Model& model = ready.model;
  const auto t1 = std::chrono::steady_clock::now();
  const train::NamedGradients g =
      train::next_token_gradients(*world.comm, model, ids, data.loss_mask, document_starts_of(data));
  check_device_progress(world);
  const auto t2 = std::chrono::steady_clock::now();
  const double loss = g.sums.loss / static_cast<double>(g.sums.tokens);
  // The loss is reduced over the ranks: every rank takes this branch together.
  if (!std::isfinite(loss)) fail_nonfinite(model, *world.comm, ids, "gradients: the mean next-token loss is");
  if (app.world.rank() == 0) {
    AtomicFile file(opt.out);
    H5File h5 = H5File::create(file.temp_path());
    h5.set_attribute("loss", loss);
    h5.set_attribute("tokens", g.sums.tokens);
    h5.set_attribute("model", opt.model.describe());
    for (const auto& [name, tensor] : g.grads) h5.write(name, tensor);
    h5.close();
    file.commit();
    const double load_s = ready.load_s;
    const double run_s = std::chrono::duration<double>(t2 - t1).count();
    log::info("gradients: {} tokens on {} rank(s) ({}), {} — mean next-token loss {:.6f}, {} gradient tensors in {:.2f} s",
              ids.size(), app.world.size(), device_name(world.device), config.summary(), loss, g.grads.size(), run_s);
    const nlohmann::json summary = {{"command", "gradients"}, {"model", opt.model.describe()},
                                    {"tokens", ids.size()},    {"ranks", app.world.size()},
                                    {"device", device_flag_name(world.device)}, {"loss", loss},
                                    {"load_s", load_s},        {"gradients_s", run_s},
                                    {"out", opt.out}};
    std::cout << summary.dump() << std::endl;
  }
  return 0;
}

}  // namespace hydra
