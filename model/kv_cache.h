// The generation cache (DESIGN.md §1.6): what a prefill forward leaves behind for decode steps, and
// the decode step's reads and appends. The layer itself (Model::attention_block) calls the hooks
// below when ForwardContext::cache is set, so prefill, training and decode run one implementation.
//
// Per layer and slot (one slot per sequence of a batch):
//   k, v       [S, capacity, G_c, d]: the FA KV heads' keys after k_norm (teacher: and RoPE) and
//              values, only the G_c KV groups the layer's FA heads read (G_fa; all G for the
//              teacher); this rank's rows only: after a sequence-parallel prefill the K/V of its own
//              zigzag segments (never gathered), then the decode tokens it was dealt (round robin:
//              the token at position p ≥ prefilled goes to rank (p − prefilled) mod P), so the ranks'
//              shares differ by at most one row. Row order is irrelevant to attention (no mask: every
//              cached key precedes the query), so rows are kept in arrival order.
//   state      [S, H_gdn, d, d] acc dtype (fp32 on the GPU): the GDN state after the last cached token.
//   conv_tail  [S, K−1, 3·H_gdn·d]: the pre-conv q|k|v inputs of the last K−1 cached tokens (zeros
//              before a sequence's first token).
// The GDN state and conv tail are replicated: every rank holds them, so every rank runs the GDN heads
// of a decode step itself (the step's token-local work is replicated; only FA attention is split).
// After a prefill the owner of the last zigzag segment (rank 0) has them and end_prefill broadcasts
// them (one broadcast per layer and tensor).
//
// Decode step (begin_decode … end_decode around Model::decode_step): row b of the step is the next
// token of slot slots[b], at position tokens(slot). In each layer, attend() appends the row's K/V on
// the rank it is dealt to, attends the query against this rank's rows (ops::attention_decode, split
// KV on the GPU) and, with P > 1, all-gathers every rank's partial (out, lse) ([B·H_fa·d + H_fa·B]
// fp32 per rank) and merges them by log-sum-exp in fp32 in rank order, the same on every rank: one
// small collective per layer with FA heads.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/attention/attention.h"
#include "kernels/delta_rule/delta_rule.h"
#include "kernels/gdn_decode/gdn_decode.h"
#include "kernels/gdn_qk/gdn_qk.h"
#include "model/config.h"
#include "parallel/communicator.h"
#include "parallel/layout.h"
#include "runtime/buffer_spec.h"
#include "runtime/phase_timer.h"
#include "runtime/tensor.h"

namespace hydra {

class Model;

struct KvCacheLayer {
  Tensor k, v;       // [S, cap, G_c, d] dtype(); undefined in a layer without FA heads
  Tensor state;      // [S, H_gdn, d, d] acc dtype; undefined without GDN heads
  Tensor conv_tail;  // [S, K−1, 3·H_gdn·d] dtype(); undefined without GDN heads or with K = 1
};

// The shapes of a cache, the one description the constructor allocates from and kv_cache_bytes
// prices: per layer, the buffers of KvCacheLayer (an empty shape: the buffer does not exist).
struct KvCacheLayerSpec {
  BufferSpec k, v, state, conv_tail;
};
std::vector<KvCacheLayerSpec> kv_cache_spec(const ModelConfig& config, int64_t slots, int64_t capacity, DType dtype,
                                            DType acc_dtype);

// Sizes of a cache, in bytes (from kv_cache_spec).
struct KvCacheBytes {
  double per_token = 0;  // K/V of one token over all layers (all ranks together)
  double per_slot = 0;   // GDN states and conv tails of one sequence (replicated on every rank)
};
KvCacheBytes kv_cache_bytes(const ModelConfig& config, DType dtype, DType acc_dtype);

// The dealing rule of decode tokens (the one place it is written): the token at position p ≥
// prefilled of a sequence goes to rank (p − prefilled) mod P, so the ranks' shares of n decode
// tokens differ by at most one row and the busiest rank keeps ⌈n / P⌉.
struct DecodeDealing {
  int64_t prefilled = 0;
  int world = 1;
  int owner(int64_t position) const { return static_cast<int>((position - prefilled) % world); }
  static int64_t most_rows(int64_t tokens, int world) { return (tokens + world - 1) / world; }
};

class KvCache {
 public:
  // `slots` sequences, each with room for `capacity` K/V rows on this rank; rank and world size of
  // the communicator the forward runs on. Zero-filled.
  KvCache(const Model& model, int64_t slots, int64_t capacity, int world_size, int rank);

  int64_t slots() const { return static_cast<int64_t>(tokens_.size()); }
  int64_t capacity() const { return capacity_; }
  int64_t tokens(int64_t slot) const { return tokens_.at(static_cast<size_t>(slot)); }      // positions cached
  int64_t local_rows(int64_t slot) const { return local_.at(static_cast<size_t>(slot)); }  // K/V rows here
  const KvCacheLayer& layer(int64_t l) const { return layers_.at(static_cast<size_t>(l)); }
  KvCacheLayer& mutable_layer(int64_t l) { return layers_.at(static_cast<size_t>(l)); }
  // Bytes this rank allocated.
  double allocated_bytes() const;
  // Marks slot `slot` as holding `tokens` positions of which this rank keeps `rows` K/V rows (the
  // decode benchmark fills caches with random values instead of running a prefill).
  void set_filled(int64_t slot, int64_t tokens, int64_t rows);

  // ---- Prefill: a forward over `layout` (the first layout.total_length() tokens of the slot's
  // sequence, which must be empty) stores into `slot`; end_prefill (collective) replicates the GDN
  // state and conv tail from the owner of the last segment and records the slot's length.
  void begin_prefill(int64_t slot, const SequenceLayout& layout);
  void end_prefill(Communicator& comm);

  // ---- Decode: one row per slot in `slots` (distinct), each the token at position tokens(slot).
  // The step's rows are written in place into a persistent buffer (one upload a step); its one
  // tensor, positions(), comes from the step arena when a decode engine runs the step, so a step
  // allocates nothing after the first and its buffers keep their addresses (a CUDA graph replays them).
  void begin_decode(std::span<const int64_t> slots);
  void end_decode();
  const Tensor& positions() const { return positions_; }  // [B] int64 on the device
  // Whether attention chunks its keys for the whole capacity instead of the step's longest row:
  // fixed launch shapes for every step, which a captured CUDA graph needs (model/decode_engine.h).
  void set_whole_capacity(bool on) { whole_capacity_ = on; }

  // ---- Hooks of the layer (model_forward.cpp) ----
  bool decoding() const { return mode_ == Mode::decode; }
  // Prefill: this rank's K/V rows k [T_loc, G_c, d], v [T_loc, G_c, d].
  void store_kv(int64_t layer, const TensorView& k, const TensorView& v);
  // Prefill: the state [H_gdn, d, d] the GDN scan leaves after the last token, on the rank owning the
  // last segment; an undefined view elsewhere.
  TensorView final_state(int64_t layer) const;
  // Prefill: x [T_loc, 3·H_gdn·d], the layer's pre-conv inputs; the owner of the last segment keeps
  // its last K−1 rows.
  void store_conv_tail(int64_t layer, const TensorView& x);
  // Decode: out [B, H_fa, d] (acc dtype) ← attention of q [B, H_fa, d] against the slot's cache after
  // appending k [B, G_c, d], v [B, G_c, d] where dealt; merged over the ranks of `comm`.
  void attend(Communicator& comm, int64_t layer, const TensorView& out, const TensorView& q, const TensorView& k,
              const TensorView& v, const ops::AttentionParams& params, PhaseTimer* timer) const;
  // Decode: ops::gdn_decode_step (the GDN branch: conv step, gates, delta-rule step) with the
  // layer's state and conv tail of the slots (both advanced), at positions(); t's cache fields are set here.
  void gdn_decode(int64_t layer, ops::GdnDecodeTensors t, const ops::GdnQkParams& qk,
                  const ops::DeltaRuleParams& rule) const;

 private:
  enum class Mode { idle, prefill, decode };
  DecodeDealing dealing(int64_t slot) const { return {prefilled_[static_cast<size_t>(slot)], world_}; }

  Device device_;
  DType dtype_, acc_;
  int world_ = 1, rank_ = 0;
  int64_t capacity_ = 0, halo_ = 0;
  std::vector<KvCacheLayer> layers_;
  std::vector<int64_t> tokens_, local_, prefilled_;  // per slot
  Mode mode_ = Mode::idle;
  // Prefill in progress.
  int64_t prefill_slot_ = -1;
  SequenceLayout prefill_layout_;
  // Decode step in progress: rows' slots, positions, visible local keys and append rows (−1: not here).
  std::vector<int64_t> step_slots_;
  int64_t step_max_length_ = 0;
  bool whole_capacity_ = false;
  // The persistent step buffer [positions i64 [S] | slots i32 [S] | lengths i32 [S] | append i32 [S]]
  // on the device and its host staging; rows 0..B−1 of each part are the step's.
  Tensor step_device_, step_host_;
  Tensor positions_;                             // [B] i64: a copy of step_device_'s positions
  TensorView slots_, lengths_, append_;          // [B] i32 views of step_device_
  // attend() with P > 1: this rank's packed partial [B·(H_fa·d + H_fa)], every rank's, the merged
  // lse: sized for S rows and the layer with the most FA heads, used in place every layer.
  Tensor part_, parts_, merged_lse_;
};

}  // namespace hydra
