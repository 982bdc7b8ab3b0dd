// hydra: the HydraHead runtime's one executable.
//
// Every process initialises MPI (a process started without mpirun is a world of one), runs the
// subcommand, and on any error prints one line and ends the whole job: with several ranks through
// MPI_Abort, so no rank is left waiting in a collective for a rank that failed.
// Exit codes: 0 success, 2 bad input (UserError), 1 internal failure.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <thread>
#include <string>
#include <vector>

#include "kernels/matmul/matmul.h"
#include "launch/cli.h"
#include "runtime/log.h"

namespace {

void print_usage() {
  std::cout << "usage: hydra <command> [options]   (hydra <command> --help for its options)\n\ncommands:\n";
  for (const auto& c : hydra::subcommands()) std::printf("  %-14s %s\n", c.name.c_str(), c.summary.c_str());
  std::cout << "\nUnder mpirun every command runs sequence-parallel over the ranks; rank 0 writes outputs.\n";
}

int dispatch(hydra::App& app, int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h" || std::string(argv[1]) == "help") {
    if (app.world.rank() == 0) print_usage();
    return argc < 2 ? 2 : 0;
  }
  const std::string name = argv[1];
  for (const auto& c : hydra::subcommands()) {
    if (c.name == name) return c.run(app, std::vector<std::string>(argv + 2, argv + argc));
  }
  HYDRA_USER_FAIL("unknown command '{}' (run hydra --help for the list)", name);
}

}  // namespace

int main(int argc, char** argv) {
  hydra::MpiRuntime mpi(&argc, &argv);
  hydra::MpiCommunicator world;
  hydra::log::set_rank(world.rank(), world.size());
  // CPU path: share the node's cores among its ranks unless the user chose (OPENBLAS_NUM_THREADS).
  if (!std::getenv("OPENBLAS_NUM_THREADS")) {
    const int cores = static_cast<int>(std::thread::hardware_concurrency());
    hydra::ops::set_cpu_threads(std::max(1, cores / std::max(1, mpi.local_size())));
  }
  hydra::App app{mpi, world};
  int code = 0;
  std::string message;
  try {
    code = dispatch(app, argc, argv);
  } catch (const hydra::UserError& e) {
    message = std::string("error") + (world.size() > 1 ? " (rank " + std::to_string(world.rank()) + ")" : "") + ": " + e.what();
    code = 2;
  } catch (const std::exception& e) {
    message = std::string("internal error") + (world.size() > 1 ? " (rank " + std::to_string(world.rank()) + ")" : "") +
              ": " + e.what();
    code = 1;
  }
  if (code != 0) {
    // Bad input usually fails on every rank at once (they all read the same flags and files): rank 0
    // reports at once and its abort ends the others before they print the same line. Another rank
    // waits a moment first, so its line appears only when rank 0 did not fail (an error of its own).
    if (world.rank() != 0) std::this_thread::sleep_for(std::chrono::milliseconds(500));
    std::fprintf(stderr, "hydra: %s\n", message.c_str());
    std::fflush(stderr);
  }
  if (code != 0 && world.size() > 1) world.abort(code);  // never returns: ends every rank
  return code;
}
