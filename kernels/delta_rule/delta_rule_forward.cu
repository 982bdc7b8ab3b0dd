// The GPU gated delta rule forward: argument checks, the choice of implementation, and the
// orchestration of the stages of delta_rule_cuda.cuh.
//
// chunked (one sequence, initial state in, final state out):
//   1. prepare: γ, T, P for every (chunk, head), in parallel;
//   2. with S > 1 segments (enough (head, segment) CTAs to fill the GPU, one CTA per SM each
//      holding a whole D × D state or map): the maps (M, S_ext) of segments 0 .. S−2, all in
//      parallel; a short sequential fold in one launch (fold_kernel), S_in(s+1) = M_s S_in(s) +
//      S_ext(s), gives every segment its initial state;
//   3. the state pass of every segment in parallel, outputs fused in.
// segment_map (sequence parallelism): prepare without queries, the maps of S segments in one
// launch, composed by the same fold.
// DeltaRuleParams::profile prints each stage's time (CUDA events) to stderr (gdn::StageProfile).
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/delta_rule/delta_rule.h"
#include "kernels/delta_rule/delta_rule_cuda.cuh"
#include "kernels/matmul/matmul.h"

namespace hydra::ops::cuda_impl {


namespace {

using gdn::fold_maps;
using gdn::kChunk;
using gdn::StageProfile;

}  // namespace

namespace {

// Segments of the in-GPU split. Every CTA of the state pass holds one SM (a (head, segment)'s
// whole D × D state, or a map), so a launch's time is modelled as (waves of CTAs over the SMs) ×
// (chunks per segment) × (one chunk step: 64 with outputs, 40 without, in the same units), plus
// ≈ 500 units per fold step (priced when a step was a copy and a batched cuBLAS GEMM; the
// one-launch fold_kernel costs far less, so this overstates it — at 14 heads the choice is set by
// the waves, not by this term). chunked runs the maps of segments
// 0..S−2 (2 CTAs per head each: S_ext and M), then the state pass of all S (one CTA per head);
// segment_map (state_pass false) runs the maps of all S. The S with the smallest modelled time
// wins (segments of at least 16 chunks, at most 64 segments). At 14 heads on 132 SMs this picks
// 9 segments for 32K..512K tokens (126 state CTAs: one wave).
int auto_segments(int chunks, int heads, bool state_pass, bool outputs) {
  const int64_t slots = cuda::sm_count();
  auto waves = [&](int64_t ctas) { return (ctas + slots - 1) / slots; };
  int best = 1;
  int64_t best_cost = INT64_MAX;
  for (int s = 1; s <= std::min(64, std::max(1, chunks / 16)); ++s) {
    const int64_t per_segment = (chunks + s - 1) / s;
    const int64_t maps = int64_t{state_pass ? s - 1 : s} * 2 * heads;
    const int64_t states = state_pass ? waves(int64_t{s} * heads) * (outputs ? 64 : 40) : 0;
    const int64_t cost = (waves(maps) * 40 + states) * per_segment + 500 * int64_t{s - 1};
    if (cost < best_cost) {
      best_cost = cost;
      best = s;
    }
  }
  return best;
}

void check_rows(const TensorView& x, const char* what) {
  cuda::expect_cuda(x, what, DType::bf16);
  HYDRA_ASSERT(x.stride(2) == 1 && x.stride(0) % 8 == 0 && x.stride(1) % 8 == 0 &&
                   reinterpret_cast<uintptr_t>(x.data()) % 16 == 0,
               "CUDA delta rule: {} rows must be 16-byte aligned", what);
}

void check_common(const TensorView& k, const TensorView& v, const TensorView& g, const TensorView& beta,
                  const DeltaRuleParams& params) {
  check_rows(k, "k");
  check_rows(v, "v");
  cuda::expect_cuda(g, "g", DType::f32);
  cuda::expect_cuda(beta, "beta", DType::f32);
  HYDRA_ASSERT(k.size(2) == v.size(2) && (k.size(2) == 64 || k.size(2) == 128),
               "CUDA delta rule supports dk = dv in {{64, 128}}, got {}/{}", k.size(2), v.size(2));
  HYDRA_ASSERT(params.chunk == kChunk, "CUDA delta rule uses chunks of {}", kChunk);
  HYDRA_ASSERT(k.size(0) <= INT32_MAX, "CUDA delta rule: more than 2^31 tokens");
}

gdn::StatePassArgs pass_args(const gdn::ChunkPrep& prep, const TensorView& k, const TensorView& v,
                             const TensorView& beta, int segments) {
  gdn::StatePassArgs a;
  a.t = prep.t.data_as<bf16_t>();
  a.p = prep.p.defined() ? prep.p.data_as<bf16_t>() : nullptr;
  a.gamma = prep.gamma.data_as<float>();
  a.factors = prep.factors.data_as<float>();
  a.k = gdn::rows_of(k);
  a.v = gdn::rows_of(v);
  a.beta = gdn::rows_of(beta);
  a.t_len = static_cast<int>(k.size(0));
  a.chunks = prep.chunks;
  a.heads = static_cast<int>(k.size(1));
  a.segments = segments;
  a.chunks_per_segment = (prep.chunks + segments - 1) / segments;
  return a;
}

// The maps (M, S_ext) of `segments` consecutive chunk ranges: [segments, H, D, D] each.
std::pair<Tensor, Tensor> segment_maps(const gdn::ChunkPrep& prep, const TensorView& k, const TensorView& v,
                                       const TensorView& beta, int segments, int chunks_per_segment) {
  const int64_t heads = k.size(1), d = k.size(2);
  Tensor s_ext = Tensor::empty({segments, heads, d, d}, DType::f32, Device::cuda);
  Tensor m = Tensor::empty({segments, heads, d, d}, DType::f32, Device::cuda);
  gdn::StatePassArgs a = pass_args(prep, k, v, beta, segments);
  a.chunks_per_segment = chunks_per_segment;
  a.map_tiles = true;
  a.state_out = s_ext.data_as<float>();
  a.map_out = m.data_as<float>();
  a.segment_stride = heads * d * d;
  gdn::state_pass(a, static_cast<int>(d));
  return {std::move(s_ext), std::move(m)};
}

void chunked_fused(const TensorView& out, const TensorView& state, const TensorView& q, const TensorView& k,
                   const TensorView& v, const TensorView& g, const TensorView& beta, float scale, int segments,
                   GdnProfile profiling) {
  StageProfile profile("gdn stages", profiling != GdnProfile::off);
  profile.mark("start");
  const gdn::ChunkPrep prep = gdn::prepare(q, k, g, beta, scale);
  profile.mark("prepare");
  gdn::sequential_pass(prep, out, state, q, k, v, beta, scale, segments, {}, &profile);
}

void segment_map_fused(const TensorView& m, const TensorView& s_ext, const TensorView& k, const TensorView& v,
                       const TensorView& g, const TensorView& beta, int segments) {
  const int64_t heads = k.size(1), d = k.size(2);
  const gdn::ChunkPrep prep = gdn::prepare(TensorView(), k, g, beta, 1.0f);
  if (segments == 0) segments = auto_segments(prep.chunks, static_cast<int>(heads), false, false);
  segments = std::max(1, std::min(segments, prep.chunks));
  const int per_segment = (prep.chunks + segments - 1) / segments;
  segments = (prep.chunks + per_segment - 1) / per_segment;
  const std::pair<Tensor, Tensor> parts = segment_maps(prep, k, v, beta, segments, per_segment);
  if (segments == 1) {
    copy_into(s_ext, parts.first.view().select(0, 0));
    copy_into(m, parts.second.view().select(0, 0));
    return;
  }
  // Compose: S_ext = the parts' S_ext folded from 0; M = M_{S−1} ⋯ M_0.
  Tensor acc = Tensor::empty({segments + 1, heads, d, d}, DType::f32, Device::cuda);
  fill(acc.view().select(0, 0), 0.0f);
  const TensorView ext = parts.first;
  fold_maps(parts.second, &ext, acc, segments);
  copy_into(s_ext, acc.view().select(0, segments));
  copy_into(acc.view().select(0, 0), parts.second.view().select(0, 0));
  fold_maps(parts.second.view().narrow(0, 1, segments - 1), nullptr, acc, segments - 1);
  copy_into(m, acc.view().select(0, segments - 1));
}

}  // namespace

namespace gdn {
void sequential_pass(const ChunkPrep& prep, const TensorView& out, const TensorView& state, const TensorView& q,
                     const TensorView& k, const TensorView& v, const TensorView& beta, float scale, int segments,
                     const StatePassRecord& record, StageProfile* profile) {
  const int64_t heads = k.size(1), d = k.size(2);
  auto mark = [&](const char* name) {
    if (profile) profile->mark(name);
  };
  if (segments == 0) segments = auto_segments(prep.chunks, static_cast<int>(heads), true, out.defined());
  segments = std::max(1, std::min(segments, prep.chunks));
  StatePassArgs a = pass_args(prep, k, v, beta, segments);
  segments = (prep.chunks + a.chunks_per_segment - 1) / a.chunks_per_segment;  // no empty trailing segment
  a.segments = segments;
  if (out.defined()) {
    a.q = rows_of(q);
    a.out = out.data_as<bf16_t>();
    a.out_st = out.stride(0);
    a.out_sh = out.stride(1);
    a.scale = scale;
  }
  a.chunk_states = record.chunk_states;
  a.vnew = record.vnew;
  Tensor inits;
  if (segments > 1) {
    const std::pair<Tensor, Tensor> maps = segment_maps(prep, k, v, beta, segments - 1, a.chunks_per_segment);
    mark("maps");
    inits = Tensor::empty({segments, heads, d, d}, DType::f32, Device::cuda);
    copy_into(inits.view().select(0, 0), state);
    const TensorView s_ext = maps.first;
    fold_maps(maps.second, &s_ext, inits, segments - 1);
    mark("fold");
    a.state_in = inits.data_as<float>();
    a.state_out = inits.data_as<float>();  // each segment's final state over its initial one
    a.segment_stride = heads * d * d;
  } else {
    a.state_in = state.data_as<float>();
    a.state_out = state.data_as<float>();
  }
  state_pass(a, static_cast<int>(d));
  mark(out.defined() ? "states+outputs" : "states");
  if (segments > 1) copy_into(state, inits.view().select(0, segments - 1));  // the last segment's final state
}

namespace {

// The fold in one launch: CTA (column tile of kFoldCols, head), 2·D threads; thread (r, half) owns
// row r and columns 8·half .. 8·half+7 of the tile. The tile of the state stays in shared memory
// (double-buffered across steps); M_s goes through shared memory in chunks of kFoldK columns, loaded
// with coalesced float4 reads (8 lanes per 128-byte row piece) while the previous chunk is used, and
// read back conflict-free (row pitch kFoldK + 1). fp32 FMAs over k in order (as a plain fp32 GEMM;
// the summation order differs from cuBLAS's, the precision does not). A first version read each
// thread's row of M straight from global memory (32 rows per warp access, uncoalesced) and was
// slower than this one (cluster/results/h200-2026-12-05, run1 against final).
constexpr int kFoldCols = 16, kFoldK = 16;

struct FoldArgs {
  const float* m;
  const float* add;  // null: no addend
  float* states;
  int64_t m_step, add_step, states_step;  // elements between consecutive s
  int steps;
};

template <int D>
__global__ void __launch_bounds__(2 * D) fold_kernel(const FoldArgs a) {
  constexpr int kThreadsFold = 2 * D, kChunks = D / kFoldK;
  constexpr int kLoads = D * kFoldK / 4 / kThreadsFold;  // float4 loads per thread per chunk
  __shared__ __align__(16) float x[2][D][kFoldCols];
  __shared__ float mt[2][D][kFoldK + 1];
  const int head = blockIdx.y, c0 = blockIdx.x * kFoldCols;
  const int r = threadIdx.x % D, c = (threadIdx.x / D) * 8;
  const int64_t head_offset = int64_t(head) * D * D;
  for (int i = threadIdx.x; i < D * kFoldCols; i += kThreadsFold) {
    x[0][i / kFoldCols][i % kFoldCols] = a.states[head_offset + int64_t(i / kFoldCols) * D + c0 + i % kFoldCols];
  }
  // Chunk q of the whole fold (step q / kChunks, columns kFoldK·(q % kChunks) ..): this thread's loads.
  float4 next[kLoads];
  auto fetch = [&](int q) {
    const float* m = a.m + (q / kChunks) * a.m_step + head_offset + (q % kChunks) * kFoldK;
#pragma unroll
    for (int l = 0; l < kLoads; ++l) {
      const int idx = threadIdx.x + l * kThreadsFold, row = idx / (kFoldK / 4), quad = idx % (kFoldK / 4);
      next[l] = __ldg(reinterpret_cast<const float4*>(m + int64_t(row) * D + 4 * quad));
    }
  };
  auto stash = [&](int buffer) {
#pragma unroll
    for (int l = 0; l < kLoads; ++l) {
      const int idx = threadIdx.x + l * kThreadsFold, row = idx / (kFoldK / 4), quad = idx % (kFoldK / 4);
      float* dst = &mt[buffer][row][4 * quad];
      dst[0] = next[l].x, dst[1] = next[l].y, dst[2] = next[l].z, dst[3] = next[l].w;
    }
  };
  const int total = a.steps * kChunks;
  fetch(0);
  stash(0);
  if (total > 1) fetch(1);
  __syncthreads();
  float acc[8] = {};
  for (int q = 0; q < total; ++q) {
    const int s = q / kChunks, k0 = (q % kChunks) * kFoldK;
    const float(*xs)[kFoldCols] = x[s % 2];
    const float(*ms)[kFoldK + 1] = mt[q % 2];
#pragma unroll 8
    for (int kk = 0; kk < kFoldK; ++kk) {
      const float mv = ms[r][kk];
      const float4 lo = *reinterpret_cast<const float4*>(&xs[k0 + kk][c]);
      const float4 hi = *reinterpret_cast<const float4*>(&xs[k0 + kk][c + 4]);
      acc[0] = fmaf(mv, lo.x, acc[0]);
      acc[1] = fmaf(mv, lo.y, acc[1]);
      acc[2] = fmaf(mv, lo.z, acc[2]);
      acc[3] = fmaf(mv, lo.w, acc[3]);
      acc[4] = fmaf(mv, hi.x, acc[4]);
      acc[5] = fmaf(mv, hi.y, acc[5]);
      acc[6] = fmaf(mv, hi.z, acc[6]);
      acc[7] = fmaf(mv, hi.w, acc[7]);
    }
    if (q + 1 < total) stash((q + 1) % 2);  // the other buffer: last read in chunk q − 1, before the barrier
    if (q + 2 < total) fetch(q + 2);
    if (q % kChunks == kChunks - 1) {  // the step's last chunk: the new state row
      const int64_t at = head_offset + int64_t(r) * D + c0 + c;
      if (a.add != nullptr) {
        const float4 lo = __ldg(reinterpret_cast<const float4*>(a.add + s * a.add_step + at));
        const float4 hi = __ldg(reinterpret_cast<const float4*>(a.add + s * a.add_step + at + 4));
        acc[0] += lo.x, acc[1] += lo.y, acc[2] += lo.z, acc[3] += lo.w;
        acc[4] += hi.x, acc[5] += hi.y, acc[6] += hi.z, acc[7] += hi.w;
      }
      const float4 lo = make_float4(acc[0], acc[1], acc[2], acc[3]), hi = make_float4(acc[4], acc[5], acc[6], acc[7]);
      float* out = a.states + (s + 1) * a.states_step + at;
      *reinterpret_cast<float4*>(out) = lo;
      *reinterpret_cast<float4*>(out + 4) = hi;
      *reinterpret_cast<float4*>(&x[(s + 1) % 2][r][c]) = lo;
      *reinterpret_cast<float4*>(&x[(s + 1) % 2][r][c + 4]) = hi;
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[e] = 0.0f;
    }
    __syncthreads();  // chunk q+1 is in shared memory; a finished step's tile is visible to the next
  }
}

// [n, H, D, D] fp32 with contiguous [H, D, D] slices, 16-byte aligned.
void expect_fold_operand(const TensorView& t, const char* what, int64_t n, int64_t heads, int64_t d) {
  cuda::expect_cuda(t, what, DType::f32);
  HYDRA_ASSERT(t.rank() == 4 && t.size(0) >= n && t.size(1) == heads && t.size(2) == d && t.size(3) == d &&
                   t.stride(3) == 1 && t.stride(2) == d && t.stride(1) == d * d && t.stride(0) % 4 == 0 &&
                   reinterpret_cast<uintptr_t>(t.data()) % 16 == 0,
               "segment fold: {} must be [≥{}, {}, {}, {}] fp32 with contiguous 16-byte-aligned [H, D, D] slices, got {}",
               what, n, heads, d, d, t.shape_string());
}

}  // namespace

void fold_maps(const TensorView& m, const TensorView* add, const TensorView& states, int steps) {
  if (steps <= 0) return;
  const int64_t heads = states.size(1), d = states.size(2);
  HYDRA_ASSERT(d == 64 || d == 128, "segment fold: state dimension {} (64 or 128)", d);
  expect_fold_operand(states, "states", steps + 1, heads, d);
  expect_fold_operand(m, "m", steps, heads, d);
  if (add) expect_fold_operand(*add, "add", steps, heads, d);
  const FoldArgs a{m.data_as<const float>(), add ? add->data_as<const float>() : nullptr, states.data_as<float>(),
                   m.stride(0), add ? add->stride(0) : 0, states.stride(0), steps};
  const dim3 grid(static_cast<unsigned>(d / kFoldCols), static_cast<unsigned>(heads));
  if (d == 128) {
    fold_kernel<128><<<grid, 256, 0, current_stream()>>>(a);
  } else {
    fold_kernel<64><<<grid, 128, 0, current_stream()>>>(a);
  }
  HYDRA_CUDA_LAUNCH_CHECK();
}
}  // namespace gdn

void delta_rule_chunked(const TensorView& out, const TensorView& state, const TensorView& q, const TensorView& k,
                        const TensorView& v, const TensorView& g, const TensorView& beta, const DeltaRuleParams& params) {
  check_common(k, v, g, beta, params);
  check_rows(q, "q");
  check_rows(out, "out");
  cuda::expect_cuda(state, "state", DType::f32);
  HYDRA_ASSERT(state.is_contiguous(), "CUDA delta rule: the state must be contiguous [H, D, D]");
  if (k.size(0) == 0) return;
  const float scale = params.scale > 0 ? params.scale : 1.0f / std::sqrt(static_cast<float>(k.size(2)));
  HYDRA_ASSERT(params.segments >= 0, "CUDA delta rule: {} segments", params.segments);
  chunked_fused(out, state, q, k, v, g, beta, scale, params.segments, params.profile);
}

void delta_rule_segment_map(const TensorView& m, const TensorView& s_ext, const TensorView& k, const TensorView& v,
                            const TensorView& g, const TensorView& beta, const DeltaRuleParams& params) {
  check_common(k, v, g, beta, params);
  cuda::expect_cuda(m, "m", DType::f32);
  cuda::expect_cuda(s_ext, "s_ext", DType::f32);
  HYDRA_ASSERT(m.is_contiguous() && s_ext.is_contiguous(), "CUDA segment map layout");
  if (k.size(0) == 0) {  // an empty segment is the identity map
    fill(s_ext, 0.0f);
    Tensor eye = Tensor::zeros(m.shape(), DType::f32);
    for (int64_t h = 0; h < m.size(0); ++h)
      for (int64_t i = 0; i < m.size(1); ++i) eye.data_as<float>()[(h * m.size(1) + i) * m.size(1) + i] = 1.0f;
    copy_into(m, eye);
    return;
  }
  HYDRA_ASSERT(params.segments >= 0, "CUDA segment map: {} segments", params.segments);
  segment_map_fused(m, s_ext, k, v, g, beta, params.segments);
}

void delta_rule_fold(const TensorView& m, const TensorView* add, const TensorView& states, int steps) {
  fold_maps(m, add, states, steps);
}

void delta_rule_apply_map(const TensorView& state, const TensorView& m, const TensorView& s_ext) {
  // state ← M state + S_ext for all heads in one batched fp32 GEMM.
  Tensor next = clone(s_ext);
  gemm_batched(next, m, state, GemmParams{.beta = 1.0f});
  copy_into(state, next);
}

}  // namespace hydra::ops::cuda_impl
