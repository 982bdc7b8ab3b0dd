// Choosing where a rank runs: its GPU (one per rank, by local rank) and the communicator that
// matches the device of its tensors (NCCL for GPUs, MPI for CPU ranks). Subcommands and tests
// call this instead of knowing which backends the build has.
#pragma once

#include <memory>
#include <string>

#include "parallel/mpi_communicator.h"

namespace hydra {

struct DeviceWorld {
  Device device = Device::host;
  int gpu = -1;                                // CUDA ordinal of this rank, -1 on the CPU path
  std::unique_ptr<Communicator> owned;         // the NCCL communicator on GPUs
  Communicator* comm = nullptr;                // the communicator to use (owned or the MPI world)
};

// Which device a `--device` value means on this rank ("cuda", "cpu" or "auto": cuda when this build
// has it and a GPU is present), with the user checks of make_device_world but no communicator:
// cheap, so the ranks can agree on it before any collective (parallel/agreement.h).
Device resolve_device(const std::string& device, const MpiRuntime& mpi);

// `device`: "cuda", "cpu" or "auto" (cuda when this build has it and a GPU is present).
// On cuda: local rank r uses GPU r (UserError when a node has fewer GPUs than ranks), and an NCCL
// communicator is bootstrapped over `mpi_world` with `nccl_timeout_s` for hangs.
DeviceWorld make_device_world(const std::string& device, const MpiRuntime& mpi, Communicator& mpi_world,
                              double nccl_timeout_s = 600.0);

// Host synchronisation point that surfaces NCCL errors and timeouts (no-op on the CPU path).
void check_device_progress(DeviceWorld& world);

}  // namespace hydra
