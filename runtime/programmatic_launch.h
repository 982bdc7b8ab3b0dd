// Programmatic dependent launch (PDL, Hopper and later): while a ProgrammaticLaunchScope is open
// on a thread, the kernels that support it (those launched through cuda::launch with
// cuda::wait_for_previous_grid() at their top, kernels/cuda/common.cuh) are launched with
// programmatic stream serialization: such a kernel may be scheduled while the kernel before it on
// its stream is still running, and waits inside, before its first access to global memory, until
// that kernel has completed and its writes are visible (PTX griddepcontrol.wait). What it saves is
// the gap between two kernels (the launch of the next overlaps the tail of the previous), inside a
// CUDA graph (runtime/cuda_graph.h) as on a stream. Every other launch (cuBLAS, copies, kernels not
// converted) keeps the full stream order, so a kernel that completes has always seen its
// predecessors complete.
//
// The decode engine opens the scope around its step when the kernel option decode_pdl is on
// (HYDRA_DECODE_PDL=1, kernels/kernel_options.h); off by default until measured. The flag is per
// thread, like the current stream; a build without CUDA never reads it.
#pragma once

namespace hydra {

namespace detail {
inline bool& programmatic_launch_flag() {
  thread_local bool on = false;
  return on;
}
}  // namespace detail

// Whether kernels launched through cuda::launch on this thread now use PDL.
inline bool programmatic_launch_enabled() { return detail::programmatic_launch_flag(); }

// Sets the flag for its lifetime, restoring the previous value after (scopes nest).
class ProgrammaticLaunchScope {
 public:
  explicit ProgrammaticLaunchScope(bool on) : previous_(detail::programmatic_launch_flag()) {
    detail::programmatic_launch_flag() = on;
  }
  ~ProgrammaticLaunchScope() { detail::programmatic_launch_flag() = previous_; }
  ProgrammaticLaunchScope(const ProgrammaticLaunchScope&) = delete;
  ProgrammaticLaunchScope& operator=(const ProgrammaticLaunchScope&) = delete;

 private:
  bool previous_;
};

}  // namespace hydra
