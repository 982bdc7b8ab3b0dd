// Hopper flash attention backward (head dim 128), warp-specialised: TMA loads, mbarrier pipeline,
// dQ through shared memory and bulk reductions. Included by attention_backward.cu. The products
// (and their operand layouts) are FlashAttention-3's for d = 128:
//   Sᵀ = K_w Qᵀ, dPᵀ = V_w dOᵀ    m64n64k16 SS        dV += Pᵀ dO, dK += dSᵀ Q    m64n128k16 RS
//   dQ = dS K[:, 64w..64w+63]    m64n64k16 SS (dS written by stmatrix.trans, K-major)
// What changes is who moves the data and who waits for whom (FlashAttention-3's backward structure;
// NOTES_backward.md has the reasoning):
//
// CTA = 3 warpgroups (384 threads), one block of 128 keys of one KV head, one CTA per SM:
//  * warpgroup 0 (setmaxnreg 24):
//      - warp 0, the producer: K and V once (TMA, 128-byte swizzle), then per step (query head,
//        64-query block) Q and dO tiles by TMA into a 2-stage ring, and the step's row statistics
//        (lse·log2 e, delta, the τ scales) written by its 32 lanes into the stage. Stage `full`
//        mbarrier: 32 arrivals (lane 0's carries the TMA byte count); `empty`: one arrival per
//        consumer warp.
//      - warp 1, the dQ writer: per step, waits until both consumer warpgroups have put their dQ
//        halves into the fp32 staging tile, adds its 64 rows to the dq accumulator with bulk
//        reductions (cp.reduce.async.bulk .add.f32, one 512-byte row each), waits until they have
//        read the tile and hands it back. The consumers issue no global atomics.
//  * warpgroups 1 and 2, the consumers (setmaxnreg 240): keys 64w..64w+63, their dK and dV in
//    registers for the whole CTA. Per step: wait `full`; Sᵀ and dPᵀ issued together; Pᵀ (exp2)
//    while dPᵀ runs; dSᵀ; dS to shared memory (double-buffered, so one barrier per step suffices);
//    dV/dK issued; a barrier between the two consumer warpgroups (each needs the other's dS);
//    dQ issued; the stage released as soon as the dV/dK products have read Q and dO; dQ staged.
//
// Named barriers (0 is __syncthreads):
//   1  dS ready   256 threads: the two consumer warpgroups, once per step (bar.sync)
//   2  dQ full    288 threads: consumers bar.arrive after staging dQ, the writer warp bar.sync
//   3  dQ empty   288 threads: the writer bar.arrive once the reductions have read the tile
//                 (once before the first step, then after every step but the last), consumers bar.sync
// Every barrier sees as many arrivals as waits, so none is left half-arrived at exit.
#pragma once

#include <type_traits>

#include "kernels/attention/attention_backward.cuh"
#include "kernels/attention/flash_softmax.cuh"
#include "kernels/cuda/hopper.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace hydra::ops::cuda_impl::bwd_ws {

// Byte offset of 16-byte chunk c (0..15) of row r in a [rows][128] tile stored as two column blocks.
__device__ __forceinline__ uint32_t tile_offset(int rows, int r, int c) {
  return static_cast<uint32_t>((c / 8) * rows * 128 + r * 128 + (((c % 8) ^ (r % 8)) * 16));
}

constexpr int kBc = 128, kBr = 64, kD = 128, kStages = 2, kThreads = 384;
constexpr uint32_t kKvBlock = 128 * 128;  // one TMA box [128 rows][64 columns] bf16
constexpr uint32_t kKvTile = 2 * kKvBlock;
constexpr uint32_t kQBlock = 64 * 128;    // one TMA box [64 rows][64 columns] bf16
constexpr uint32_t kQTile = 2 * kQBlock;
constexpr int kDqPitch = kD + 8;          // floats per staged dQ row: conflict-free float2 stores, 16-byte rows
constexpr uint32_t kDqBytes = kBr * kDqPitch * 4;
constexpr int kConsumerWarps = 8;
constexpr int kBarDsReady = 1, kBarDqFull = 2, kBarDqEmpty = 3;
constexpr int kConsumerThreads = 256, kDqThreads = 256 + 32;

struct Stats {  // one stage's row statistics, rows m0 .. m0+63 of the step's query head
  float lse2[kBr];    // lse · log2 e (+inf: the row sees no key anywhere, so every P of it is 0)
  float delta[kBr];   // rowsum(dO ⊙ O)
  float qscale[kBr];  // scale · log2 e · τ
  float dscale[kBr];  // scale · τ
};
struct Barriers {
  uint64_t kv_full;
  uint64_t full[kStages], empty[kStages];
};

// Shared memory from a 1024-byte-aligned base: K, V, Q×2, dO×2, dS×2 tiles, the dQ staging tile,
// the statistics of both stages, the barriers.
constexpr uint32_t kOffK = 0, kOffV = kKvTile, kOffQ = 2 * kKvTile, kOffDo = kOffQ + kStages * kQTile;
constexpr uint32_t kOffDs = kOffDo + kStages * kQTile, kOffDq = kOffDs + 2 * kQTile;
constexpr uint32_t kOffStats = kOffDq + kDqBytes, kOffBarriers = kOffStats + kStages * sizeof(Stats);
constexpr size_t kSmemBytes = kOffBarriers + sizeof(Barriers) + 1024;

struct WsParams {
  CUtensorMap q_map, k_map, v_map, do_map;  // boxes of [64 or 128 rows][1 head][64 columns]
  BwdParams p;
};

using Steps = BwdSteps<kBr>;  // the step schedule all roles share (attention_backward.cuh)

__device__ void produce(const WsParams& wp, const Steps& st, int kvh, int k0, unsigned char* base, Stats* stats,
                        Barriers& b, int lane) {
  const BwdParams& p = wp.p;
  if (lane == 0) {
    cuda::mbar_expect_bytes(&b.kv_full, 2 * kKvTile);
    cuda::tma_load_3d_cols128(base + kOffK, kKvBlock, &wp.k_map, kvh, k0, &b.kv_full);
    cuda::tma_load_3d_cols128(base + kOffV, kKvBlock, &wp.v_map, kvh, k0, &b.kv_full);
  }
  for (int step = 0; step < st.count; ++step) {
    const int stage = step % kStages;
    cuda::mbar_wait(&b.empty[stage], ((step / kStages) & 1) ^ 1);  // the consumers are done with this stage
    const int h = st.head(p, step), m0 = st.m0(step);
    Stats& s = stats[stage];
    for (int r = lane; r < kBr; r += 32) {
      const int row = m0 + r;
      const bool ok = row < p.tq;
      const float lse = ok ? p.lse[h * p.lse_sh + row * p.lse_st] : 0.0f;
      s.lse2[r] = lse == -INFINITY ? INFINITY : lse * 1.4426950408889634f;  // +∞: the row sees no key, P = 0
      s.delta[r] = ok ? p.delta[h * p.delta_sh + row * p.delta_st] : 0.0f;
      const float tau = bwd_tau(p, p.q_pos0 + row);
      s.qscale[r] = p.scale_log2 * tau;
      s.dscale[r] = p.scale * tau;
    }
    if (lane == 0) {  // arrival with the byte count, then the loads (rows past tq read as zeros)
      cuda::mbar_expect_bytes(&b.full[stage], 2 * kQTile);
      cuda::tma_load_3d_cols128(base + kOffQ + stage * kQTile, kQBlock, &wp.q_map, h, m0, &b.full[stage]);
      cuda::tma_load_3d_cols128(base + kOffDo + stage * kQTile, kQBlock, &wp.do_map, h, m0, &b.full[stage]);
    } else {
      cuda::mbar_arrive(&b.full[stage]);  // releases this lane's statistics
    }
  }
}

__device__ void write_dq(const BwdParams& p, const Steps& st, uint32_t sdq, int lane) {
  cuda::named_barrier_arrive(kBarDqEmpty, kDqThreads);  // the staging tile starts free
  for (int step = 0; step < st.count; ++step) {
    cuda::named_barrier_sync(kBarDqFull, kDqThreads);  // both consumer warpgroups staged their dQ
    const int h = st.head(p, step), m0 = st.m0(step);
    for (int r = lane; r < kBr; r += 32) {
      const int row = m0 + r;
      if (row < p.tq) cuda::bulk_reduce_add_f32(p.dq + row * p.dq_st + h * p.dq_sh, sdq + r * kDqPitch * 4, kD * 4);
    }
    cuda::bulk_commit();
    cuda::bulk_wait_read_all();  // this lane's reductions have read the tile
    __syncwarp();
    if (step + 1 < st.count) cuda::named_barrier_arrive(kBarDqEmpty, kDqThreads);
  }
  cuda::bulk_wait_all();  // the last reductions are done before the CTA (and its shared memory) goes
}

// The consumer's stages, one step of 64 queries against this warpgroup's 64 keys (consume runs them
// in order, with the waits and barriers between them). Register arrays pass by reference: after
// inlining they are the same registers.

// Sᵀ = K_w Qᵀ and dPᵀ = V_w dOᵀ (64 keys × 64 queries each), two commit groups.
__device__ __forceinline__ void issue_scores(float (&s)[32], float (&dp)[32], uint32_t sk, uint32_t sv, uint32_t qs,
                                             uint32_t dos, uint32_t k_rows) {
#pragma unroll
  for (int i = 0; i < 32; ++i) s[i] = dp[i] = 0.0f;
  cuda::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    const uint32_t koff = static_cast<uint32_t>((kk / 4) * kKvBlock + (kk % 4) * 32) + k_rows;
    const uint32_t qoff = static_cast<uint32_t>((kk / 4) * kQBlock + (kk % 4) * 32);
    cuda::wgmma_m64n64k16_ss<0>(s, cuda::wgmma_desc(sk + koff, 16, 1024), cuda::wgmma_desc(qs + qoff, 16, 1024), kk > 0);
  }
  cuda::wgmma_commit();
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    const uint32_t koff = static_cast<uint32_t>((kk / 4) * kKvBlock + (kk % 4) * 32) + k_rows;
    const uint32_t qoff = static_cast<uint32_t>((kk / 4) * kQBlock + (kk % 4) * 32);
    cuda::wgmma_m64n64k16_ss<0>(dp, cuda::wgmma_desc(sv + koff, 16, 1024), cuda::wgmma_desc(dos + qoff, 16, 1024), kk > 0);
  }
  cuda::wgmma_commit();
}

// Pᵀ in place of Sᵀ, then as bf16 A fragments (pa), one per 16 queries.
// Pᵀ = exp2(Sᵀ·scale·log2e·τ − lse·log2e) without a branch per element: rows that see no key carry
// lse2 = +∞ (the producer's choice), so their exponent is −∞ and ex2 gives +0; masked entries get
// an exponent of −∞ the same way. Each lane's two adjacent columns come in one 8-byte load.
__device__ __forceinline__ void form_p(float (&s)[32], uint32_t (&pa)[4][4], const BwdParams& p, const Stats& s_st,
                                       int k0, int m0, int key_row0, int c4) {
  const bool need_mask = (p.causal && p.k_pos0 + k0 + kBc - 1 > p.q_pos0 + m0) || k0 + kBc > p.tk || m0 + kBr > p.tq;
  auto exp_rows = [&](auto masked) {  // std::true_type / std::false_type: two specialised copies
    // Key row key_row0 + 8h (h = e / 2) is hidden from query column c when it is past the keys, c is
    // past the queries, or (causal) its position exceeds the query's: (k_pos0 + k0 + key_row0 + 8h)
    // − (q_pos0 + m0) > c. The position difference is clamped into int range: |c| < 64.
    int lag = 0, q_limit = 0;
    bool key_ok[2] = {true, true};
    if constexpr (decltype(masked)::value) {
      const int64_t lag64 = p.k_pos0 + k0 + key_row0 - (p.q_pos0 + m0);
      lag = p.causal ? static_cast<int>(lag64 > (1 << 20) ? (1 << 20) : lag64 < -(1 << 20) ? -(1 << 20) : lag64)
                     : -(1 << 20);
      q_limit = p.tq - m0;
      key_ok[0] = k0 + key_row0 < p.tk;
      key_ok[1] = k0 + key_row0 + 8 < p.tk;
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int col0 = j * 8 + c4 * 2;
      const float2 lse2 = *reinterpret_cast<const float2*>(&s_st.lse2[col0]);
      const float2 qsc = *reinterpret_cast<const float2*>(&s_st.qscale[col0]);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = s[4 * j + e] * (e % 2 ? qsc.y : qsc.x) - (e % 2 ? lse2.y : lse2.x);
        if constexpr (decltype(masked)::value) {
          const int col = col0 + (e % 2), h = e / 2;
          x = key_ok[h] && col < q_limit && lag + 8 * h <= col ? x : -INFINITY;
        }
        s[4 * j + e] = fast_exp2(x);
      }
    }
  };
  if (need_mask) {
    exp_rows(std::true_type{});
  } else {
    exp_rows(std::false_type{});
  }
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    pa[kk][0] = cuda::pack_bf16(s[8 * kk + 0], s[8 * kk + 1]);
    pa[kk][1] = cuda::pack_bf16(s[8 * kk + 2], s[8 * kk + 3]);
    pa[kk][2] = cuda::pack_bf16(s[8 * kk + 4], s[8 * kk + 5]);
    pa[kk][3] = cuda::pack_bf16(s[8 * kk + 6], s[8 * kk + 7]);
  }
}

// dSᵀ = Pᵀ (dPᵀ − delta) · scale·τ in place of dPᵀ, as bf16 A fragments (dsa); then dS [64 queries]
// [128 keys] into this step's buffer at sds before the products that read dsa are issued (the buffer
// of step − 1 may still be read by the other warpgroup's dQ).
__device__ __forceinline__ void form_ds(float (&dp)[32], const float (&s)[32], uint32_t (&dsa)[4][4], const Stats& s_st,
                                        uint32_t sds, int cw, int warp, int lane, int c4) {
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int col0 = j * 8 + c4 * 2;
    const float2 delta = *reinterpret_cast<const float2*>(&s_st.delta[col0]);
    const float2 dsc = *reinterpret_cast<const float2*>(&s_st.dscale[col0]);
#pragma unroll
    for (int e = 0; e < 4; ++e)
      dp[4 * j + e] = s[4 * j + e] * (dp[4 * j + e] - (e % 2 ? delta.y : delta.x)) * (e % 2 ? dsc.y : dsc.x);
  }
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    dsa[kk][0] = cuda::pack_bf16(dp[8 * kk + 0], dp[8 * kk + 1]);
    dsa[kk][1] = cuda::pack_bf16(dp[8 * kk + 2], dp[8 * kk + 3]);
    dsa[kk][2] = cuda::pack_bf16(dp[8 * kk + 4], dp[8 * kk + 5]);
    dsa[kk][3] = cuda::pack_bf16(dp[8 * kk + 6], dp[8 * kk + 7]);
  }
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    const int m = lane / 8, r = lane % 8;
    const int query = kk * 16 + (m / 2) * 8 + r;
    const int chunk = cw * 8 + warp * 2 + (m % 2);  // 16-byte chunk of the 128 keys
    cuda::stmatrix_x4_trans(sds + tile_offset(kBr, query, chunk), dsa[kk]);
  }
  cuda::fence_proxy_async();  // the stmatrix writes -> visible to the dQ wgmma
}

// dV += Pᵀ dO and dK += dSᵀ Q (B = dO, Q [queries][d], read N-contiguous), one commit group.
__device__ __forceinline__ void issue_dv_dk(float (&dv)[64], float (&dk)[64], uint32_t (&pa)[4][4],
                                            uint32_t (&dsa)[4][4], uint32_t qs, uint32_t dos) {
  cuda::fence_operands(pa);
  cuda::fence_operands(dsa);
  cuda::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
    cuda::wgmma_m64n128k16_rs<1>(dv, pa[kk], cuda::wgmma_desc(dos + static_cast<uint32_t>(kk * 16 * 128), kQBlock, 1024), 1);
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
    cuda::wgmma_m64n128k16_rs<1>(dk, dsa[kk], cuda::wgmma_desc(qs + static_cast<uint32_t>(kk * 16 * 128), kQBlock, 1024), 1);
  cuda::wgmma_commit();
}

// dQ[64 queries × 64 columns 64w..] = dS K[:, 64w..64w+63] (K read N-contiguous), one commit group.
__device__ __forceinline__ void issue_dq(float (&dq)[32], uint32_t sds, uint32_t sk, int cw) {
#pragma unroll
  for (int i = 0; i < 32; ++i) dq[i] = 0.0f;
  cuda::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kBc / 16; ++kk) {
    const uint32_t aoff = static_cast<uint32_t>((kk / 4) * kQBlock + (kk % 4) * 32);
    const uint32_t boff = static_cast<uint32_t>(cw * kKvBlock + kk * 16 * 128);
    cuda::wgmma_m64n64k16_ss<1>(dq, cuda::wgmma_desc(sds + aoff, 16, 1024), cuda::wgmma_desc(sk + boff, kKvBlock, 1024), kk > 0);
  }
  cuda::wgmma_commit();
}

// Stages dQ (rows of this warp, columns 64w..) in the fp32 tile for the writer warp.
__device__ __forceinline__ void stage_dq(float* sdq, const float (&dq)[32], int cw, int warp, int g4, int c4) {
  const int ra = warp * 16 + g4, rb = ra + 8;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int col = cw * 64 + j * 8 + c4 * 2;
    *reinterpret_cast<float2*>(sdq + ra * kDqPitch + col) = make_float2(dq[4 * j], dq[4 * j + 1]);
    *reinterpret_cast<float2*>(sdq + rb * kDqPitch + col) = make_float2(dq[4 * j + 2], dq[4 * j + 3]);
  }
}

__device__ void consume(const BwdParams& p, const Steps& st, int cw, int kvh, int k0, unsigned char* base,
                        const Stats* stats, Barriers& b) {
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32, g4 = lane / 4, c4 = lane % 4;
  const uint32_t sbase = cuda::smem_addr(base);
  const uint32_t sk = sbase + kOffK, sv = sbase + kOffV;
  float* sdq = reinterpret_cast<float*>(base + kOffDq);
  const uint32_t k_rows = static_cast<uint32_t>(cw * 64 * 128);  // this warpgroup's 64 key rows in a column block
  const int key_row0 = cw * 64 + warp * 16 + g4;                  // this lane's key rows: key_row0, key_row0 + 8

  float dk[64], dv[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) dk[i] = dv[i] = 0.0f;
  cuda::mbar_wait(&b.kv_full, 0);

  for (int step = 0; step < st.count; ++step) {
    const int stage = step % kStages;
    const int m0 = st.m0(step);
    const uint32_t qs = sbase + kOffQ + stage * kQTile, dos = sbase + kOffDo + stage * kQTile;
    const uint32_t sds = sbase + kOffDs + (step % 2) * kQTile;
    const Stats& s_st = stats[stage];
    cuda::mbar_wait(&b.full[stage], (step / kStages) & 1);

    float s[32], dp[32];
    issue_scores(s, dp, sk, sv, qs, dos, k_rows);
    cuda::wgmma_wait<1>();  // Sᵀ is ready; dPᵀ may still run
    cuda::fence_operands(s);
    uint32_t pa[4][4];
    form_p(s, pa, p, s_st, k0, m0, key_row0, c4);
    cuda::wgmma_wait<0>();  // dPᵀ is ready
    cuda::fence_operands(dp);
    uint32_t dsa[4][4];
    form_ds(dp, s, dsa, s_st, sds, cw, warp, lane, c4);
    issue_dv_dk(dv, dk, pa, dsa, qs, dos);
    cuda::named_barrier_sync(kBarDsReady, kConsumerThreads);  // both warpgroups' dS are in place
    float dq[32];
    issue_dq(dq, sds, sk, cw);
    cuda::wgmma_wait<1>();  // dV/dK have read Q and dO: the stage goes back to the producer
    cuda::fence_operands(dk);
    cuda::fence_operands(dv);
    if (lane == 0) cuda::mbar_arrive(&b.empty[stage]);
    cuda::wgmma_wait<0>();
    cuda::fence_operands(dq);
    cuda::named_barrier_sync(kBarDqEmpty, kDqThreads);
    stage_dq(sdq, dq, cw, warp, g4, c4);
    cuda::fence_proxy_async();  // the staged rows -> visible to the bulk reductions
    cuda::named_barrier_arrive(kBarDqFull, kDqThreads);
  }

  bwd_add_dk_dv<kD>(p, kvh, k0 + key_row0, c4, [&](int j, int e) { return dk[4 * j + e]; },
                    [&](int j, int e) { return dv[4 * j + e]; });
}

__global__ void __launch_bounds__(kThreads, 1) attention_backward_ws_kernel(const __grid_constant__ WsParams wp) {
  const BwdParams& p = wp.p;
  const int kvh = blockIdx.y, k0 = blockIdx.x * kBc;
  Steps st(p, kvh, k0);
  if (!st.plan(p.tq)) return;  // the whole CTA, before any barrier exists

  extern __shared__ unsigned char smem_raw[];
  unsigned char* base = smem_raw + ((1024u - (cuda::smem_addr(smem_raw) & 1023u)) & 1023u);  // swizzle atoms
  Stats* stats = reinterpret_cast<Stats*>(base + kOffStats);
  Barriers& b = *reinterpret_cast<Barriers*>(base + kOffBarriers);
  if (threadIdx.x == 0) {
    cuda::mbar_init(&b.kv_full, 1);
    for (int s = 0; s < kStages; ++s) {
      cuda::mbar_init(&b.full[s], 32);
      cuda::mbar_init(&b.empty[s], kConsumerWarps);
    }
    cuda::mbar_fence_init();
    cuda::tma_prefetch_map(&wp.q_map);
    cuda::tma_prefetch_map(&wp.k_map);
    cuda::tma_prefetch_map(&wp.v_map);
    cuda::tma_prefetch_map(&wp.do_map);
  }
  __syncthreads();
  const int wg = threadIdx.x / 128, warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
  if (wg == 0) {
    cuda::setmaxnreg_dec<24>();
    if (warp == 0) produce(wp, st, kvh, k0, base, stats, b, lane);
    if (warp == 1) write_dq(p, st, cuda::smem_addr(base + kOffDq), lane);
    return;
  }
  cuda::setmaxnreg_inc<240>();
  consume(p, st, wg - 1, kvh, k0, base, stats, b);
}

}  // namespace hydra::ops::cuda_impl::bwd_ws
