// A graceful stop for long runs (hydra train): SIGTERM, SIGINT and SIGUSR1 (a scheduler's warning
// before its time limit, Ctrl-C, `scancel --signal=USR1`) only set a flag; the training loop reads
// it at each step's loss all-reduce, so every rank sees the same answer, and stops after that
// step with a checkpoint (model/train/trainer.h). The handler is async-signal-safe: it stores to a
// lock-free atomic and reinstalls the cleanup handler (runtime/atomic_file.h) for the three
// signals, so a second signal ends the process at once as before: temporaries removed, then the
// signal's default action (what was saved stays saved).
//
// Outside a StopRequestScope the handlers are the cleanup ones: other commands end on the first signal.
#pragma once

namespace hydra {

// The exit status of a run that stopped on a signal after saving (EX_TEMPFAIL of sysexits.h: "try
// again later"); scripts resubmit with --resume on it.
constexpr int kExitStoppedBySignal = 75;

// While alive, SIGTERM/SIGINT/SIGUSR1 set the flag instead of ending the process; restores the
// cleanup handlers when it ends. One at a time.
class StopRequestScope {
 public:
  StopRequestScope();
  ~StopRequestScope();
  StopRequestScope(const StopRequestScope&) = delete;
  StopRequestScope& operator=(const StopRequestScope&) = delete;
};

// The signal that asked for the stop (0: none so far).
int stop_signal();
// "SIGTERM", "SIGINT", "SIGUSR1", "SIGHUP", or "a signal" for any other.
const char* signal_name(int sig);

}  // namespace hydra
