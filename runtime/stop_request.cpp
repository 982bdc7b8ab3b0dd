#include "runtime/stop_request.h"

#include <signal.h>

#include <atomic>

#include "runtime/atomic_file.h"

namespace hydra {
namespace {

std::atomic<int> g_stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler needs a lock-free flag");
constexpr int kStopSignals[] = {SIGTERM, SIGINT, SIGUSR1};

extern "C" void stop_request_handler(int sig) {
  int expected = 0;
  g_stop_signal.compare_exchange_strong(expected, sig);
  // The next signal ends the process (sigaction is async-signal-safe).
  for (int s : kStopSignals) install_cleanup_handler(s);
}

}  // namespace

StopRequestScope::StopRequestScope() {
  g_stop_signal.store(0);
  struct sigaction action {};
  action.sa_handler = stop_request_handler;
  sigemptyset(&action.sa_mask);
  for (int s : kStopSignals) sigaddset(&action.sa_mask, s);  // one handler at a time
  action.sa_flags = SA_RESTART;
  for (int s : kStopSignals) sigaction(s, &action, nullptr);
}

StopRequestScope::~StopRequestScope() {
  for (int s : kStopSignals) install_cleanup_handler(s);
}

int stop_signal() { return g_stop_signal.load(); }

const char* signal_name(int sig) {
  switch (sig) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGUSR1: return "SIGUSR1";
    case SIGHUP: return "SIGHUP";
    default: return "a signal";
  }
}

}  // namespace hydra
