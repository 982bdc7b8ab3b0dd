// The kernel options (kernels/kernel_options.h) as the environment sets them, read once at start-up
// (launch/main.cpp) and validated there: an unknown value is a one-line UserError naming the
// variable, before any work. README "Kernel options" lists them.
//   HYDRA_ATTENTION_KERNEL      hopper | mma          FA forward kernel (default: the fastest the GPU allows)
//   HYDRA_ATTENTION_BWD_KERNEL  ws | mma | mma-k64    FA backward kernel (ws: d = 128; mma-k64: d = 64)
//   HYDRA_GDN_SEGMENTS          N ≥ 1                 the delta rule's in-GPU split (default: cost model)
//   HYDRA_GDN_PROFILE           0 | 1 | 2             GDN stage times to stderr (2: backward stages apart)
//   HYDRA_SERIAL_BRANCHES       0 | 1                 run the FA and GDN branches on one stream
//   HYDRA_DECODE_PDL            0 | 1                 programmatic dependent launch in the decode step
//   HYDRA_DECODE_GEMV           cublas | hydra        the decode step's projection kernel
//   HYDRA_DECODE_PREFETCH       off | MiB             the decode step's L2 weight prefetch and its cap
//   HYDRA_SMALL_ROWS            0 | 1                 the small-row RMSNorm and cross-entropy kernels
// and, read the same way, where ranks run:
//   HYDRA_SHARE_GPUS            0 | 1                 let a node run more ranks than GPUs (testing;
//                                                     parallel/device_world.h)
// Unset or empty means the default.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/kernel_options.h"
#include "parallel/device_world.h"

namespace hydra {

ops::KernelOptions kernel_options_from_environment();
// A decode prefetch setting as HYDRA_DECODE_PREFETCH and `hydra bench --decode-prefetch` take it:
// "off" or "0" (0 bytes), or a whole number of MiB from 1 to kMaxDecodePrefetchMiB; the bytes.
// Anything else is a UserError naming `what` (the variable or the flag) and the value.
inline constexpr int64_t kMaxDecodePrefetchMiB = 1024;
int64_t parse_decode_prefetch(const std::string& text, const char* what);
GpuSharing gpu_sharing_from_environment();

}  // namespace hydra
