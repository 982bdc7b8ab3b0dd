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

#include "parallel/mpi_communicator.h"

namespace hydra {

namespace po = boost::program_options;

// What every subcommand gets: the MPI world (world size 1 without mpirun).
struct App {
  MpiRuntime& mpi;
  Communicator& world;
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

// Subcommand entry points (launch/cmd_*.cpp).
int run_init(App& app, const std::vector<std::string>& args);
int run_import(App& app, const std::vector<std::string>& args);
int run_info(App& app, const std::vector<std::string>& args);
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

}  // namespace hydra
