// Fault injection for the failure tests: HYDRA_INJECT_FAULT="<rank>:<site>" makes that rank fail
// at that site, so tests can check that a failure on one rank ends the whole job with its message
// and never leaves the others waiting. Sites are named where they are called
// (launch: "load", model: "layer" in a layer's forward and "backward" in its backward, training:
// "save", half way through writing a checkpoint, and in `hydra export` after each shard; "step" at
// the start of each training step); the
// pseudo-site "crash" aborts the process at the first site reached instead of throwing (a rank dying
// without a message), and "kill@SITE" sends the process SIGKILL at SITE (kill -9 mid-operation),
// "term@SITE" SIGTERM (a scheduler's time limit mid-operation), and "hold@SITE" holds the rank at
// SITE until the file HYDRA_FAULT_RELEASE names exists (it first creates that path + ".held"): a
// test can look at what the other ranks do meanwhile — that they finish their shards of a save
// while rank 0 has not written its own — by condition, not by timing.
// A spec that names no known site, or a rank the job does not have, is a user error at start-up
// (check_fault_spec), never silently ignored. Unset: no effect, one getenv. Never inside a memory
// plan's shape-only run (runtime/memory_timeline.h), which is not the operation.
#pragma once

#include <string>
#include <vector>

namespace hydra {

void maybe_inject_fault(const char* site);
// UserError if HYDRA_INJECT_FAULT is set but malformed, names an unknown site, or a rank >= world_size.
void check_fault_spec(int world_size);
// The sites maybe_inject_fault is called with.
const std::vector<std::string>& fault_sites();

}  // namespace hydra
