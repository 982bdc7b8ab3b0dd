// What a tensor allocation is, for the memory plans (model/memory_plan.h): the part of memory it
// belongs to and its name. Every allocation site of a pass names its buffer where it allocates it
// (`spec.empty(device, {MemoryPart::workspaces, "ring K/V"})`, `clone(x, "kept input")`); a
// shape-only run of the pass (runtime/memory_timeline.h) records the bytes with the label, so a
// plan's peak says which buffer it is ("layer 27 backward: d_conv") and what part each byte at the
// peak belongs to. Outside a shape-only run a label is two words passed along and dropped.
#pragma once

#include <cstdint>

namespace hydra {

enum class MemoryPart : uint8_t {
  activations,  // the residual stream, token rows, kept tensors and a layer's own buffers (model/layer_buffers.h)
  workspaces,   // the ops' scratch: ring K/V and dK/dV, document bounds, attention merge parts and delta,
                // the delta-rule kernels' workspaces, the fusion's row scalars, the loss head's logit chunks
  gdn_maps,     // the GDN scan (parallel/gdn_scan.h): states, segment maps (gathered and kept), folded initial
                // states, state gradients; and the conv halos
  cache,        // generation: the K/V and GDN cache and the decode engine's persistent buffers
  outputs,      // hydra forward: the logits it returns (and, on the host, their assembly and the ids)
};
inline constexpr int kMemoryPartCount = 5;
const char* memory_part_name(MemoryPart part);  // "activations", "workspaces", "GDN maps", "cache", "outputs"

struct MemoryLabel {
  MemoryPart part = MemoryPart::activations;
  const char* what = nullptr;  // a string literal; null: not named
  constexpr MemoryLabel() = default;
  constexpr MemoryLabel(const char* name) : what(name) {}  // NOLINT: a name alone labels an activation
  constexpr MemoryLabel(MemoryPart p, const char* name) : part(p), what(name) {}
};

}  // namespace hydra
