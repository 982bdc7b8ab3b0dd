// hydra: the HydraHead runtime's one executable.
//
// Every process initialises MPI (a process started without mpirun is a world of one), runs the
// subcommand, and on any error prints one line and ends the whole job: with several ranks through
// MPI_Abort, so no rank is left waiting in a collective for a rank that failed.
// Exit codes: 0 success, 2 bad input (UserError; also running out of memory), 1 internal failure;
// a process ended by SIGTERM/SIGINT/SIGHUP first removes its temporary files (runtime/atomic_file.h).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <thread>
#include <string>
#include <vector>

#include "kernels/matmul/matmul.h"
#include "kernels/small_rows.h"
#include "launch/cli.h"
#include "launch/kernel_options.h"
#include "runtime/atomic_file.h"
#include "runtime/stop_request.h"
#include "runtime/fault.h"
#include "runtime/log.h"

namespace {

void print_usage() {
  std::cout << "usage: hydra <command> [options]   (hydra <command> --help for its options; hydra --version)\n\n"
               "commands:\n";
  for (const auto& c : hydra::subcommands()) std::printf("  %-14s %s\n", c.name.c_str(), c.summary.c_str());
  std::cout << "\nUnder mpirun every command runs sequence-parallel over the ranks; rank 0 writes outputs. Every rank\n"
               "must get the same command line and the same file contents: the ranks check this before they start.\n";
}

int dispatch(hydra::App& app, int argc, char** argv) {
  if (argc >= 2 && (std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h" || std::string(argv[1]) == "help")) {
    if (app.world.rank() == 0) print_usage();
    return 0;
  }
  if (argc >= 2 && std::string(argv[1]) == "--version") {
    if (app.world.rank() == 0) std::printf("hydra %s (%s build)\n", HYDRA_VERSION, HYDRA_CUDA ? "CUDA" : "CPU-only");
    return 0;
  }
  if (argc < 2) {
    if (app.world.rank() == 0) print_usage();
    HYDRA_USER_FAIL("no command given (the commands are listed above)");
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
  hydra::MpiCommunicator mpi_world;
  // Collectives wait for the ranks' agreement on what they run (launch/cli.h agree_on_run).
  hydra::AgreementGate world(mpi_world);
  hydra::log::set_rank(world.rank(), world.size());
  // After MPI_Init, so these are the handlers in force: SIGTERM/SIGINT/SIGHUP remove temporaries.
  hydra::install_cleanup_handlers();
  // CPU path: share the node's cores among its ranks unless the user chose (OPENBLAS_NUM_THREADS).
  if (!std::getenv("OPENBLAS_NUM_THREADS")) {
    const int cores = static_cast<int>(std::thread::hardware_concurrency());
    hydra::ops::set_cpu_threads(std::max(1, cores / std::max(1, mpi.local_size())));
  }
  hydra::App app{mpi, world, {}, {}, {}, argc > 0 && argv[0] ? argv[0] : "hydra", {}};
  int code = 0;
  std::string message;
  try {
    hydra::check_fault_spec(world.size());
    app.kernels = hydra::kernel_options_from_environment();  // a bad value is refused before any work
    app.gpu_sharing = hydra::gpu_sharing_from_environment();
    // The small-row kernels' switch reaches the ops through this per-thread scope, open for the
    // whole command (kernels/small_rows.h: the losses are called where no kernel options are passed).
    const hydra::ops::SmallRowKernelsScope small_rows(app.kernels.small_rows);
    code = dispatch(app, argc, argv);
  } catch (const hydra::UserError& e) {
    message = std::string("error") + (world.size() > 1 ? " (rank " + std::to_string(world.rank()) + ")" : "") + ": " + e.what();
    code = 2;
  } catch (const std::bad_alloc&) {
    // Allocations the runtime sizes itself go through Tensor (a UserError with the size); this is
    // what remains: a container's allocation on a host with too little memory.
    std::fprintf(stderr, "hydra: error%s: out of host memory (std::bad_alloc) on %s: use more ranks, fewer ranks "
                 "per node or a shorter input\n",
                 world.size() > 1 ? (" (rank " + std::to_string(world.rank()) + ")").c_str() : "",
                 hydra::describe_location().c_str());
    code = 2;
  } catch (const std::exception& e) {
    message = std::string("internal error") + (world.size() > 1 ? " (rank " + std::to_string(world.rank()) + ")" : "") +
              ": " + e.what();
    code = 1;
  }
  // A training run stopped by a signal (runtime/stop_request.h) saved its state on every rank and
  // returns its own status: no error message, no abort.
  if (code != 0 && code != hydra::kExitStoppedBySignal) {
    // Bad input usually fails on every rank at once (they all read the same flags and files): rank 0
    // reports at once and its abort ends the others before they print the same line. Another rank
    // waits a moment first, so its line appears only when rank 0 did not fail (an error of its own).
    if (world.rank() != 0) std::this_thread::sleep_for(std::chrono::milliseconds(500));
    std::fprintf(stderr, "hydra: %s\n", message.c_str());
    std::fflush(stderr);
  }
  if (code != 0 && code != hydra::kExitStoppedBySignal && world.size() > 1) world.abort(code);  // never returns: ends every rank
  return code;
}
