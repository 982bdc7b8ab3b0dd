// hydra info: what a checkpoint holds.
#include <filesystem>
#include <iostream>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "launch/cli.h"
#include "model/model.h"
#include "model/params.h"

namespace hydra {

int run_info(App& app, const std::vector<std::string>& args) {
  std::string path;
  bool tensors = false;
  po::options_description desc("hydra info");
  desc.add_options()
      ("model", po::value(&path)->required(), "checkpoint (.h5); may also be given as the first argument")
      ("tensors", po::bool_switch(&tensors), "list every tensor with its shape and type");
  po::positional_options_description positional;
  positional.add("model", 1);
  if (!parse_command_line(app, "info", "FILE.h5 [--tensors]", desc, args, &positional)) return 0;
  agree_on_run(app, {});
  if (app.world.rank() != 0) return 0;
  CheckpointReader reader(path);
  const ModelConfig config = read_model_config(path);
  // The file format is the same for every model; what it holds is a Qwen3 teacher or a HydraHead model.
  std::cout << path << ": " << (config.is_hydra() ? "HydraHead model" : "Qwen3 teacher") << " (" << kCheckpointFormat
            << " v" << reader.format_version() << "), " << std::filesystem::file_size(path) / 1e6 << " MB\n";
  std::cout << "  " << config.summary() << "\n";
  std::cout << fmt::format("  rms_norm_eps {}, rope_theta {}", config.rms_norm_eps, config.rope_theta);
  if (config.is_hydra()) std::cout << fmt::format(", fa_log_base {}, conv_kernel {}", config.fa_log_base, config.conv_kernel);
  std::cout << "\n";
  if (config.is_hydra()) {
    for (int64_t l = 0; l < config.num_layers; ++l) {
      std::cout << fmt::format("  layer {:>3}: FA heads [{}], {} GDN heads\n", l,
                               fmt::join(config.fa_heads_of(l), ", "), config.gdn_heads_of(l).size());
    }
  }
  int64_t stored = 0;
  std::map<DType, int64_t> by_type;
  for (const std::string& name : reader.names()) {
    const DatasetInfo info = reader.info(name);
    int64_t n = 1;
    for (int64_t s : info.shape) n *= s;
    stored += n;
    by_type[info.dtype] += n;
    if (tensors) {
      std::cout << fmt::format("  {:<56} {:<16} {}\n", name, format_shape(info.shape), dtype_name(info.dtype));
    }
  }
  std::cout << fmt::format("  {} tensors, {} parameters (config expects {})", reader.names().size(), stored,
                           parameter_count(config));
  for (const auto& [t, n] : by_type) std::cout << fmt::format(", {} {}", n, dtype_name(t));
  std::cout << "\n";
  return 0;
}

}  // namespace hydra
