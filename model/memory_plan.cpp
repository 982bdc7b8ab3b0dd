#include "model/memory_plan.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include <fmt/format.h>

#include "kernels/attention/attention.h"
#include "kernels/delta_rule/delta_rule.h"
#include "model/decode_engine.h"
#include "model/generate.h"
#include "model/kv_cache.h"
#include "model/params.h"
#include "parallel/communicator.h"
#include "parallel/gdn_scan.h"
#include "parallel/ring_attention.h"
#include "runtime/error.h"
#include "runtime/host_memory.h"
#if HYDRA_CUDA
#include "runtime/cuda_memory.h"
#endif

namespace hydra {

LayerBuffers layer_buffers(const ModelConfig& c, const LayerLayout& layout, int64_t t, DType dtype, DType acc) {
  const int64_t D = c.hidden_size, H = c.num_heads, d = c.head_dim, I = c.intermediate_size;
  const int64_t hfa = layout.h_fa, gfa = layout.g_fa, hg = layout.h_gdn, rows = layout.columns.rows;
  const int64_t n = std::min(t, kMlpTileTokens);
  return LayerBuffers{
      .input = {{t, D}, dtype},
      .fa_out = {{t, hfa, d}, dtype},
      .fa_lse = {{hfa, t}, acc},
      .gdn_out = {{t, hg, d}, dtype},
      .mlp_gate_up = {{t, 2 * I}, dtype},
      .x_norm = {{t, D}, dtype},
      .proj = {{t, rows}, dtype},
      .heads = {{t, H, d}, dtype},
      .fa_q = {{t, hfa, d}, dtype},
      .fa_k = {{t, gfa, d}, dtype},
      .fa_acc = {{t, hfa, d}, acc},
      .conv = {{t, 3 * hg * d}, dtype},
      .inv_norm = {{t, 2 * hg}, acc},
      .gate = {{t, hg}, acc},
      .tile_x_norm = {{n, D}, dtype},
      .tile_gate_up = {{n, 2 * I}, dtype},
      .tile_h = {{n, I}, dtype},
      .tile_dy = {{n, D}, dtype},
      .tile_dh = {{n, I}, dtype},
      .tile_dgate_up = {{n, 2 * I}, dtype},
      .tile_dx_norm = {{n, D}, dtype},
      .dx_operand = {{t, D}, dtype},
      .d_heads = {{t, H, d}, dtype},
      .d_proj = {{t, rows}, dtype},
      .d_attn = {{t, hfa, d}, dtype},
      .d_fa_q = {{t, hfa, d}, acc},
      .d_fa_kv = {{t, gfa, d}, acc},
      .d_conv = {{t, 3 * hg * d}, dtype},
      .d_qk = {{t, hg, d}, dtype},
      .d_x_norm = {{t, D}, dtype},
  };
}

int64_t loss_chunk_rows(int64_t vocab) { return std::max<int64_t>(1, (int64_t{1} << 29) / std::max<int64_t>(vocab, 1)); }

LossBuffers loss_buffers(const ModelConfig& c, int64_t tokens, DType dtype, DType acc) {
  const int64_t n = std::max<int64_t>(1, std::min(tokens, loss_chunk_rows(c.vocab_size)));
  return {.logits = {{n, c.vocab_size}, acc}, .row_loss = {{n}, acc}, .operand = {{n, c.vocab_size}, dtype}};
}

// ---- MemoryTimeline ----

namespace {
// A buffer's bytes as the device's allocator rounds them (allocate_storage: 64-byte blocks, at least
// one; cuda_allocate: 256); a negative size is no buffer.
double allocated_bytes(Device device, double bytes) {
  const double block = device == Device::host ? 64.0 : 256.0;
  return bytes < 0 ? 0.0 : std::max(block, std::ceil(bytes / block) * block);
}
}  // namespace

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

MemoryTimeline::Id MemoryTimeline::hold_bytes(double bytes, MemoryPart part, const char* what) {
  const double held = allocated_bytes(device_, bytes);
  held_.push_back({held, part});
  live_ += held;
  live_parts_[static_cast<size_t>(part)] += held;
  if (live_ > peak_) {
    peak_ = live_;
    peak_parts_ = live_parts_;
    peak_at_ = stage_.empty() ? std::string(what) : stage_ + ": " + what;
  }
  return held_.size() - 1;
}

MemoryTimeline::Id MemoryTimeline::hold_host(const BufferSpec& buffer, MemoryPart part, const char* what) {
  return device_ == Device::host ? hold(buffer, part, what) : hold_bytes(-1, part, what);  // nothing on the device
}

void MemoryTimeline::release(Id id) {
  HYDRA_ASSERT(id < held_.size() && held_[id].bytes >= 0, "memory plan: buffer {} released twice", id);
  live_ -= held_[id].bytes;
  live_parts_[static_cast<size_t>(held_[id].part)] -= held_[id].bytes;
  held_[id].bytes = -1;
}

void MemoryEstimate::add(MemoryPart p, double bytes) {
  activations += bytes;
  parts[static_cast<size_t>(p)] += bytes;
}

std::string MemoryEstimate::describe() const {
  const double g = 1024.0 * 1024.0 * 1024.0;
  std::string by_part;
  for (int i = 0; i < kMemoryPartCount; ++i) {
    if (parts[static_cast<size_t>(i)] <= 0) continue;
    by_part += fmt::format("{}{} {:.1f}", by_part.empty() ? ": " : ", ", memory_part_name(static_cast<MemoryPart>(i)),
                           parts[static_cast<size_t>(i)] / g);
  }
  return fmt::format("{:.1f} GiB (weights {:.1f}, build {:.1f}, peak {:.1f}{}{})", total() / g, weights / g,
                     init_extra / g, activations / g, by_part, peak_at.empty() ? "" : ", at " + peak_at);
}

namespace {

using Id = MemoryTimeline::Id;
using enum MemoryPart;  // every hold below names its part

// The GPU kernels' own workspaces (kernels/delta_rule/delta_rule.h specs, one block as the plan
// has always priced them); the CPU reference keeps its per-chunk state in plain vectors.
double gdn_prepare_bytes(int64_t rows, int64_t heads, int64_t d, bool queries, bool backward) {
  return ops::delta_rule_prepare_buffers(rows, heads, d, queries, backward).bytes();
}

struct Pass {
  const ModelConfig& config;
  std::vector<LayerLayout> layouts;
  DType dtype, acc;
  int64_t t;
  int world;
  bool documents;
  MemoryTimeline& tl;
  KeptActivations keep;

  Pass(const ModelConfig& c, DType dtype_, DType acc_, int64_t t_, int world_, bool documents_, MemoryTimeline& tl_,
       KeptActivations keep_ = {})
      : config(c), dtype(dtype_), acc(acc_), t(t_), world(world_), documents(documents_), tl(tl_), keep(keep_) {
    for (int64_t l = 0; l < c.num_layers; ++l) layouts.push_back(layer_layout(c, l));
  }
  bool cuda() const { return tl.device() == Device::cuda; }
  LayerBuffers buffers(int64_t l) const { return layer_buffers(config, layouts[static_cast<size_t>(l)], t, dtype, acc); }
  int nlocal() const { return world > 1 ? 2 : 1; }  // zigzag: two segments per rank
  int64_t segment_rows() const { return t / nlocal(); }
  void release(std::vector<Id>& ids) {
    for (Id id : ids) tl.release(id);
    ids.clear();
  }
};

// What a saving forward keeps for one layer (released after its backward).
struct Kept {
  std::vector<Id> ids;
  bool proj = false, gdn_out = false, gate_up = false;
};

enum class Mode { plain, save, replay };

// parallel/ring_attention.cpp position_bounds: with packed documents, start/end [T] i64 over the
// whole sequence, built on the host and copied to the device (held while the ring runs).
std::vector<Id> position_bounds(Pass& p) {
  if (!p.documents) return {};
  const BufferSpec bound = ring_buffers(p.t * p.world, 0, 0, 0, 0, 0, p.dtype, p.acc).bound;
  const Id hs = p.tl.hold_host(bound, workspaces, "document bounds");
  const Id he = p.tl.hold_host(bound, workspaces, "document bounds");
  std::vector<Id> out{p.tl.hold(bound, workspaces, "document bounds"), p.tl.hold(bound, workspaces, "document bounds")};
  p.tl.release(hs);
  p.tl.release(he);
  return out;
}

// parallel/gdn_scan.cpp causal_conv_sequence_parallel (and its backward): the segments' last K−1
// input rows gathered from every rank, and a segment's halo with another document's rows zeroed;
// the backward gathers the halo rows' gradients too.
void conv_halos(Pass& p, int64_t channels, bool backward) {
  if (p.world == 1) return;
  const ConvHaloBuffers b = conv_halo_buffers(p.world, p.nlocal(), p.config.conv_kernel - 1, channels, p.dtype);
  std::vector<Id> ids{p.tl.hold(b.halos, gdn_maps, "conv halo"), p.tl.hold(b.gathered, gdn_maps, "conv halos")};
  if (backward) ids.push_back(p.tl.hold(b.halos, gdn_maps, "conv halo gradient"));
  p.tl.release(p.tl.hold(b.masked, gdn_maps, "masked halo"));
  if (backward) ids.push_back(p.tl.hold(b.gathered, gdn_maps, "conv halo gradients"));
  p.release(ids);
}

// The GDN forward over this rank's segments (gdn_sequence_parallel, or the backward's recompute).
void gdn_forward(Pass& p, int64_t hg, bool recompute, Kept* kept) {
  const int64_t d = p.config.head_dim;
  const GdnScanBuffers scan = gdn_scan_buffers(p.world, p.nlocal(), hg, d, d, p.acc);
  std::vector<Id> ids{p.tl.hold(scan.state, gdn_maps, "GDN state")};
  if (p.world > 1 && !recompute) {
    ids.push_back(p.tl.hold(scan.maps, gdn_maps, "GDN segment maps"));
    ids.push_back(p.tl.hold(scan.gathered_maps, gdn_maps, "GDN gathered maps"));
    if (kept) {  // the own segments' M and initial states: nothing that grows with the rank count
      kept->ids.push_back(p.tl.hold(scan.kept_maps, gdn_maps, "GDN kept maps"));
      kept->ids.push_back(p.tl.hold(scan.initial_states, gdn_maps, "GDN initial states"));
    }
  }
  if (p.cuda()) {  // delta_rule_forward.cu chunked_fused: prepare with queries, per segment
    const double bytes = gdn_prepare_bytes(p.segment_rows(), hg, d, true, false);
    const Id w = p.tl.hold_bytes(bytes, workspaces, "GDN chunk workspace");
    p.tl.release(w);
  }
  p.release(ids);
}

// The attention block (Model::attention_block). Returns what outlives it: nothing for a plain or
// saving pass; for a replay the trace, which the layer's backward holds to its end.
std::vector<Id> attention_block(Pass& p, int64_t l, Mode mode, Kept* kept) {
  const LayerLayout& lay = p.layouts[static_cast<size_t>(l)];
  const LayerBuffers b = p.buffers(l);
  const bool hydra = p.config.is_hydra(), save = mode == Mode::save, replay = mode == Mode::replay;
  MemoryTimeline& tl = p.tl;
  std::vector<Id> block{tl.hold(b.x_norm, activations, "x_norm")};
  if (!(replay && kept->proj)) {
    const Id proj = tl.hold(b.proj, activations, "projection");
    if (save && hydra && p.keep.projection) {
      kept->ids.push_back(proj);
      kept->proj = true;
    } else {
      block.push_back(proj);
    }
  }
  block.push_back(tl.hold(b.heads, activations, "heads"));
  // The branches in the host order of run_concurrently: GDN (the side work) first.
  if (lay.h_gdn > 0) {
    block.push_back(tl.hold(b.conv, activations, "GDN conv"));
    block.push_back(tl.hold(b.inv_norm, activations, "q/k inverse norms"));
    if (!replay) conv_halos(p, b.conv.shape[1], false);
    block.push_back(tl.hold(b.gate, activations, "beta"));
    block.push_back(tl.hold(b.gate, activations, "g"));
    if (!(replay && kept->gdn_out)) gdn_forward(p, lay.h_gdn, replay, save ? kept : nullptr);
    if (save && p.keep.gdn_outputs) {
      kept->ids.push_back(tl.hold(b.gdn_out, activations, "kept GDN outputs"));
      kept->gdn_out = true;
    }
  }
  if (lay.h_fa > 0) {
    block.push_back(tl.hold(b.fa_q, activations, "FA q"));
    block.push_back(tl.hold(b.fa_k, activations, "FA k"));
    if (!replay) {
      std::vector<Id> branch{tl.hold(b.fa_acc, activations, "FA output")};
      const Id lse = tl.hold(b.fa_lse, activations, "FA lse");
      std::vector<Id> ring = position_bounds(p);
      if (p.world > 1) {
        const int64_t d = p.config.head_dim;
        const BufferSpec kv = ring_buffers(p.t * p.world, p.t, lay.h_fa, lay.g_fa, d, d, p.dtype, p.acc).kv;
        ring.push_back(tl.hold(kv, workspaces, "ring K/V"));
        ring.push_back(tl.hold(kv, workspaces, "ring K/V in flight"));
        if (!p.cuda()) {  // the CPU merges each (query segment, key segment) block from its own output
          const ops::AttentionMergeBuffers merge =
              ops::attention_merge_buffers(p.segment_rows(), lay.h_fa, p.config.head_dim, p.acc);
          const Id part = tl.hold(merge.part, workspaces, "attention block part");
          const Id part_lse = tl.hold(merge.part_lse, workspaces, "attention block lse");
          tl.release(part);
          tl.release(part_lse);
        }
      }
      p.release(ring);
      if (save) {
        kept->ids.push_back(tl.hold(b.fa_out, activations, "kept FA output"));
        kept->ids.push_back(lse);
      } else {
        branch.push_back(lse);
      }
      p.release(branch);
    }
  }
  if (hydra && p.config.fusion != ops::Fusion::concat && replay) {
    block.push_back(tl.hold(b.heads, activations, "fused heads"));
  }
  if (!replay) p.release(block);
  return block;
}

// Model::mlp: one tile's buffers (the gate/up tile unless the forward keeps it whole).
void mlp(Pass& p, const LayerBuffers& b, bool kept_gate_up) {
  std::vector<Id> ids{p.tl.hold(b.tile_x_norm, activations, "MLP tile")};
  if (!kept_gate_up) ids.push_back(p.tl.hold(b.tile_gate_up, activations, "MLP gate/up tile"));
  ids.push_back(p.tl.hold(b.tile_h, activations, "MLP tile"));
  p.release(ids);
}

// Model::layer_forward.
void layer_forward(Pass& p, int64_t l, Kept* kept) {
  const LayerBuffers b = p.buffers(l);
  p.tl.set_stage(fmt::format("layer {} forward", l));
  if (kept) kept->ids.push_back(p.tl.hold(b.input, activations, "kept input"));
  attention_block(p, l, kept ? Mode::save : Mode::plain, kept);
  if (kept && l < p.keep.mlp_layers) {
    kept->ids.push_back(p.tl.hold(b.mlp_gate_up, activations, "kept MLP gate/up"));
    kept->gate_up = true;
  }
  mlp(p, b, kept && kept->gate_up);
}

// Model::layer_backward; releases the layer's kept tensors after it, as sequence_gradients does.
void layer_backward(Pass& p, int64_t l, Kept& kept, bool input_gradient) {
  const LayerLayout& lay = p.layouts[static_cast<size_t>(l)];
  const LayerBuffers b = p.buffers(l);
  const bool hydra = p.config.is_hydra();
  MemoryTimeline& tl = p.tl;
  const int64_t d = p.config.head_dim;
  tl.set_stage(fmt::format("layer {} backward", l));
  std::vector<Id> held{tl.hold(b.input, activations, "mid-layer residual")};
  std::vector<Id> trace = attention_block(p, l, Mode::replay, &kept);
  {  // the MLP's tiles
    std::vector<Id> tile{tl.hold(b.tile_x_norm, activations, "MLP tile"), tl.hold(b.tile_h, activations, "MLP tile")};
    if (!kept.gate_up) tile.push_back(tl.hold(b.tile_gate_up, activations, "MLP gate/up tile"));
    tile.push_back(tl.hold(b.tile_dy, activations, "MLP tile gradient"));
    tile.push_back(tl.hold(b.tile_dh, activations, "MLP tile gradient"));
    tile.push_back(tl.hold(b.tile_dgate_up, activations, "MLP gate/up tile gradient"));
    tile.push_back(tl.hold(b.tile_dx_norm, activations, "MLP tile gradient"));
    p.release(tile);
  }
  held.push_back(tl.hold(b.dx_operand, activations, "dx operand"));
  held.push_back(tl.hold(b.d_heads, activations, "d_fused"));
  held.push_back(tl.hold(b.d_proj, activations, "d_proj"));  // the fusion gate's logit gradients are columns of it
  if (hydra && p.config.fusion != ops::Fusion::concat) held.push_back(tl.hold(b.d_heads, activations, "d_heads"));
  const BufferSpec fusion_scratch = ops::head_fusion_backward_scratch(b.d_heads.shape[0], p.config.num_heads, p.config.fusion);
  if (hydra && p.cuda() && p.config.fusion != ops::Fusion::concat && fusion_scratch.exists()) {
    std::vector<Id> rows{tl.hold(fusion_scratch, workspaces, "fusion row scalars")};  // fusion.cu: the other variants'
    p.release(rows);
  }
  if (lay.h_gdn > 0) {  // the side work first, as in the forward
    const int64_t hg = lay.h_gdn;
    std::vector<Id> branch{tl.hold(b.d_conv, activations, "d_conv"), tl.hold(b.d_qk, activations, "dq"),
                           tl.hold(b.d_qk, activations, "dk"),
                           tl.hold(b.gate, activations, "dg"), tl.hold(b.gate, activations, "dbeta")};
    // gdn_sequence_parallel_backward: the state gradient, and its fold over the ranks' segments.
    const GdnScanBuffers spec = gdn_scan_buffers(p.world, p.nlocal(), hg, d, d, p.acc);
    const BufferSpec& state = spec.state;
    const int64_t rows = p.segment_rows();
    std::vector<Id> scan{tl.hold(state, gdn_maps, "GDN state gradient")};
    if (p.world == 1) {
      scan.push_back(tl.hold(state, gdn_maps, "GDN initial state"));
    } else {
      // Each local segment's state gradient beside its kept M, gathered together.
      scan.push_back(tl.hold(spec.state_gradients, gdn_maps, "GDN local state gradients and maps"));
      if (p.cuda()) {  // delta_rule_backward.cu state_backward: prepare and the state gradient's copy
        const double prepare = gdn_prepare_bytes(rows, hg, d, true, true);
        std::vector<Id> w{tl.hold_bytes(prepare, workspaces, "GDN state backward workspace"),
                          tl.hold(state, workspaces, "GDN state gradient copy")};
        p.release(w);
      }
      scan.push_back(tl.hold(spec.gathered_state_gradients, gdn_maps, "GDN gathered state gradients and maps"));
    }
    scan.push_back(tl.hold(state, gdn_maps, "GDN zero state"));
    if (p.cuda()) {  // delta_rule_backward.cu: prepare, the chunk states and v_new, and their gradients
      const ops::DeltaRuleBackwardBuffers chunk = ops::delta_rule_backward_buffers(rows, hg, d);
      const BufferSpec &states = chunk.states, &vnew = chunk.v_new;
      std::vector<Id> w{tl.hold_bytes(gdn_prepare_bytes(rows, hg, d, true, true), workspaces, "GDN backward workspace"),
                        tl.hold(state, workspaces, "GDN state"), tl.hold(states, workspaces, "GDN chunk states"),
                        tl.hold(vnew, workspaces, "GDN v_new"), tl.hold(state, workspaces, "GDN state gradient"),
                        tl.hold(states, workspaces, "GDN chunk state gradients"),
                        tl.hold(vnew, workspaces, "GDN v_new gradient")};
      p.release(w);
    }
    p.release(scan);
    conv_halos(p, b.d_conv.shape[1], true);
    p.release(branch);
  }
  if (lay.h_fa > 0) {
    std::vector<Id> branch;
    if (hydra) branch.push_back(tl.hold(b.d_attn, activations, "d_attn"));
    branch.push_back(tl.hold(b.d_fa_q, activations, "FA dq"));
    branch.push_back(tl.hold(b.d_fa_kv, activations, "FA dk"));
    branch.push_back(tl.hold(b.d_fa_kv, activations, "FA dv"));
    const RingBuffers ring = ring_buffers(p.t * p.world, p.t, lay.h_fa, lay.g_fa, d, d, p.dtype, p.acc);
    branch.push_back(tl.hold(ring.delta, workspaces, "attention delta"));
    for (Id id : position_bounds(p)) branch.push_back(id);
    if (p.world > 1) {
      const BufferSpec &kv = ring.kv, &grads = ring.kv_gradients;
      branch.push_back(tl.hold(kv, workspaces, "ring K/V"));
      branch.push_back(tl.hold(kv, workspaces, "ring K/V in flight"));
      branch.push_back(tl.hold(grads, workspaces, "ring dK/dV"));
      branch.push_back(tl.hold(grads, workspaces, "ring dK/dV carried"));
      branch.push_back(tl.hold(grads, workspaces, "ring dK/dV in flight"));
    }
    p.release(branch);
  }
  if (input_gradient) held.push_back(tl.hold(b.d_x_norm, activations, "d_x_norm"));
  p.release(held);
  p.release(trace);
  p.release(kept.ids);
}

// Model::positions and Model::embed: positions [T] i64 (returned), x [T, D] (returned), the ids'
// device copy in between.
std::pair<Id, Id> embed(Pass& p) {
  const Id pos = p.tl.hold({{p.t}, DType::i64}, activations, "positions");
  const Id ids = p.tl.hold({{p.t}, DType::i32}, activations, "token ids");
  const Id x = p.tl.hold({{p.t, p.config.hidden_size}, p.dtype}, activations, "residual stream");
  p.tl.release(ids);
  return {pos, x};
}

// Model::forward (a plain pass): leaves the final-normed hidden states [T, D] held.
Id plain_forward(Pass& p) {
  const auto [pos, x] = embed(p);
  for (int64_t l = 0; l < p.config.num_layers; ++l) layer_forward(p, l, nullptr);
  p.tl.release(pos);
  p.tl.set_stage("final norm");
  const Id hidden = p.tl.hold({{p.t, p.config.hidden_size}, p.dtype}, activations, "final-normed hidden states");
  p.tl.release(x);
  return hidden;
}

// The runtime weights (Model's constructor: GEMM weights in the storage type, the rest in acc),
// or, with `tensors_dtype`, every tensor in that type (gradients, moments, masters); each tensor
// rounded as the device's allocator rounds it.
double runtime_tensor_bytes(const ModelConfig& c, Device device, DType dtype, DType acc,
                            std::optional<DType> tensors_dtype = {}) {
  const DType gemm = tensors_dtype.value_or(dtype), other = tensors_dtype.value_or(acc);
  double total = 0;
  const auto add = [&](const BufferSpec& b) { total += allocated_bytes(device, b.bytes()); };
  add({{c.vocab_size, c.hidden_size}, gemm});  // the embedding
  if (!c.tie_word_embeddings) add({{c.vocab_size, c.hidden_size}, gemm});  // lm_head
  add({{c.hidden_size}, other});  // the final norm
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const LayerLayout layout = layer_layout(c, l);
    for (int s = 0; s < kSlotCount; ++s) {
      const Slot slot = static_cast<Slot>(s);
      std::vector<int64_t> shape = layout.shape(slot, c);
      if (shape.empty()) continue;
      const bool is_gemm = slot == Slot::in_proj || slot == Slot::o_proj || slot == Slot::mlp_in || slot == Slot::mlp_down;
      add({std::move(shape), is_gemm ? gemm : other});
    }
  }
  return total;
}

struct Types {
  DType dtype, acc;
};
Types types_on(Device device, DType host_dtype) {
  if (device == Device::cuda) return {storage_dtype(device), DType::f32};
  return {host_dtype, host_dtype};
}

}  // namespace

MemoryEstimate estimate_prefill_memory(const ModelConfig& c, int64_t local_tokens, int world, Device device,
                                       bool documents) {
  const Types ty = types_on(device, DType::f32);
  MemoryEstimate m;
  m.weights = runtime_tensor_bytes(c, device, ty.dtype, ty.acc);
  // The parameter set the runtime copies are built from: drawn in bf16 on the GPU (a preset) or read
  // on the host (a checkpoint); f32 on the host.
  m.init_extra = static_cast<double>(parameter_count(c)) * (device == Device::cuda ? 2.0 : 4.0);
  MemoryTimeline tl(device);
  tl.set_stage("prefill");
  Pass p(c, ty.dtype, ty.acc, local_tokens, world, documents, tl);
  const Id ids = tl.hold_host({{local_tokens}, DType::i32}, activations, "token ids");
  const Id hidden = plain_forward(p);
  tl.set_stage("last logits");
  const Id logits = tl.hold({{1, c.vocab_size}, DType::f32}, workspaces, "last position's logits");
  const Id host = tl.hold_host({{1, c.vocab_size}, DType::f32}, workspaces, "logits read back");
  for (Id id : {host, logits, hidden, ids}) tl.release(id);
  m.activations = tl.peak();
  m.parts = tl.peak_parts();
  m.peak_at = tl.peak_at();
  return m;
}

MemoryEstimate estimate_forward_memory(const ModelConfig& c, int64_t total_tokens, int64_t local_tokens, int world,
                                       int rank, Device device, bool logits_out, bool documents) {
  MemoryEstimate m = estimate_prefill_memory(c, local_tokens, world, device, documents);
  // On the GPU path the device holds the logits; their host copy and the rest: forward_host_bytes.
  m.add(MemoryPart::outputs, device == Device::host
                                 ? forward_host_bytes(c, total_tokens, local_tokens, rank, logits_out)
                                 : forward_logits_bytes(c, local_tokens, logits_out));
  return m;
}

double forward_logits_bytes(const ModelConfig& c, int64_t local_tokens, bool logits_out) {
  return logits_out ? static_cast<double>(local_tokens) * static_cast<double>(c.vocab_size) *
                          static_cast<double>(dtype_size(DType::f32))
                    : 0.0;
}

double forward_host_bytes(const ModelConfig& c, int64_t total_tokens, int64_t local_tokens, int rank, bool logits_out) {
  const double logits = forward_logits_bytes(c, local_tokens, logits_out);
  // Rank 0 assembles [T, V] and receives one rank's block at a time; every rank reads all ids [T] i32.
  const double assembly = logits_out && rank == 0 ? logits + forward_logits_bytes(c, total_tokens, true) : 0.0;
  return logits + assembly + static_cast<double>(total_tokens) * static_cast<double>(dtype_size(DType::i32));
}

MemoryEstimate estimate_generation_memory(const ModelConfig& c, const std::vector<int64_t>& prompt_lengths,
                                          int64_t max_new_tokens, int world, Device device, bool sampled) {
  const Types ty = types_on(device, DType::f32);
  int64_t longest_prefill = 0, capacity = 1;
  for (const int64_t len : prompt_lengths) {
    longest_prefill = std::max(longest_prefill, prefill_length(c, len, world));
    capacity = std::max(capacity, cache_rows_needed(c, len, max_new_tokens, world));
  }
  const int64_t slots = static_cast<int64_t>(prompt_lengths.size());
  MemoryEstimate m = estimate_prefill_memory(c, std::max<int64_t>(longest_prefill / world, 1), world, device);
  double cache = 0;
  for (const KvCacheLayerSpec& s : kv_cache_spec(c, slots, capacity, ty.dtype, DType::f32)) {
    for (const BufferSpec* b : {&s.k, &s.v, &s.state, &s.conv_tail}) cache += b->exists() ? b->bytes() : 0.0;
  }
  m.add(MemoryPart::cache, cache + decode_engine_buffers(c, slots, sampled).bytes(device));
  return m;
}

double optimizer_bytes(const ModelConfig& c, Device device, DType host_dtype, int optimizer_shards) {
  const Types ty = types_on(device, host_dtype);
  // Gradients in acc, every parameter, on every rank (each accumulates its tokens' contributions).
  const double whole = runtime_tensor_bytes(c, device, ty.dtype, ty.acc, ty.acc);
  if (optimizer_shards <= 1) return 4 * whole;  // masters and both moments too
  // ZeRO-1 (model/train/optimizer.cpp): this rank's ⌈N/W⌉ of the flat masters and both moments,
  // and the buckets a step allocates (W·b send + b receive within the largest tensor and 32M elements).
  const int64_t n = parameter_count(c), w = optimizer_shards;
  int64_t largest = c.vocab_size * c.hidden_size;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const LayerLayout layout = layer_layout(c, l);
    for (int s = 0; s < kSlotCount; ++s) {
      int64_t count = 1;
      for (const int64_t d : layout.shape(static_cast<Slot>(s), c)) count *= d;
      largest = std::max(largest, count);
    }
  }
  const int64_t stride = (n + w - 1) / w;
  const int64_t bucket = std::clamp<int64_t>(std::min<int64_t>(largest, int64_t{1} << 25) / (w + 1), 1, stride);
  const double shard = allocated_bytes(device, BufferSpec{{stride}, ty.acc}.bytes());  // masters, m, v: one each
  const double sent = allocated_bytes(device, BufferSpec{{w * bucket}, ty.acc}.bytes());
  const double received = allocated_bytes(device, BufferSpec{{bucket}, ty.acc}.bytes());
  return whole + 3 * shard + sent + received;
}

MemoryEstimate estimate_training_memory(const ModelConfig& c, int64_t local_tokens, int ranks_per_sequence,
                                        const ModelConfig* teacher, Device device, bool align, KeptActivations keep,
                                        bool documents, DType host_dtype, int optimizer_shards) {
  const Types ty = types_on(device, host_dtype);
  const int64_t t = local_tokens, D = c.hidden_size;
  MemoryEstimate m;
  // Weights in the storage type; gradients, masters and moments (AdamW) in acc.
  const double optimizer = optimizer_bytes(c, device, host_dtype, optimizer_shards);
  m.optimizer = optimizer;
  m.weights = runtime_tensor_bytes(c, device, ty.dtype, ty.acc) + optimizer +
              (teacher ? runtime_tensor_bytes(*teacher, device, ty.dtype, ty.acc) : 0.0);
  m.init_extra = std::max(0.0, static_cast<double>(parameter_count(c)) * (device == Device::cuda ? 2.0 : 4.0) -
                                   optimizer);  // built before the optimizer's state exists
  MemoryTimeline tl(device);
  Pass p(c, ty.dtype, ty.acc, t, ranks_per_sequence, documents, tl, keep);
  const BufferSpec rows{{t}, DType::i32}, stream{{t, D}, ty.dtype}, stream_grad{{t, D}, ty.acc};
  const Id ids = tl.hold_host(rows, activations, "token ids"), targets = tl.hold_host(rows, activations, "targets");
  if (align) {  // alignment_gradients
    HYDRA_ASSERT(teacher, "an alignment plan without a teacher");
    Pass tp(*teacher, ty.dtype, ty.acc, t, ranks_per_sequence, documents, tl);
    tl.set_stage("teacher forward");
    const auto [pos, x] = embed(tp);
    std::vector<Id> boundary{tl.hold(stream, activations, "teacher boundary")};
    for (int64_t l = 0; l < teacher->num_layers; ++l) {
      layer_forward(tp, l, nullptr);
      boundary.push_back(tl.hold(stream, activations, "teacher boundary"));
    }
    std::vector<Id> loss{tl.hold(stream_grad, activations, "alignment gradient"),
                         tl.hold({{t}, ty.acc}, workspaces, "row losses")};
    for (int64_t l = 0; l < c.num_layers; ++l) {
      const Id y = tl.hold(stream, activations, "layer input");
      Kept kept;
      layer_forward(p, l, &kept);
      const Id target = tl.hold(stream, activations, "layer target");
      const Id host = tl.hold_host({{t}, DType::f64}, workspaces, "row losses read back");
      tl.release(host);
      tl.release(target);
      layer_backward(p, l, kept, false);
      tl.release(y);
    }
    p.release(loss);
    p.release(boundary);
    tl.release(x);
    tl.release(pos);
  } else {  // sequence_gradients
    std::optional<Id> teacher_hidden;
    if (teacher) {
      Pass tp(*teacher, ty.dtype, ty.acc, t, ranks_per_sequence, documents, tl);
      tl.set_stage("teacher forward");
      teacher_hidden = plain_forward(tp);
    }
    const auto [pos, x] = embed(p);
    std::vector<Kept> kept(static_cast<size_t>(c.num_layers));
    for (int64_t l = 0; l < c.num_layers; ++l) layer_forward(p, l, &kept[static_cast<size_t>(l)]);
    tl.set_stage("loss");
    const Id d_hidden = tl.hold(stream_grad, activations, "d_hidden");
    std::vector<Id> head{tl.hold(stream, activations, "final-normed hidden states")};
    const LossBuffers loss = loss_buffers(c, t, ty.dtype, ty.acc);
    if (teacher) head.push_back(tl.hold(loss.logits, workspaces, "teacher logits"));
    head.push_back(tl.hold_host(rows, activations, "targets on the host"));
    head.push_back(tl.hold(rows, activations, "targets"));
    head.push_back(tl.hold(loss.logits, workspaces, "logits"));
    head.push_back(tl.hold(loss.row_loss, workspaces, "row losses"));
    if (ty.dtype != ty.acc) head.push_back(tl.hold(loss.operand, workspaces, "logit gradient operand"));
    tl.release(tl.hold_host({loss.row_loss.shape, DType::f64}, workspaces, "row losses read back"));
    p.release(head);
    if (teacher_hidden) tl.release(*teacher_hidden);
    const Id dx = tl.hold(stream_grad, activations, "dx");
    tl.release(d_hidden);
    for (int64_t l = c.num_layers - 1; l >= 0; --l) layer_backward(p, l, kept[static_cast<size_t>(l)], true);
    tl.set_stage("embedding backward");
    tl.release(tl.hold(rows, activations, "token ids"));
    for (Id id : {dx, x, pos}) tl.release(id);
  }
  tl.release(targets);
  tl.release(ids);
  m.activations = tl.peak();
  m.parts = tl.peak_parts();
  m.peak_at = tl.peak_at();
  return m;
}

namespace {
struct Available {
  double bytes = 0;
  std::string where;
};
Available available_memory(Device device, int ranks_on_host) {
  Available out;
#if HYDRA_CUDA
  if (device == Device::cuda) {
    // Ranks sharing a GPU (HYDRA_SHARE_GPUS=1, parallel/device_world.h) each hold a whole copy of
    // what one rank holds: the free memory is split among as many as the most crowded GPU has.
    const int gpus = std::max(1, cuda_device_count());
    const int sharing = (std::max(1, ranks_on_host) + gpus - 1) / gpus;
    out.bytes = static_cast<double>(cuda_memory_stats().free_device) / sharing;
    out.where = sharing > 1 ? fmt::format("each of the {} ranks sharing the GPU", sharing) : std::string("the GPU");
  }
#endif
  if (device == Device::host) {
    out.bytes = host_available_bytes() / std::max(1, ranks_on_host);
    out.where = ranks_on_host > 1 ? fmt::format("each of this host's {} ranks", ranks_on_host) : std::string("this host");
  }
  return out;
}
}  // namespace

bool fits_in(const MemoryEstimate& estimate, double bytes) { return estimate.total() < 0.95 * bytes; }

bool fits_memory_plan(const MemoryEstimate& estimate, Device device, int ranks_on_host) {
  return fits_in(estimate, available_memory(device, ranks_on_host).bytes);
}

void check_memory_plan(const MemoryEstimate& estimate, Device device, const std::string& what, int ranks_on_host,
                       const std::string& remedy) {
  const double g = 1024.0 * 1024.0 * 1024.0;
  const Available available = available_memory(device, ranks_on_host);
  HYDRA_USER_CHECK(fits_in(estimate, available.bytes), "{} needs about {} per rank, but {} has {:.1f} GiB "
                   "available; {}", what, estimate.describe(), available.where, available.bytes / g, remedy);
}

KeptPolicy parse_kept_policy(const std::string& name) {
  if (name == "none") return KeptPolicy::none;
  if (name == "gdn") return KeptPolicy::gdn;
  if (name == "gdn+proj") return KeptPolicy::gdn_proj;
  if (name == "gdn+proj+mlp") return KeptPolicy::gdn_proj_mlp;
  if (name == "auto") return KeptPolicy::most_that_fits;
  HYDRA_USER_FAIL("--kept-activations must be none, gdn, gdn+proj, gdn+proj+mlp or auto (got '{}')", name);
}

KeptActivations choose_kept_activations(KeptPolicy policy, int64_t layers,
                                        const std::function<MemoryEstimate(const KeptActivations&)>& plan,
                                        Device device, int ranks_on_host, Communicator& comm) {
  const KeptActivations gdn{.gdn_outputs = true}, gdn_proj{.gdn_outputs = true, .projection = true};
  switch (policy) {
    case KeptPolicy::none: return {};
    case KeptPolicy::gdn: return gdn;
    case KeptPolicy::gdn_proj: return gdn_proj;
    case KeptPolicy::gdn_proj_mlp: return {.gdn_outputs = true, .projection = true, .mlp_layers = layers};
    case KeptPolicy::most_that_fits: break;
  }
  std::vector<KeptActivations> candidates;  // most kept first
  for (int64_t n = layers; n >= 1; --n) candidates.push_back({.gdn_outputs = true, .projection = true, .mlp_layers = n});
  candidates.push_back(gdn_proj);
  candidates.push_back(gdn);
  candidates.push_back({});
  Tensor misfits = Tensor::empty({static_cast<int64_t>(candidates.size())}, DType::f64);
  for (size_t i = 0; i < candidates.size(); ++i) {
    misfits.data_as<double>()[i] = fits_memory_plan(plan(candidates[i]), device, ranks_on_host) ? 0.0 : 1.0;
  }
  all_reduce_sum_host(comm, misfits);  // every rank sees every rank's misfits: all choose the same
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (misfits.data_as<double>()[i] == 0.0) return candidates[i];
  }
  return candidates.back();
}

}  // namespace hydra

