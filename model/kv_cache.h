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
#include "kernels/gdn_qk/gdn_qk.h"
#include "model/config.h"
#include "parallel/communicator.h"
#include "parallel/layout.h"
#include "runtime/phase_timer.h"
#include "runtime/tensor.h"

namespace hydra {

class Model;

struct KvCacheLayer {
  Tensor k, v;       // [S, cap, G_c, d] dtype(); undefined in a layer without FA heads
  Tensor state;      // [S, H_gdn, d, d] acc dtype; undefined without GDN heads
  Tensor conv_tail;  // [S, K−1, 3·H_gdn·d] dtype(); undefined without GDN heads or with K = 1
};

// Sizes of a cache, in bytes.
struct KvCacheBytes {
  double per_token = 0;  // K/V of one token over all layers (all ranks together)
  double per_slot = 0;   // GDN states and conv tails of one sequence (replicated on every rank)
};
KvCacheBytes kv_cache_bytes(const ModelConfig& config, DType dtype, DType acc_dtype);

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
  void begin_decode(std::span<const int64_t> slots);
  void end_decode();
  const Tensor& positions() const { return positions_; }  // [B] int64 on the device

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
  // Decode: ops::gdn_qkv_conv_step against the slots' conv tails (advanced), at positions().
  void conv_step(int64_t layer, const TensorView& out, const TensorView& inv_norm, const TensorView& x,
                 const TensorView& w, const ops::GdnQkParams& params) const;
  // Decode: ops::delta_rule_step on the slots' states.
  void gdn_step(int64_t layer, const TensorView& out, const TensorView& q, const TensorView& k, const TensorView& v,
                const TensorView& g, const TensorView& beta, const ops::DeltaRuleParams& params) const;

 private:
  enum class Mode { idle, prefill, decode };
  // The rank a decode token at `position` of `slot` is dealt to.
  int owner_of_token(int64_t slot, int64_t position) const;

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
  Tensor slots_, positions_, lengths_, append_;  // [B] on the device: int32, int64, int32, int32
};

}  // namespace hydra
