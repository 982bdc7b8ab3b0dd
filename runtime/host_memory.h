// Host memory facts for memory plans and reports: what this process has used at its peak, and how
// much it may still use. The CUDA counterparts are in runtime/cuda_memory.h.
#pragma once

#include <cstddef>

namespace hydra {

// This process's peak resident memory (getrusage ru_maxrss), GiB.
double host_peak_memory_gib();

// How much host memory this process may still use, bytes: the kernel's MemAvailable (free memory
// plus what it can reclaim), capped by the cgroup limit a container or Slurm job runs under (cgroup
// v2 memory.max − memory.current, or v1 memory.limit_in_bytes − memory.usage_in_bytes). Used by the
// memory plans (model/cost.h) and by the message of a failed allocation.
double host_available_bytes();

// Bytes held by live host tensors (runtime/tensor.h allocate_storage, 64-byte rounded) and their
// high-water mark since the last reset: the host counterpart of cuda_memory_stats(), which the
// memory plans (model/memory_plan.h) are checked against on the CPU path. Process-wide.
struct HostTensorStats {
  size_t in_use = 0;
  size_t peak = 0;
  size_t allocations = 0;  // blocks handed out since the process started (never reset)
};
HostTensorStats host_tensor_stats();
void host_tensor_reset_peak();
// Called by allocate_storage for every host block it hands out and frees.
void note_host_allocation(size_t bytes);
void note_host_free(size_t bytes);

}  // namespace hydra
