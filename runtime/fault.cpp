#include "runtime/fault.h"

#include <csignal>
#include <cstdlib>
#include <string>

#include "runtime/error.h"

namespace hydra {

void maybe_inject_fault(const char* site) {
  static const char* spec = std::getenv("HYDRA_INJECT_FAULT");
  if (!spec || !*spec) return;
  const std::string s(spec);
  const size_t colon = s.find(':');
  if (colon == std::string::npos) return;
  if (std::atoi(s.substr(0, colon).c_str()) != error_context().rank) return;
  const std::string target = s.substr(colon + 1);
  if (target == "crash") std::abort();
  if (target == std::string("kill@") + site) std::raise(SIGKILL);  // as kill -9 would, mid-operation
  if (target == site) {
    throw Error(fmt::format("injected fault at '{}' (HYDRA_INJECT_FAULT={}) [{}]", site, s, describe_location()));
  }
}

}  // namespace hydra
