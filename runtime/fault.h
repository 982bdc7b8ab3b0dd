// Fault injection for the failure tests: HYDRA_INJECT_FAULT="<rank>:<site>" makes that rank fail
// at that site, so tests can check that a failure on one rank ends the whole job with its message
// and never leaves the others waiting. Sites are named where they are called
// (launch: "load", model: "layer" in a layer's forward and "backward" in its backward, training:
// "save", half way through writing a checkpoint); the
// pseudo-site "crash" aborts the process at the first site reached instead of throwing (a rank dying
// without a message), and "kill@SITE" sends the process SIGKILL at SITE (kill -9 mid-operation).
// Unset: no effect, one getenv.
#pragma once

namespace hydra {

void maybe_inject_fault(const char* site);

}  // namespace hydra
