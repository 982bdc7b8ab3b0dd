// Host memory facts for memory plans and reports: what this process has used at its peak, and what
// the host has available now. The CUDA counterparts are in runtime/cuda_memory.h.
#pragma once

namespace hydra {

// This process's peak resident memory (getrusage ru_maxrss), GiB.
double host_peak_memory_gib();
// Physical memory available to allocate now (free pages), bytes.
double host_available_memory_bytes();

}  // namespace hydra
