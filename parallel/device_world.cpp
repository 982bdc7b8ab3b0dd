#include "parallel/device_world.h"

#include "parallel/staged_communicator.h"
#include "runtime/log.h"

#if HYDRA_CUDA
#include "parallel/nccl_communicator.h"
#include "runtime/cuda_memory.h"
#endif

namespace hydra {

int ranks_sharing_gpu(int local_rank, int local_size, int gpus) {
  const int mine = gpu_of_rank(local_rank, gpus);
  int n = 0;
  for (int r = 0; r < local_size; ++r) n += gpu_of_rank(r, gpus) == mine ? 1 : 0;
  return n;
}

Device resolve_device(const std::string& device, const MpiRuntime& mpi, GpuSharing sharing) {
  HYDRA_USER_CHECK(device == "cuda" || device == "cpu" || device == "auto",
                   "--device must be cuda, cpu or auto (got '{}')", device);
#if HYDRA_CUDA
  const int gpus = cuda_device_count();
  const bool use_cuda = device == "cuda" || (device == "auto" && gpus > 0);
  if (!use_cuda) return Device::host;
  HYDRA_USER_CHECK(gpus > 0, "--device cuda: no CUDA device is visible on {}", error_context().host);
  HYDRA_USER_CHECK(mpi.local_rank() < gpus || sharing == GpuSharing::allowed,
                   "--device cuda: {} ranks on host {} but only {} GPUs (one rank per GPU; launch with -np <= GPUs "
                   "per node, or set HYDRA_SHARE_GPUS=1 to let ranks share GPUs for testing)",
                   mpi.local_size(), error_context().host, gpus);
  cuda_set_device(gpu_of_rank(mpi.local_rank(), gpus));
  return Device::cuda;
#else
  (void)mpi;
  (void)sharing;
  HYDRA_USER_CHECK(device != "cuda", "--device cuda: this hydra was built without CUDA (HYDRA_CUDA=OFF)");
  return Device::host;
#endif
}

DeviceWorld make_device_world(const std::string& device, const MpiRuntime& mpi, Communicator& mpi_world,
                              GpuSharing sharing, double timeout_s) {
  DeviceWorld w;
  w.comm = &mpi_world;
  w.device = resolve_device(device, mpi, sharing);
#if HYDRA_CUDA
  if (w.device != Device::cuda) return w;
  const int gpus = cuda_device_count();
  w.gpu = gpu_of_rank(mpi.local_rank(), gpus);
  w.ranks_on_gpu = ranks_sharing_gpu(mpi.local_rank(), mpi.local_size(), gpus);
  // Every rank of the job must pick the same communicator: NCCL only when no node is crowded.
  Tensor crowded = Tensor::empty({1}, DType::i32);
  crowded.data_as<int32_t>()[0] = mpi.local_size() > gpus ? 1 : 0;
  mpi_world.all_reduce_sum(crowded);
  w.shared_gpus = crowded.data_as<int32_t>()[0] > 0;
  if (w.shared_gpus) {
    w.owned = StagedCommunicator::over(mpi_world, Device::cuda, timeout_s);
    log::info("ranks share GPUs (HYDRA_SHARE_GPUS=1): {} ranks on this host's {} GPU(s), {} on GPU {}; host-staged MPI "
              "replaces NCCL, so speed figures from this run mean nothing", mpi.local_size(), gpus, w.ranks_on_gpu, w.gpu);
  } else {
    w.owned = std::make_unique<NcclCommunicator>(mpi_world, timeout_s);
  }
  w.comm = w.owned.get();
#else
  (void)timeout_s;
#endif
  return w;
}

void check_device_progress(DeviceWorld& world) { world.comm->check_progress(); }

}  // namespace hydra
