#include "runtime/memory_timeline.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "runtime/error.h"
#include "runtime/tensor.h"

namespace hydra {

static_assert(static_cast<int>(MemoryPart::outputs) + 1 == kMemoryPartCount, "one count of the parts");

const char* memory_part_name(MemoryPart part) {
  switch (part) {
    case MemoryPart::activations: return "activations";
    case MemoryPart::workspaces: return "workspaces";
    case MemoryPart::gdn_maps: return "GDN maps";
    case MemoryPart::cache: return "cache";
    case MemoryPart::outputs: return "outputs";
  }
  return "?";
}

double allocated_bytes(Device device, double bytes) {
  const double block = device == Device::host ? 64.0 : 256.0;
  return bytes < 0 ? 0.0 : std::max(block, std::ceil(bytes / block) * block);
}

struct MemoryTimeline::State {
  struct Held {
    double bytes;  // < 0: released
    MemoryPart part;
  };
  Device device;
  std::vector<Held> held;
  MemoryParts live_parts{}, peak_parts{};
  double live = 0, peak = 0, total = 0;
  std::string stage, peak_at;
  int64_t unnamed = 0;

  void release(Id id) {
    HYDRA_ASSERT(id < held.size() && held[id].bytes >= 0, "memory timeline: buffer {} released twice", id);
    live -= held[id].bytes;
    live_parts[static_cast<size_t>(held[id].part)] -= held[id].bytes;
    held[id].bytes = -1;
  }
};

MemoryTimeline::MemoryTimeline(Device device) : state_(std::make_shared<State>()) { state_->device = device; }

MemoryTimeline::Id MemoryTimeline::hold(double bytes, MemoryLabel label) {
  State& s = *state_;
  const double held = allocated_bytes(s.device, bytes);
  if (!label.what) ++s.unnamed;
  s.held.push_back({held, label.part});
  s.live += held;
  s.total += held;
  s.live_parts[static_cast<size_t>(label.part)] += held;
  if (s.live > s.peak) {
    s.peak = s.live;
    s.peak_parts = s.live_parts;
    const std::string what = label.what ? label.what : "(unnamed buffer)";
    s.peak_at = s.stage.empty() ? what : s.stage + ": " + what;
  }
  return s.held.size() - 1;
}

void MemoryTimeline::release(Id id) { state_->release(id); }
void MemoryTimeline::set_stage(std::string stage) { state_->stage = std::move(stage); }
Device MemoryTimeline::device() const { return state_->device; }
double MemoryTimeline::live() const { return state_->live; }
double MemoryTimeline::peak() const { return state_->peak; }
double MemoryTimeline::held_total() const { return state_->total; }
const MemoryParts& MemoryTimeline::peak_parts() const { return state_->peak_parts; }
const std::string& MemoryTimeline::peak_at() const { return state_->peak_at; }
int64_t MemoryTimeline::unnamed() const { return state_->unnamed; }

std::shared_ptr<void> MemoryTimeline::meta_storage(size_t bytes, Device device, MemoryLabel label) {
  void* const address = reinterpret_cast<void*>(kMetaAddress);
  if (device != state_->device) return std::shared_ptr<void>(address, [](void*) {});
  const Id id = hold(static_cast<double>(bytes), label);
  return std::shared_ptr<void>(address, [state = std::weak_ptr<State>(state_), id](void*) {
    if (const std::shared_ptr<State> s = state.lock()) s->release(id);
  });
}

namespace {
thread_local MemoryTimeline* t_active = nullptr;
}  // namespace

ShapeOnlyRun::ShapeOnlyRun(MemoryTimeline& timeline) {
  HYDRA_ASSERT(t_active == nullptr, "a shape-only run begins inside another");
  t_active = &timeline;
}

ShapeOnlyRun::~ShapeOnlyRun() { t_active = nullptr; }

MemoryTimeline* ShapeOnlyRun::active() { return t_active; }

}  // namespace hydra
