// Host memory facts for memory plans and reports: what this process has used at its peak, and how
// much it may still use. The CUDA counterparts are in runtime/cuda_memory.h.
#pragma once

namespace hydra {

// This process's peak resident memory (getrusage ru_maxrss), GiB.
double host_peak_memory_gib();

// How much host memory this process may still use, bytes: the kernel's MemAvailable (free memory
// plus what it can reclaim), capped by the cgroup limit a container or Slurm job runs under (cgroup
// v2 memory.max − memory.current, or v1 memory.limit_in_bytes − memory.usage_in_bytes). Used by the
// memory plans (model/cost.h) and by the message of a failed allocation.
double host_available_bytes();

}  // namespace hydra
