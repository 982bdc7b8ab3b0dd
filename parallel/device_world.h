// Choosing where a rank runs: its GPU and the communicator that matches the device of its tensors
// (NCCL for GPUs, MPI for CPU ranks). Subcommands and tests call this instead of knowing which
// backends the build has.
//
// One rank per GPU is the production layout: local rank r uses GPU r and NCCL connects the ranks.
// For testing the multi-rank GPU paths on a machine with fewer GPUs than ranks, GpuSharing::allowed
// (HYDRA_SHARE_GPUS=1, read once in launch/) deals the node's ranks to its GPUs round-robin (local
// rank r uses GPU r mod G) and connects every rank of the job by host-staged MPI
// (parallel/staged_communicator.h) instead of NCCL, which refuses two ranks on one device. Without
// it, more ranks than GPUs is refused and the message names the opt-in.
#pragma once

#include <memory>
#include <string>

#include "parallel/mpi_communicator.h"

namespace hydra {

enum class GpuSharing { one_rank_per_gpu, allowed };

struct DeviceWorld {
  Device device = Device::host;
  int gpu = -1;                                // CUDA ordinal of this rank, -1 on the CPU path
  int ranks_on_gpu = 0;                        // ranks of this node dealt to that GPU (1 without sharing)
  bool shared_gpus = false;                    // some node runs more ranks than GPUs: staged MPI, not NCCL
  std::unique_ptr<Communicator> owned;         // the device communicator (NCCL or staged) on GPUs
  Communicator* comm = nullptr;                // the communicator to use (owned or the MPI world)
};

// Which device a `--device` value means on this rank ("cuda", "cpu" or "auto": cuda when this build
// has it and a GPU is present), with the user checks of make_device_world but no communicator:
// cheap, so the ranks can agree on it before any collective (parallel/agreement.h). On cuda it also
// binds this rank to its GPU (gpu_of_rank), so the free memory a plan is checked against is that GPU's.
Device resolve_device(const std::string& device, const MpiRuntime& mpi, GpuSharing sharing);

// The GPU of local rank `local_rank` among `gpus` (round-robin), and how many of `local_size` ranks
// share it.
inline int gpu_of_rank(int local_rank, int gpus) { return local_rank % gpus; }
int ranks_sharing_gpu(int local_rank, int local_size, int gpus);

// `device`: as resolve_device. On cuda: this rank's GPU and a device communicator over `mpi_world`
// (collective): NCCL when every node runs at most one rank per GPU, else (GpuSharing::allowed only)
// host-staged MPI for every rank, with a log line saying speed figures then mean nothing.
// `timeout_s` bounds a hung collective either way.
DeviceWorld make_device_world(const std::string& device, const MpiRuntime& mpi, Communicator& mpi_world,
                              GpuSharing sharing, double timeout_s = 600.0);

// Host synchronisation point that surfaces device-communicator errors and hangs (no-op on the CPU
// path): Communicator::check_progress of the world's communicator.
void check_device_progress(DeviceWorld& world);

}  // namespace hydra
