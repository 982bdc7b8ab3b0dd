// Two independent pieces of work run concurrently on the GPU: `main_work` on the calling thread's
// current stream and `side_work` on a second stream that first waits for everything already queued
// on the current stream; the current stream then waits for the side stream before anything queued
// later. On the host (and for host work) the two run one after the other, side_work first.
//
// Used for the FA and GDN branches of a HydraHead layer (DESIGN.md §3.5: the branches are independent, so
// the ring's transfers and attention overlap the GDN scan). Tensors created inside side_work are
// allocated and freed in the side stream's order; inputs come from before the fork, outputs are
// read after the join, so the stream-ordered allocator never hands out memory still in use.
//
// HYDRA_SERIAL_BRANCHES=1 runs both on the current stream, side_work first (a measurement knob: the
// step or prefill time with and without it is what the overlap buys); unset, empty or 0: concurrent.
#pragma once

#include <functional>

#include "runtime/dtype.h"

namespace hydra {

void run_concurrently(Device device, const std::function<void()>& main_work, const std::function<void()>& side_work);

// Whether HYDRA_SERIAL_BRANCHES asks for one stream; any value but unset, "", "0" or "1" is a user
// error naming it (hydra's main checks it at start-up, before any work).
bool serial_branches();

}  // namespace hydra
