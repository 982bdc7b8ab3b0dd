#include "launch/cli.h"

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <sstream>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "model/config.h"
#include "runtime/content_hash.h"
#include "runtime/error.h"
#include "runtime/hdf5_file.h"
#include "runtime/token_identity.h"

namespace hydra {
namespace {

// An option's value as text, for the cross-rank comparison (the types the subcommands bind).
std::string option_text(const po::variable_value& v) {
  const boost::any& a = v.value();
  if (const auto* x = boost::any_cast<std::string>(&a)) return *x;
  if (const auto* x = boost::any_cast<bool>(&a)) return *x ? "true" : "false";
  if (const auto* x = boost::any_cast<int>(&a)) return std::to_string(*x);
  if (const auto* x = boost::any_cast<int64_t>(&a)) return std::to_string(*x);
  if (const auto* x = boost::any_cast<uint64_t>(&a)) return std::to_string(*x);
  if (const auto* x = boost::any_cast<double>(&a)) return fmt::format("{}", *x);
  if (const auto* x = boost::any_cast<std::vector<std::string>>(&a)) {
    std::string out;
    for (const std::string& e : *x) out += (out.empty() ? "" : ",") + e;
    return out;
  }
  HYDRA_ASSERT(false, "option of a type the agreement check cannot print ({})", a.type().name());
}

// Boost parses "-1" into a uint64_t option as 2^64 - 1: every unsigned option (seeds) refuses a
// negative value by the word the user typed.
void refuse_negative_unsigned(const po::parsed_options& parsed, const po::variables_map& vm) {
  for (const po::option& o : parsed.options) {
    const auto it = vm.find(o.string_key);
    if (it == vm.end() || boost::any_cast<uint64_t>(&it->second.value()) == nullptr) continue;
    for (const std::string& v : o.value) {
      HYDRA_USER_CHECK(v.find('-') == std::string::npos, "--{} must be a non-negative integer (got '{}')", o.string_key, v);
    }
  }
}

// The token files' identity cache (runtime/token_identity.h): $HYDRA_CACHE_DIR, else
// $XDG_CACHE_HOME/hydra, else ~/.cache/hydra (/tmp/.cache/hydra without a home).
std::string cache_dir_from_environment() {
  if (const char* dir = std::getenv("HYDRA_CACHE_DIR"); dir && *dir) return dir;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) return (std::filesystem::path(xdg) / "hydra").string();
  const char* home = std::getenv("HOME");
  return (std::filesystem::path(home && *home ? home : "/tmp") / ".cache" / "hydra").string();
}

}  // namespace

const std::vector<Subcommand>& subcommands() {
  static const std::vector<Subcommand> commands = {
      {"init", "write a randomly initialised model of a preset shape", run_init},
      {"import", "convert a Hugging Face folder (Qwen3, or a hydra export) to a hydra checkpoint", run_import},
      {"export", "write a checkpoint as a Hugging Face folder (config.json + safetensors) for PyTorch tools", run_export},
      {"info", "print a checkpoint's config and parameter summary", run_info},
      {"plan", "what fits where: per-rank training and prefill memory by part and the longest sequences on 1..N GPUs", run_plan},
      {"forward", "run the forward pass: mean next-token NLL, logits (CPU or GPU, sequence parallel under mpirun)", run_forward},
      {"convert", "convert a Qwen3 teacher into a HydraHead model (DESIGN.md §1.3)", run_convert},
      {"prefill", "timed long-context prefill (GPUs or CPU, sequence parallel under mpirun)", run_prefill},
      {"bench", "benchmark one kernel (gemm, attention, gdn, gdn-input, decode, attention-bwd, gdn-bwd) against the measured GEMM ceiling", run_bench},
      {"eval-niah", "needle-in-a-haystack accuracy by depth x length (sequence parallel under mpirun)", run_eval_niah},
      {"select-heads", "score a Qwen3 teacher's heads and choose the FA heads (DESIGN.md §1.4; jobs spread over ranks)",
       run_select_heads},
      {"gradients", "mean next-token loss and every parameter's gradient of a token sequence", run_gradients},
      {"train", "train a model: pretrain, align, distill or finetune (sequence/data parallel under mpirun)", run_train},
      {"eval-lm", "held-out next-token loss of a model over windows of token files", run_eval_lm},
      {"synth", "generate a synthetic token stream: retrieval tasks and a Markov language, mixed", run_synth},
      {"generate", "new tokens for prompts: sequence-parallel prefill, distributed KV/GDN cache, batched decode",
       run_generate},
  };
  return commands;
}

bool parse_command_line(App& app, const std::string& command, const std::string& usage,
                        po::options_description& options, const std::vector<std::string>& args,
                        const po::positional_options_description* positional) {
  // Switches are read once, at the command's start: here, the cache folder.
  set_token_identity_cache_dir(cache_dir_from_environment());
  options.add_options()("help,h", "print this help");
  po::variables_map vm;
  try {
    po::command_line_parser parser(args);
    parser.options(options);
    // Without positional arguments of its own, a command refuses any (a stray word is a mistake,
    // e.g. a path without its flag): boost only checks positionals against a description.
    const po::positional_options_description none;
    parser.positional(positional ? *positional : none);
    const po::parsed_options parsed = parser.run();
    po::store(parsed, vm);
    refuse_negative_unsigned(parsed, vm);
    if (vm.count("help")) {
      if (app.world.rank() == 0) {
        std::cout << "usage: hydra " << command << " " << usage << "\n\n" << options << std::flush;
      }
      return false;
    }
    po::notify(vm);
  } catch (const po::error& e) {
    HYDRA_USER_FAIL("hydra {}: {} (see hydra {} --help)", command, e.what(), command);
  }
  app.command = command;
  app.options.clear();
  for (const auto& [name, value] : vm) app.options.push_back(FingerprintField{"option --" + name, option_text(value)});
  return true;
}

void agree_on_run(App& app, const RunFingerprint& inputs) {
  RunFingerprint all;
  all.add("command", app.command);
  for (const FingerprintField& f : app.options) all.add(f.name, f.value);
  for (const FingerprintField& f : inputs.fields()) all.add(f.name, f.value);
  agree_across_ranks(app.world.inner(), all, fmt::format("what to run (hydra {})", app.command));
  app.world.open();
}

void add_file_datasets(RunFingerprint& fingerprint, const std::string& role, const std::string& path) {
  const H5File file = H5File::open_read(path);
  for (const std::string& name : file.dataset_names()) {
    std::string value;
    if (file.is_integer_vector(name)) {
      // Integer vectors (ids, offsets, masks of any width) by value: int32 and int64 ids agree.
      const std::vector<int64_t> v = file.read_integer_vector(name);
      value = fmt::format("{} integers, {}", v.size(), hash_hex(hash_bytes(v.data(), v.size() * sizeof(int64_t))));
    } else {
      const Tensor t = file.read(name);
      value = fmt::format("{} {}, {}", dtype_name(t.dtype()), fmt::join(t.shape(), "x"), hash_hex(hash_tensor(t)));
    }
    fingerprint.add(fmt::format("{} {}: {}", role, path, name), value);
  }
}

void add_model_fields(RunFingerprint& fingerprint, const std::string& name, const ModelConfig& config) {
  const nlohmann::json json = config_to_json(config);  // items() refers to it: keep it alive
  for (const auto& [key, value] : json.items()) fingerprint.add(name + " " + key, value.dump());
}

void add_model_fields(RunFingerprint& fingerprint, const ModelConfig& config, Device device, DType dtype) {
  add_model_fields(fingerprint, "model", config);
  fingerprint.add("device", std::string(device_name(device)));
  fingerprint.add("dtype", std::string(dtype_name(dtype)));
}

}  // namespace hydra
