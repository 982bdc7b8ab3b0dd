// The `hydra` command line: one executable, one subcommand per job kind.
//
// Each subcommand has an options struct with defaults, a bind() that declares its
// Boost.Program_options flags with the help text on the same line, and validate() that runs right
// after parsing, before any file is read. `hydra <command> --help` prints the flags.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <boost/program_options.hpp>

#include "kernels/kernel_options.h"
#include "parallel/agreement.h"
#include "parallel/device_world.h"
#include "parallel/mpi_communicator.h"

namespace hydra {

namespace po = boost::program_options;
struct ModelConfig;

// What every subcommand gets: the MPI world (world size 1 without mpirun), whose collectives are
// refused until the ranks have agreed on what they run (agree_on_run), and the command line as
// parsed (filled in by parse_command_line), and the kernel options the environment set (read once
// at start-up, launch/kernel_options.h): every model a command builds runs with them; likewise
// whether ranks may share a GPU (HYDRA_SHARE_GPUS).
struct App {
  MpiRuntime& mpi;
  AgreementGate& world;
  std::string command;
  std::vector<FingerprintField> options;  // every option's value as text, defaults included
  ops::KernelOptions kernels;
  std::string binary = "hydra";  // argv[0]: the executable as it was started (the lines printed to run it again)
  GpuSharing gpu_sharing = GpuSharing::one_rank_per_gpu;  // HYDRA_SHARE_GPUS=1 (parallel/device_world.h)
};

struct Subcommand {
  std::string name;
  std::string summary;
  std::function<int(App&, const std::vector<std::string>&)> run;
};

const std::vector<Subcommand>& subcommands();

// Parses `args` against `options`. Prints usage and returns false for --help (rank 0 prints).
// Unknown flags and bad values become UserErrors naming the flag.
bool parse_command_line(App& app, const std::string& command, const std::string& usage,
                        po::options_description& options, const std::vector<std::string>& args,
                        const po::positional_options_description* positional = nullptr);

// The shared setup step of every subcommand, once its inputs are read and before its first
// collective: the ranks compare the command, its options (as parsed, defaults included) and
// `inputs` (what the command read: model configs, dtype and device, token counts and hashes), and a
// difference is a UserError on every rank naming the two ranks and the field (parallel/agreement.h).
// Opens app.world for collectives.
void agree_on_run(App& app, const RunFingerprint& inputs);
// Adds the contents of every root dataset of HDF5 file `path` to a fingerprint, one field per
// dataset ("ROLE PATH: DATASET" = dtype, shape and XXH3 of its values): the values, not the file's
// bytes, so two copies written at different times (HDF5 stores timestamps) agree, and a stale
// prompt_offsets, loss_mask or document_offsets on one node is named before any work.
void add_file_datasets(RunFingerprint& fingerprint, const std::string& role, const std::string& path);
// Adds a model config to a fingerprint field by field ("NAME arch", "NAME fa_heads", ...).
void add_model_fields(RunFingerprint& fingerprint, const std::string& name, const ModelConfig& config);
// The model's config, and the device and dtype the command places it in.
void add_model_fields(RunFingerprint& fingerprint, const ModelConfig& config, Device device, DType dtype);

// A device as its --device flag names it ("cpu", "cuda"): the word outputs report.
inline const char* device_flag_name(Device d) { return d == Device::cuda ? "cuda" : "cpu"; }

// Subcommand entry points (launch/cmd_*.cpp).
int run_init(App& app, const std::vector<std::string>& args);
int run_import(App& app, const std::vector<std::string>& args);
int run_export(App& app, const std::vector<std::string>& args);
int run_info(App& app, const std::vector<std::string>& args);
int run_plan(App& app, const std::vector<std::string>& args);
int run_forward(App& app, const std::vector<std::string>& args);
int run_convert(App& app, const std::vector<std::string>& args);
int run_prefill(App& app, const std::vector<std::string>& args);
int run_bench(App& app, const std::vector<std::string>& args);
int run_eval_niah(App& app, const std::vector<std::string>& args);
int run_select_heads(App& app, const std::vector<std::string>& args);
int run_gradients(App& app, const std::vector<std::string>& args);
int run_train(App& app, const std::vector<std::string>& args);
int run_eval_lm(App& app, const std::vector<std::string>& args);
int run_synth(App& app, const std::vector<std::string>& args);
int run_generate(App& app, const std::vector<std::string>& args);

}  // namespace hydra
