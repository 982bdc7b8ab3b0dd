// The small-row kernels (HYDRA_SMALL_ROWS=1, kernels/kernel_options.h): opt-in CUDA paths of the
// row-wise ops for short rows, written for the small-model step (qwen3-synth: hidden 256, head rows of
// 64, 512 logits a token); equal to the CPU reference on an H100, the qwen3-synth step 5% faster, a large
// model's unchanged (cluster/results/h100-2026-12-07-session5), so the default path stays as it was:
//  - RMSNorm forward and backward (kernels/rmsnorm/rms_small_rows.cuh) for n = 8 … 1024 (backward
//    n ≤ 512): a group of at most 32 threads per row (shuffle sums, no block barrier in the row loop),
//    two rows per group in flight for n ≤ 256, and the weight gradient's partials cut to at most 512
//    blocks with a 32-lane finish;
//  - cross-entropy (kernels/loss/loss.cu, cross_entropy_small_vocab_kernel) for V ≤ 2048: a warp per
//    row, the row held in registers (the logits read once).
//
// How the switch reaches the ops: like programmatic launch (runtime/programmatic_launch.h), a
// per-thread flag that a scope sets for its lifetime. launch/main.cpp opens the scope for the whole
// command from the kernel options read at start-up (the losses are called from model/train's
// objective, which takes no kernel options); tests open it around the calls they compare. The CUDA
// launchers read it; the host path never does.
#pragma once

namespace hydra::ops {

namespace detail {
inline bool& small_row_kernels_flag() {
  thread_local bool on = false;
  return on;
}
}  // namespace detail

// Whether the CUDA row ops on this thread take their small-row paths where the shapes allow.
inline bool small_row_kernels_enabled() { return detail::small_row_kernels_flag(); }

// Sets the flag for its lifetime, restoring the previous value after (scopes nest).
class SmallRowKernelsScope {
 public:
  explicit SmallRowKernelsScope(bool on) : previous_(detail::small_row_kernels_flag()) {
    detail::small_row_kernels_flag() = on;
  }
  ~SmallRowKernelsScope() { detail::small_row_kernels_flag() = previous_; }
  SmallRowKernelsScope(const SmallRowKernelsScope&) = delete;
  SmallRowKernelsScope& operator=(const SmallRowKernelsScope&) = delete;

 private:
  bool previous_;
};

}  // namespace hydra::ops
