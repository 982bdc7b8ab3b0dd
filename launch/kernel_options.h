// The kernel options (kernels/kernel_options.h) as the environment sets them, read once at start-up
// (launch/main.cpp) and validated there: an unknown value is a one-line UserError naming the
// variable, before any work. README "Kernel options" lists them.
//   HYDRA_ATTENTION_KERNEL      hopper | mma          FA forward kernel (default: the fastest the GPU allows)
//   HYDRA_ATTENTION_BWD_KERNEL  ws | mma              FA backward kernel for head dim 128
//   HYDRA_GDN_SEGMENTS          N ≥ 1                 the delta rule's in-GPU split (default: cost model)
//   HYDRA_GDN_PROFILE           0 | 1 | 2             GDN stage times to stderr (2: backward stages apart)
//   HYDRA_SERIAL_BRANCHES       0 | 1                 run the FA and GDN branches on one stream
// and, read the same way, where ranks run:
//   HYDRA_SHARE_GPUS            0 | 1                 let a node run more ranks than GPUs (testing;
//                                                     parallel/device_world.h)
// Unset or empty means the default.
#pragma once

#include "kernels/kernel_options.h"
#include "parallel/device_world.h"

namespace hydra {

ops::KernelOptions kernel_options_from_environment();
GpuSharing gpu_sharing_from_environment();

}  // namespace hydra
