#include "runtime/fault.h"

#include "runtime/memory_timeline.h"

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <thread>
#include <cstdlib>
#include <string>

#include "runtime/error.h"

namespace hydra {
namespace {

const char* spec_text() {
  static const char* spec = std::getenv("HYDRA_INJECT_FAULT");
  return spec && *spec ? spec : nullptr;
}

}  // namespace

const std::vector<std::string>& fault_sites() {
  // Every maybe_inject_fault call site: launch/model_source.cpp (load), model/model_forward.cpp (layer),
  // model/model_backward.cpp (backward), model/train/trainer.cpp and model/hf_export.cpp (save),
  // runtime/atomic_file.cpp (commit: between a write and its rename), model/train/trainer.cpp (step:
  // at the start of each training step; term@step is a signal to one rank mid-run).
  static const std::vector<std::string> sites = {"load", "layer", "backward", "save", "commit", "step"};
  return sites;
}

void check_fault_spec(int world_size) {
  const char* spec = spec_text();
  if (!spec) return;
  const std::string s(spec);
  const size_t colon = s.find(':');
  std::string known;
  for (const std::string& site : fault_sites()) known += (known.empty() ? "" : ", ") + site;
  const std::string usage = fmt::format("expected RANK:SITE, RANK:crash, RANK:kill@SITE, RANK:term@SITE or "
                                        "RANK:hold@SITE with SITE one of {}", known);
  HYDRA_USER_CHECK(colon != std::string::npos && colon > 0, "HYDRA_INJECT_FAULT='{}': {}", s, usage);
  const std::string rank_text = s.substr(0, colon), target = s.substr(colon + 1);
  HYDRA_USER_CHECK(rank_text.size() <= 9 && rank_text.find_first_not_of("0123456789") == std::string::npos,
                   "HYDRA_INJECT_FAULT='{}': '{}' is not a rank; {}", s, rank_text, usage);
  const int rank = std::stoi(rank_text);
  HYDRA_USER_CHECK(rank < world_size, "HYDRA_INJECT_FAULT='{}': rank {} does not exist in a job of {} rank(s)", s, rank,
                   world_size);
  std::string site = target;
  for (const char* prefix : {"kill@", "term@", "hold@"}) {
    if (target.rfind(prefix, 0) == 0) site = target.substr(5);
  }
  bool ok = target == "crash";
  for (const std::string& k : fault_sites()) ok = ok || site == k;
  HYDRA_USER_CHECK(ok, "HYDRA_INJECT_FAULT='{}': unknown site '{}'; {}", s, target, usage);
  const char* release = std::getenv("HYDRA_FAULT_RELEASE");
  HYDRA_USER_CHECK(target.rfind("hold@", 0) != 0 || (release && *release),
                   "HYDRA_INJECT_FAULT='{}': hold@ needs HYDRA_FAULT_RELEASE, the file whose creation releases the rank", s);
}

void maybe_inject_fault(const char* site) {
  const char* spec = spec_text();
  if (!spec || ShapeOnlyRun::active()) return;  // a memory plan's shape-only run is not the operation
  const std::string s(spec);
  const size_t colon = s.find(':');
  if (colon == std::string::npos) return;
  if (std::atoi(s.substr(0, colon).c_str()) != error_context().rank) return;
  const std::string target = s.substr(colon + 1);
  if (target == "crash") std::abort();
  if (target == std::string("kill@") + site) std::raise(SIGKILL);  // as kill -9 would, mid-operation
  if (target == std::string("term@") + site) std::raise(SIGTERM);  // as a scheduler's time limit would
  if (target == std::string("hold@") + site) {  // until the test creates the release file (check_fault_spec: set)
    const std::string release = std::getenv("HYDRA_FAULT_RELEASE");
    std::ofstream(release + ".held") << site << "\n";
    std::error_code ec;
    while (!std::filesystem::exists(release, ec)) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return;
  }
  if (target == site) {
    throw Error(fmt::format("injected fault at '{}' (HYDRA_INJECT_FAULT={}) [{}]", site, s, describe_location()));
  }
}

}  // namespace hydra
