// Backward of the chunked gated delta rule on the GPU (chunk C = 64, dk = dv = D ∈ {64, 128}),
// flash-linear-attention's scheme (chunk_gated_delta_rule_bwd): nothing from the forward is kept
// but its inputs, so the chunk quantities and states are recomputed, then the state gradient runs
// backward over the chunks, then every chunk's gradients are formed in parallel.
//
// Notation of delta_rule.h: γ cumulative log-decay in the chunk, L_ij = β_i (k_i·k_j) e^{γ_i−γ_j}
// (j < i), T = (I + L)⁻¹, W = T(β e^γ K), U = T(β V), V' = U − W S, K̃ = e^{γ_C−γ} K,
// O = scale·(e^γ Q) S + Ã V' with Ã = scale·(Q Kᵀ) ⊙ D (D_ij = e^{γ_i−γ_j}, j ≤ i),
// S_next = e^{γ_C} S + K̃ᵀ V'. Stages:
//  1. prepare (chunks × heads, parallel): the forward's (delta_rule_prepare.cu, PrepareFor::backward):
//     γ, T (tensor-core blocked inverse), Ã (the forward's P), W, K̃ and Q̂ = scale·e^γ Q.
//  2. states: the forward's sequential pass (gdn::sequential_pass: segment maps, fold, state pass)
//     without outputs, recording S at the start of every chunk (bf16) and V'.
//  3. state gradient (tiles × heads, sequential, last chunk first), dS = gradient w.r.t. the state
//     at the END of the chunk, starting from d_state:
//       dV' = Ãᵀ dO + K̃ dS  (stored bf16),   dS ← e^{γ_C} dS + Q̂ᵀ dO − Wᵀ dV'
//     leaving the gradient w.r.t. the initial state in d_state. It needs no state and no v, so
//     delta_rule_state_backward is stages 1 and 3 alone; in the full backward it runs concurrently
//     with stage 2 on a second stream (chunked_backward explains the synchronisation).
//  4. chunk gradients (chunks × heads, parallel; delta_rule_backward_grads.cu): dq, dk, dv, dβ
//     and dg from the chunk's S, dS, V', dV' (WY backward included), dg by a reverse cumulative
//     sum of dγ inside the chunk.
// Rows past the end of the sequence are zero with g = β = 0 (identity steps), as in the forward.
// Stage 3 has heads × D/BV CTAs; splitting it into segments (the transposed maps) is the next step
// for long sequences.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "kernels/delta_rule/delta_rule.h"
#include "kernels/delta_rule/delta_rule_backward.cuh"
#include "kernels/delta_rule/delta_rule_cuda.cuh"
#include "kernels/matmul/matmul.h"

namespace hydra::ops::cuda_impl {
namespace gdn_bwd {
namespace {

// ---------------------------------------------------------------------------------------------
// Stage 3: the sequential pass over chunks for one (head, BV-column tile), last chunk first. The
// tile of the state gradient lives in registers: warp w owns rows [w·D/4, (w+1)·D/4), all BV columns.
struct PassArgs {
  const bf16_t* w;   // ChunkPrep::w, kt, qh, p (= Ã), gamma
  const bf16_t* kt;
  const bf16_t* qh;
  const bf16_t* a;
  const float* gamma;
  SeqRows dout;
  int t_len, chunks, heads;
  float* state;    // [H, D, D]: reads dS_final, writes dS_initial
  bf16_t* states;  // [N, H, D, D] gradient w.r.t. each chunk's end state (or null)
  bf16_t* dvnew;   // [N, H, C, D] dV' (or null)
};

template <int D, int BV>
struct PassSmem {
  static constexpr int kLd = D + 8, kLv = BV + 8, kLc = kC + 8;
  static constexpr size_t rows_bytes = size_t(kC) * kLd * 2;
  static constexpr size_t narrow_bytes = size_t(kC) * kLv * 2;
  // Per pipeline stage: Q̂, K̃, W, Ã, dO tile; kStages of them (loads run one chunk ahead).
  static constexpr int kStages = 2;
  static constexpr size_t stage = 3 * rows_bytes + size_t(kC) * kLc * 2 + narrow_bytes;
  static constexpr size_t state_bytes = size_t(D) * kLv * 2;  // the state tile as a bf16 operand
  static constexpr size_t total = kStages * stage + state_bytes + narrow_bytes + 16;  // + γ_C per stage
};

__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src));
}

template <int D, int BV>
__device__ __forceinline__ void store_state_tile(const float (&s)[D / 64][BV / 8][4], bf16_t* tile, bf16_t* global,
                                                 int warp, int lane) {
  constexpr int kLv = BV + 8;
#pragma unroll
  for (int mt = 0; mt < D / 64; ++mt)
#pragma unroll
    for (int nt = 0; nt < BV / 8; ++nt)
#pragma unroll
      for (int h2 = 0; h2 < 2; ++h2) {
        const int r = acc_row(warp * (D / 4) + mt * 16, 2 * h2, lane), c = acc_col(0, nt, 0, lane);
        const uint32_t packed = cuda::pack_bf16(s[mt][nt][2 * h2], s[mt][nt][2 * h2 + 1]);
        *reinterpret_cast<uint32_t*>(tile + r * kLv + c) = packed;
        if (global) *reinterpret_cast<uint32_t*>(global + r * D + c) = packed;
      }
}

template <int D, int BV>
__device__ __forceinline__ void state_tile_io(float (&s)[D / 64][BV / 8][4], float* state, bool load, int warp, int lane) {
#pragma unroll
  for (int mt = 0; mt < D / 64; ++mt)
#pragma unroll
    for (int nt = 0; nt < BV / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = acc_row(warp * (D / 4) + mt * 16, e, lane), c = acc_col(0, nt, e, lane);
        if (load) {
          s[mt][nt][e] = state[r * D + c];
        } else {
          state[r * D + c] = s[mt][nt][e];
        }
      }
}

// Stage 3: the state gradient, last chunk first. The tiles are fetched one chunk ahead, γ_C with
// them (cp.async; a plain load there put a memory round trip on every chunk's critical path).
// Fetching two chunks ahead (3 stages) was slower: the larger CTA fits fewer per SM, and one chunk
// ahead already hides the fetch (cluster/results/h200-2026-12-02/gdn).
template <int D, int BV>
__global__ void __launch_bounds__(128) gdn_bwd_dstate_kernel(const PassArgs a) {
  using S = PassSmem<D, BV>;
  constexpr int kLd = S::kLd, kLv = S::kLv, kLc = S::kLc;
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int kStages = S::kStages;
  bf16_t* sds = reinterpret_cast<bf16_t*>(smem + kStages * S::stage);
  bf16_t* sdv = reinterpret_cast<bf16_t*>(smem + kStages * S::stage + S::state_bytes);  // −dV' (bf16)
  float* sdecay = reinterpret_cast<float*>(smem + kStages * S::stage + S::state_bytes + S::narrow_bytes);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int head = blockIdx.y, col0 = blockIdx.x * BV;
  auto rows_ptr = [&](int stage, int which) {  // 0: Q̂, 1: K̃, 2: W, 3: Ã, 4: dO tile
    unsigned char* base = smem + stage * S::stage;
    if (which < 3) return reinterpret_cast<bf16_t*>(base + which * S::rows_bytes);
    if (which == 3) return reinterpret_cast<bf16_t*>(base + 3 * S::rows_bytes);
    return reinterpret_cast<bf16_t*>(base + 3 * S::rows_bytes + size_t(kC) * kLc * 2);
  };
  auto load_chunk = [&](int chunk, int stage) {
    const int64_t off = (int64_t(chunk) * a.heads + head) * kC * D;
    load_tile_async<kC, D, kLd, 128>(rows_ptr(stage, 0), a.qh + off, D, tid);
    load_tile_async<kC, D, kLd, 128>(rows_ptr(stage, 1), a.kt + off, D, tid);
    load_tile_async<kC, D, kLd, 128>(rows_ptr(stage, 2), a.w + off, D, tid);
    load_tile_async<kC, kC, kLc, 128>(rows_ptr(stage, 3), a.a + (int64_t(chunk) * a.heads + head) * kC * kC, kC, tid);
    const int t0 = chunk * kC;
    const bf16_t* dop = static_cast<const bf16_t*>(a.dout.ptr) + t0 * a.dout.st + head * a.dout.sh + col0;
    load_tile_async<kC, BV, kLv, 128>(rows_ptr(stage, 4), dop, a.dout.st, tid, min(kC, a.t_len - t0));
    if (tid == 0) cp_async_4(cuda::smem_addr(sdecay + stage), a.gamma + (int64_t(chunk) * a.heads + head) * kC + kC - 1);
  };

  float s[D / 64][BV / 8][4];
  float* state = a.state + int64_t(head) * D * D + col0;
  state_tile_io<D, BV>(s, state, true, warp, lane);
  load_chunk(a.chunks - 1, 0);
  cuda::cp_async_commit();
  for (int idx = 0; idx < a.chunks; ++idx) {
    const int chunk = a.chunks - 1 - idx, stage = idx % kStages;
    store_state_tile<D, BV>(s, sds, a.states ? a.states + (int64_t(chunk) * a.heads + head) * D * D + col0 : nullptr,
                            warp, lane);
    cuda::cp_async_wait<0>();
    __syncthreads();  // this chunk's tiles and dS (bf16) visible; the other stage was last read at idx − 1
    if (chunk > 0) load_chunk(chunk - 1, (idx + 1) % kStages);
    cuda::cp_async_commit();
    const bf16_t* sqh = rows_ptr(stage, 0);
    const bf16_t* skt = rows_ptr(stage, 1);
    const bf16_t* sw = rows_ptr(stage, 2);
    const bf16_t* sa = rows_ptr(stage, 3);
    const bf16_t* sdo = rows_ptr(stage, 4);
    // dS ← e^{γ_C} dS + Q̂ᵀ dO first: it does not depend on dV', so these products overlap the
    // dV' chain below (the bf16 copy of the old dS in sds is what dV' reads).
    const float decay = expf(sdecay[stage]);
#pragma unroll
    for (int mt = 0; mt < D / 64; ++mt) {
#pragma unroll
      for (int nt = 0; nt < BV / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mt][nt][e] *= decay;
      warp_mma<BV, kC, true, false>(s[mt], sqh, kLd, sdo, kLv, warp * (D / 4) + mt * 16, 0, lane);
    }
    {  // dV' = Ãᵀ dO + K̃ dS: warp w owns chunk rows 16w.
      float p[BV / 8][4];
      zero(p);
      warp_mma<BV, kC, true, false>(p, sa, kLc, sdo, kLv, warp * 16, 0, lane);
      warp_mma<BV, D, false, false>(p, skt, kLd, sds, kLv, warp * 16, 0, lane);
      bf16_t* dvg = a.dvnew ? a.dvnew + (int64_t(chunk) * a.heads + head) * kC * D + col0 : nullptr;
#pragma unroll
      for (int j = 0; j < BV / 8; ++j)
#pragma unroll
        for (int h2 = 0; h2 < 2; ++h2) {
          const int r = acc_row(warp * 16, 2 * h2, lane), c = acc_col(0, j, 0, lane);
          *reinterpret_cast<uint32_t*>(sdv + r * kLv + c) = cuda::pack_bf16(-p[j][2 * h2], -p[j][2 * h2 + 1]);
          if (dvg) *reinterpret_cast<uint32_t*>(dvg + r * D + c) = cuda::pack_bf16(p[j][2 * h2], p[j][2 * h2 + 1]);
        }
    }
    __syncthreads();
    // dS += Wᵀ (−dV').
#pragma unroll
    for (int mt = 0; mt < D / 64; ++mt)
      warp_mma<BV, kC, true, false>(s[mt], sw, kLd, sdv, kLv, warp * (D / 4) + mt * 16, 0, lane);
    __syncthreads();  // sds and sdv are rewritten next chunk
  }
  cuda::cp_async_wait<0>();
  state_tile_io<D, BV>(s, state, false, warp, lane);
}

// ---------------------------------------------------------------------------------------------
// Host side.

SeqRows rows_of(const TensorView& x) { return SeqRows{x.data(), x.stride(0), x.stride(1)}; }

void check_rows(const TensorView& x, const char* what) {
  cuda::expect_cuda(x, what, DType::bf16);
  HYDRA_ASSERT(x.rank() == 3 && x.stride(2) == 1 && x.stride(0) % 8 == 0 && x.stride(1) % 8 == 0 &&
                   reinterpret_cast<uintptr_t>(x.data()) % 16 == 0,
               "CUDA delta rule backward: {} rows must be 16-byte aligned", what);
}

// Stage 3 over prepared chunks. Value tiles of 16 columns when few CTAs would otherwise leave SMs
// idle, else 32. At 512K × 14 heads 32 columns (56 CTAs, half the re-reads of W, K̃, Q̂) were
// slower than 16: the pass is bound by each CTA's chunk step, not by L2. In training beside the FA
// backward (each stage-3 CTA holds an SM the attention kernel cannot share) the two widths gave the
// same step within the noise, so the rule stays (cluster/results/h200-2026-12-05, run1).
template <int D>
void state_gradient_pass(const PassArgs& args) {
  auto launch = [&](auto kernel, size_t smem, int bv) {
    HYDRA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    kernel<<<dim3(D / bv, args.heads), 128, smem, current_stream()>>>(args);
    HYDRA_CUDA_LAUNCH_CHECK();
  };
  if (args.heads * (D / 32) < 200) {
    launch(gdn_bwd_dstate_kernel<D, 16>, PassSmem<D, 16>::total, 16);
  } else {
    launch(gdn_bwd_dstate_kernel<D, 32>, PassSmem<D, 32>::total, 32);
  }
}

PassArgs pass_args(const gdn::ChunkPrep& p, const TensorView& d_out, float* dstate, bf16_t* dstates, bf16_t* dvnew) {
  return PassArgs{p.w.data_as<bf16_t>(), p.kt.data_as<bf16_t>(), p.qh.data_as<bf16_t>(), p.p.data_as<bf16_t>(),
                  p.gamma.data_as<float>(), rows_of(d_out), static_cast<int>(d_out.size(0)), p.chunks,
                  static_cast<int>(d_out.size(1)), dstate, dstates, dvnew};
}

template <int D>
void chunked_backward(const TensorView& dq, const TensorView& dk, const TensorView& dv, const TensorView& dg,
                      const TensorView& dbeta, const TensorView& d_state, const TensorView& d_out, const TensorView& q,
                      const TensorView& k, const TensorView& v, const TensorView& g, const TensorView& beta,
                      const TensorView& state0, float scale, GdnProfile profile) {
  const int t_len = static_cast<int>(k.size(0)), heads = static_cast<int>(k.size(1));
  const int chunks = (t_len + kC - 1) / kC;
  // GdnProfile::stages prints each stage's time (events on the current stream); serial_stages also
  // runs stages 2 and 3 one after the other to time them apart.
  gdn::StageProfile times("gdn backward stages", profile != GdnProfile::off);
  const bool serial = profile == GdnProfile::serial_stages;
  times.mark("start");
  const gdn::ChunkPrep p = gdn::prepare(q, k, g, beta, scale, gdn::PrepareFor::backward);
  times.mark("prepare");
  Tensor state = clone(state0);  // the pass reads and overwrites it; a contiguous fp32 copy
  const DeltaRuleBackwardBuffers spec = delta_rule_backward_buffers(t_len, heads, D);
  Tensor states = spec.states.empty(Device::cuda);
  Tensor vnew = spec.v_new.empty(Device::cuda);
  auto stage2 = [&] {
    gdn::sequential_pass(p, TensorView(), state, q, k, v, beta, scale, 0,
                         gdn::StatePassRecord{states.data_as<bf16_t>(), vnew.data_as<bf16_t>()}, nullptr);
  };
  Tensor dstate = clone(d_state);
  Tensor dstates = spec.states.empty(Device::cuda);
  Tensor dvnew = spec.v_new.empty(Device::cuda);
  const PassArgs bwd = pass_args(p, d_out, dstate.data_as<float>(), dstates.data_as<bf16_t>(), dvnew.data_as<bf16_t>());
  if (serial) {
    stage2();
    times.mark("states");
    state_gradient_pass<D>(bwd);
    copy_into(d_state, dstate);
    times.mark("state-gradient");
  } else {
    // Stages 2 and 3 are independent (both read only stage 1's tiles, the inputs and their own
    // initial states), and stage 3 is a sequential pass of D/16 × H CTAs that leaves most of the
    // GPU idle at 14 heads, so they run concurrently: stage 3 on this file's side stream, which
    // first waits for everything queued so far (stage 1, the allocations above); the current stream
    // waits for it before stage 4. Every tensor either touches is allocated before the fork and
    // freed after the join, in stream order. Stage 3 is queued first: its CTAs are the long ones.
    // A stage-3 CTA (136 KB at D = 128) and a stage-2 one (185 KB, one per SM) do not share an SM,
    // so stage 2 runs beside stage 3 on the SMs stage 3 leaves free. (A smaller stage-2 CTA that
    // could share an SM with stage 3 made the pair's time vary from run to run and gained nothing
    // on average: cluster/results/h200-2026-12-03/gdn_fwd.)
    thread_local CudaStream side;
    CudaEvent forked, joined;
    forked.record(current_stream());
    forked.wait_on(side.get());
    {
      StreamGuard guard(side.get());
      state_gradient_pass<D>(bwd);
      copy_into(d_state, dstate);
      joined.record(side.get());
    }
    stage2();
    joined.wait_on(current_stream());
    times.mark("states+state-gradient");
  }
  GradArgs ga{rows_of(q), rows_of(k), rows_of(v), rows_of(d_out), SeqRows{beta.data(), beta.stride(0), beta.stride(1)},
              p.gamma.data_as<float>(), p.t.data_as<bf16_t>(), states.data_as<bf16_t>(), dstates.data_as<bf16_t>(),
              vnew.data_as<bf16_t>(), dvnew.data_as<bf16_t>(), dq.data(), dk.data(), dv.data(),
              dq.stride(0), dq.stride(1), dk.stride(0), dk.stride(1), dv.stride(0), dv.stride(1),
              dg.data_as<float>(), dbeta.data_as<float>(), dg.stride(0), dg.stride(1), dbeta.stride(0), dbeta.stride(1),
              t_len, heads, scale};
  launch_chunk_grads(ga, D, dq.dtype() == DType::bf16, chunks);
  times.mark("chunk-gradients");
}

template <int D>
void state_backward(const TensorView& d_state, const TensorView& d_out, const TensorView& q, const TensorView& k,
                    const TensorView& g, const TensorView& beta, float scale) {
  const gdn::ChunkPrep p = gdn::prepare(q, k, g, beta, scale, gdn::PrepareFor::backward);
  Tensor dstate = clone(d_state);
  state_gradient_pass<D>(pass_args(p, d_out, dstate.data_as<float>(), nullptr, nullptr));
  copy_into(d_state, dstate);
}

void check_common(const TensorView& d_state, const TensorView& d_out, const TensorView& q, const TensorView& k,
                  const TensorView& g, const TensorView& beta, const DeltaRuleParams& params) {
  check_rows(q, "q");
  check_rows(k, "k");
  check_rows(d_out, "d_out");
  cuda::expect_cuda(g, "g", DType::f32);
  cuda::expect_cuda(beta, "beta", DType::f32);
  cuda::expect_cuda(d_state, "d_state", DType::f32);
  const int64_t d = k.size(2);
  HYDRA_ASSERT((d == 64 || d == 128) && q.size(2) == d && d_out.size(2) == d,
               "CUDA delta rule backward supports dk = dv in {{64, 128}}, got {}/{}", d, d_out.size(2));
  HYDRA_ASSERT(params.chunk == kC, "CUDA delta rule backward uses chunks of {}", kC);
  HYDRA_ASSERT(d_state.rank() == 3 && d_state.size(0) == k.size(1) && d_state.size(1) == d && d_state.size(2) == d,
               "d_state must be [H, {}, {}]", d, d);
}

}  // namespace
}  // namespace gdn_bwd

void delta_rule_chunked_backward(const TensorView& dq, const TensorView& dk, const TensorView& dv, const TensorView& dg,
                                 const TensorView& dbeta, const TensorView& d_state, const TensorView& d_out,
                                 const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g,
                                 const TensorView& beta, const TensorView& state0, const DeltaRuleParams& params) {
  gdn_bwd::check_common(d_state, d_out, q, k, g, beta, params);
  gdn_bwd::check_rows(v, "v");
  cuda::expect_cuda(state0, "state0", DType::f32);
  cuda::expect_cuda(dg, "dg", DType::f32);
  cuda::expect_cuda(dbeta, "dbeta", DType::f32);
  const DType out_type = dq.dtype();
  HYDRA_ASSERT((out_type == DType::bf16 || out_type == DType::f32) && dk.dtype() == out_type && dv.dtype() == out_type,
               "CUDA delta rule backward: dq, dk, dv must all be bf16 or all f32");
  for (const TensorView* t : {&dq, &dk, &dv}) {
    HYDRA_ASSERT(t->device() == Device::cuda && t->rank() == 3 && t->stride(2) == 1 && t->stride(0) % 2 == 0 &&
                     t->stride(1) % 2 == 0 && reinterpret_cast<uintptr_t>(t->data()) % 8 == 0,
                 "CUDA delta rule backward: dq/dk/dv rows must be 8-byte aligned");
  }
  if (k.size(0) == 0) return;  // no tokens: d_state passes through, nothing else to write
  const float scale = params.scale > 0 ? params.scale : 1.0f / std::sqrt(static_cast<float>(k.size(2)));
  if (k.size(2) == 128) {
    gdn_bwd::chunked_backward<128>(dq, dk, dv, dg, dbeta, d_state, d_out, q, k, v, g, beta, state0, scale, params.profile);
  } else {
    gdn_bwd::chunked_backward<64>(dq, dk, dv, dg, dbeta, d_state, d_out, q, k, v, g, beta, state0, scale, params.profile);
  }
}

void delta_rule_state_backward(const TensorView& d_state, const TensorView& d_out, const TensorView& q,
                               const TensorView& k, const TensorView& g, const TensorView& beta,
                               const DeltaRuleParams& params) {
  gdn_bwd::check_common(d_state, d_out, q, k, g, beta, params);
  if (k.size(0) == 0) return;
  const float scale = params.scale > 0 ? params.scale : 1.0f / std::sqrt(static_cast<float>(k.size(2)));
  if (k.size(2) == 128) {
    gdn_bwd::state_backward<128>(d_state, d_out, q, k, g, beta, scale);
  } else {
    gdn_bwd::state_backward<64>(d_state, d_out, q, k, g, beta, scale);
  }
}

void delta_rule_apply_map_transposed(const TensorView& d_state, const TensorView& m, const TensorView& d_loc) {
  // d_state ← Mᵀ d_state + d_loc per head: one batched fp32 GEMM (all heads).
  for (const auto& [t, name] : {std::pair{d_state, "d_state"}, {m, "m"}, {d_loc, "d_loc"}}) {
    cuda::expect_cuda(t, name, DType::f32);
  }
  Tensor next = clone(d_loc);
  gemm_batched(next, m, d_state, GemmParams{.transpose_a = Transpose::yes, .beta = 1.0f});
  copy_into(d_state, next);
}

}  // namespace hydra::ops::cuda_impl
