// How much host memory this process may still use: the kernel's MemAvailable (free memory plus what
// it can reclaim), capped by the cgroup limit a container or Slurm job runs under (cgroup v2
// memory.max − memory.current, or v1 memory.limit_in_bytes − memory.usage_in_bytes). Used by the
// memory plans (model/cost.h) and by the message of a failed allocation.
#pragma once

namespace hydra {

double host_available_bytes();

}  // namespace hydra
