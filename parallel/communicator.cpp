#include "parallel/communicator.h"

namespace hydra {

void all_reduce_sum_host(Communicator& comm, const Tensor& buffer) {
  HYDRA_ASSERT(buffer.device() == Device::host, "all_reduce_sum_host of a device buffer");
  if (comm.device() == Device::host) {
    comm.all_reduce_sum(buffer);
    return;
  }
  Tensor staged = to_device(buffer, comm.device());
  comm.all_reduce_sum(staged);
  copy_into(buffer, staged);
}

}  // namespace hydra
