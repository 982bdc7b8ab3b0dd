// Internal interface of the GPU gated delta rule (chunk C = 64, head dim D = dk = dv ∈ {64, 128}):
// the forward's stages, for the orchestration in delta_rule_forward.cu and for the backward
// (delta_rule_backward.cu), which recomputes chunk states with the same state pass.
//
// Notation (delta_rule.h): per chunk, γ = cumulative log decay, β, K, V, Q its rows (rows past the
// end of the sequence are zeros with g = β = 0: identity steps).
//  1. prepare (delta_rule_prepare.cu), parallel over chunks × heads: γ; T = (I + L)⁻¹ with
//     L_ij = β_i k_i·k_j e^{γ_i−γ_j} (j < i). The inverse is computed without the gate: L = E L₀ E⁻¹
//     with E = diag(e^γ), so T = E (I + L₀)⁻¹ E⁻¹, i.e. T_ij = T₀_ij e^{γ_i−γ_j} (≤ 1 factors only);
//     T₀ by 16×16 diagonal blocks (forward substitution) merged 16→32→64 by tensor-core products.
//     With q also P = scale · (Q Kᵀ ⊙ E_ij) (j ≤ i), the intra-chunk attention of the output.
//  2. state pass (delta_rule_state.cu), sequential over the chunks of a segment, parallel over
//     (tile, head, segment), one CTA per SM on warpgroup tensor cores (wgmma): the whole D × D
//     state S stays in registers (fp32, D/64 warpgroups of 64 columns) and
//       V' = T (β ⊙ (V − e^γ ⊙ K S))       (= U − W S of the WY form; W and U are never formed)
//       O  = scale · e^γ ⊙ (Q S) + P V'     (with an output)
//       S ← e^{γ_C} S + Kᵀ (e^{γ_C−γ} ⊙ V')
//     Map tiles run the same recurrence on the columns of M (V = 0, M starts as I), which gives
//     a segment's affine map S_out = M S_in + S_ext (S_ext: the value tile started from zeros).
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/vector.cuh"
#include "kernels/delta_rule/delta_rule.h"

namespace hydra::ops::cuda_impl::gdn {

constexpr int kChunk = static_cast<int>(kDeltaRuleChunk);

// The 8 bf16 of a 16-byte chunk, each times f (rounded to nearest).
__device__ __forceinline__ uint4 scaled8(uint4 x, float f) {
  float v[8];
  cuda::unpack_bf16<8>(x, v);
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] *= f;
  return cuda::pack_bf16_word<8>(v);
}

struct Rows {  // [T, H, D] bf16 rows or [T, H] f32 gates: element (t, h) at ptr + t·st + h·sh
  const void* ptr = nullptr;
  int64_t st = 0, sh = 0;
};
inline Rows rows_of(const TensorView& x) { return Rows{x.data(), x.stride(0), x.stride(1)}; }

// Stage 1. gamma [chunks, H, 64] f32; factors [chunks, H, 4, 64] f32 (per row: β, β e^γ, e^{γ_C−γ},
// e^γ; β = 0 past the end), the state pass's elementwise factors; t, p [chunks, H, 64, 64] bf16
// row-major (p empty without q).
// For the backward (delta_rule_backward.cu) also w = T (β e^γ K), kt = K̃ = e^{γ_C−γ} K and
// qh = Q̂ = scale·e^γ Q, [chunks, H, 64, D] bf16 (p is the backward's Ã).
struct ChunkPrep {
  Tensor gamma, factors, t, p;
  Tensor w, kt, qh;  // PrepareFor::backward only
  int chunks = 0;
};
enum class PrepareFor { forward, backward };
// q may be an undefined view (TensorView(): maps need no outputs; test defined(), not numel(), which
// is 1 for a rank-0 view; the backward needs q). k: [T, H, D] bf16; g, beta: [T, H] f32.
ChunkPrep prepare(const TensorView& q, const TensorView& k, const TensorView& g, const TensorView& beta, float scale,
                  PrepareFor use = PrepareFor::forward);

// Stage 2: one launch over `segments` chunk ranges [s·cps, min((s+1)·cps, chunks)) × heads × tiles
// (the value tile S and, with map_tiles, the map tile M: one CTA each, D × D).
// Per segment s, [H, D, D] f32 blocks at s · segment_stride of state_in / state_out / map_out.
struct StatePassArgs {
  const bf16_t* t;      // ChunkPrep::t
  const bf16_t* p;      // ChunkPrep::p (with an output)
  const float* gamma;   // ChunkPrep::gamma
  const float* factors;  // ChunkPrep::factors
  Rows q, k, v, beta;   // the sequence (q only with an output)
  int t_len = 0, chunks = 0, heads = 0;
  int segments = 1, chunks_per_segment = 0;
  bool map_tiles = false;          // also run M (started from I, values 0); not with outputs
  const float* state_in = nullptr;  // initial S of the value tile (null: zeros)
  float* state_out = nullptr;       // final S of the value tile (null: not kept)
  float* map_out = nullptr;         // final M of the map tile
  int64_t segment_stride = 0;       // elements between segments' blocks (0: one shared block)
  bf16_t* out = nullptr;            // [T, H, D] outputs of the value tile (null: none)
  int64_t out_st = 0, out_sh = 0;
  float scale = 1.0f;               // query scale of the output (also folded into p)
  bf16_t* chunk_states = nullptr;   // optional [chunks, H, D, D] bf16: each chunk's starting S (backward)
  bf16_t* vnew = nullptr;           // optional [chunks, H, 64, D] bf16: each chunk's V' (backward)
};
void state_pass(const StatePassArgs& args, int head_dim);

// The sequential fold of segment maps (delta_rule_forward.cu), all steps and heads in one launch:
// states[s+1] = M_s · states[s] (+ add_s), s = 0 .. steps−1, in fp32, states[0] set by the caller.
// m, add: [≥ steps, H, D, D]; states: [≥ steps + 1, H, D, D], each with contiguous [H, D, D]
// slices (D = 64 or 128); add null: no addend. (It was a copy and a batched cuBLAS GEMM per step;
// the training profile showed the GPU idle while the host issued them; cluster/results/h200-2026-12-04.)
void fold_maps(const TensorView& m, const TensorView* add, const TensorView& states, int steps);

// DeltaRuleParams::profile: each marked stage's time (CUDA events), printed to stderr at scope exit.
// `label` starts the line (the backward prints its own).
struct StageProfile {
  StageProfile(const char* label, bool on) : label(label), on(on) {}
  const char* label;
  bool on = false;
  std::vector<std::pair<const char*, std::unique_ptr<CudaEvent>>> marks;
  void mark(const char* name) {
    if (!on) return;
    marks.emplace_back(name, std::make_unique<CudaEvent>(true));
    marks.back().second->record(current_stream());
  }
  ~StageProfile() {
    if (!on || marks.size() < 2) return;
    marks.back().second->synchronize();
    std::string line = fmt::format("{}:", label);
    for (size_t i = 1; i < marks.size(); ++i)
      line += fmt::format(" {} {:.3f} ms", marks[i].first, marks[i].second->elapsed_ms_since(*marks[i - 1].second));
    std::fprintf(stderr, "%s\n", line.c_str());
  }
};

// The sequential part of the chunked form over prepared chunks (delta_rule_forward.cu): with `segments`
// > 1 (0: chosen from the shape) the maps of segments 0..S−2 and their fold, then the state pass of
// every segment. state [H, D, D] f32: initial state in, final state out. With `out` defined the
// outputs are fused in (q, scale); chunk_states / vnew (null: not kept) record every chunk's
// starting state and V' for the backward. profile (null: none) gets the marks of the split.
struct StatePassRecord {
  bf16_t* chunk_states = nullptr;  // [chunks, H, D, D] bf16
  bf16_t* vnew = nullptr;          // [chunks, H, 64, D] bf16
};
void sequential_pass(const ChunkPrep& prep, const TensorView& out, const TensorView& state, const TensorView& q,
                     const TensorView& k, const TensorView& v, const TensorView& beta, float scale, int segments,
                     const StatePassRecord& record, StageProfile* profile);

}  // namespace hydra::ops::cuda_impl::gdn
