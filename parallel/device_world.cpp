#include "parallel/device_world.h"

#if HYDRA_CUDA
#include "parallel/nccl_communicator.h"
#include "runtime/cuda_memory.h"
#endif

namespace hydra {

Device resolve_device(const std::string& device, const MpiRuntime& mpi) {
  HYDRA_USER_CHECK(device == "cuda" || device == "cpu" || device == "auto",
                   "--device must be cuda, cpu or auto (got '{}')", device);
#if HYDRA_CUDA
  const int gpus = cuda_device_count();
  const bool use_cuda = device == "cuda" || (device == "auto" && gpus > 0);
  if (!use_cuda) return Device::host;
  HYDRA_USER_CHECK(gpus > 0, "--device cuda: no CUDA device is visible on {}", error_context().host);
  HYDRA_USER_CHECK(mpi.local_rank() < gpus,
                   "--device cuda: {} ranks on host {} but only {} GPUs (one rank per GPU; launch with -np <= GPUs "
                   "per node)", mpi.local_size(), error_context().host, gpus);
  return Device::cuda;
#else
  (void)mpi;
  HYDRA_USER_CHECK(device != "cuda", "--device cuda: this hydra was built without CUDA (HYDRA_CUDA=OFF)");
  return Device::host;
#endif
}

DeviceWorld make_device_world(const std::string& device, const MpiRuntime& mpi, Communicator& mpi_world,
                              double nccl_timeout_s) {
  DeviceWorld w;
  w.comm = &mpi_world;
  w.device = resolve_device(device, mpi);
#if HYDRA_CUDA
  if (w.device != Device::cuda) return w;
  w.gpu = mpi.local_rank();
  cuda_set_device(w.gpu);
  w.owned = std::make_unique<NcclCommunicator>(mpi_world, nccl_timeout_s);
  w.comm = w.owned.get();
#else
  (void)nccl_timeout_s;
#endif
  return w;
}

void check_device_progress(DeviceWorld& world) {
#if HYDRA_CUDA
  if (world.device == Device::cuda) static_cast<NcclCommunicator*>(world.owned.get())->check_progress();
#else
  (void)world;
#endif
}

}  // namespace hydra
