// Stage 2 of the GPU gated delta rule (delta_rule_cuda.cuh): the sequential pass over the chunks
// of a segment on Hopper's warpgroup tensor cores (wgmma, sm_90a), outputs fused in (no chunk
// state or V' goes to memory unless the backward asks for it).
//
// CTA = one (tile, head, segment), the whole D × D tile (the state S, or a segment map's M), one
// CTA per SM: D/64 consumer warpgroups and a producer warpgroup (registers moved to the consumers
// by setmaxnreg at D = 128).
//  * The producer loads each chunk's K, V, T (and Q, P with outputs) by TMA into a ring of
//    shared-memory stages (2 with outputs, 3 without), 128-byte swizzled [64][64] bf16 blocks, with
//    prepare's per-row factors (β, β e^γ, e^{γ_C−γ}, e^γ) by bulk copy, guarded by mbarriers
//    (full: expect-tx; empty: one arrival per consumer warp), so K, T, Q and P are read once per
//    chunk for all D columns.
//  * Consumer warpgroup c owns the state columns [64c, 64c + 64), kept transposed in registers
//    (kernel comment below), so every product takes its left operand from registers.
//  Map tiles run the same recurrence on the columns of M (V = 0, M starts as I), which gives a
//  segment's affine map S_out = M S_in + S_ext (S_ext: the value tile started from zeros).
// It replaced a kernel that kept S in shared memory as the B operand, with three proxy fences and
// shared round trips per chunk, and was faster than it in the same job
// (cluster/results/h200-2026-12-03/gdn_fwd2/, NOTES_forward.md).
#include <cuda.h>

#include <cmath>
#include <cstdlib>
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/hopper.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/wgmma.cuh"
#include "kernels/delta_rule/delta_rule_cuda.cuh"

namespace hydra::ops::cuda_impl::gdn {
namespace {

constexpr int kC = kChunk;
constexpr uint32_t kBlock = 64 * 128;  // one [64 rows][64 columns] bf16 block (128-byte rows): 8 KB

// Byte offset of the bf16 pair (row, col .. col + 1), col even < 64, in a 1024-byte aligned tile of
// 128-byte rows stored with the 128-byte swizzle (16-byte chunk c of row r at c ^ (r % 8)): the
// layout TMA writes and the wgmma descriptors below read.
__device__ __forceinline__ uint32_t swz(int row, int col) {
  return static_cast<uint32_t>(row * 128 + ((((col >> 3) ^ row) & 7) << 4) + (col & 7) * 2);
}

// Descriptors: K-major (rows of the operand are 128-byte lines along K; the next 8 rows 1024 bytes
// on) and M/N-major (lines along M or N, 64 wide; the next 8 lines along K 1024 bytes on; a 64-wide
// operand has no second column block, so the leading offset is unused).
__device__ __forceinline__ uint64_t desc_k_major(uint32_t addr) { return cuda::wgmma_desc(addr, 16, 1024); }
__device__ __forceinline__ uint64_t desc_mn_major(uint32_t addr) { return cuda::wgmma_desc(addr, kBlock, 1024); }

struct StateMaps {
  CUtensorMap k, v, q, o;  // [T, H, D] rows, boxes of [64 rows][64 columns] (o: the output, stored by TMA)
  CUtensorMap t, p;     // prepare's [chunks · H · 64][64] tiles, boxes of one [64][64] tile
};
struct StateParams {
  StateMaps maps;
  StatePassArgs a;
};

// A 2-D map over prepare's [rows][64] bf16 tiles (T or P), boxes of one [64][64] tile, 128-byte swizzle.
CUtensorMap tile_map(const bf16_t* tiles, int64_t rows) {
  const cuda::TensorMapEncode encode = cuda::tensor_map_encoder();
  HYDRA_ASSERT(reinterpret_cast<uintptr_t>(tiles) % 16 == 0, "GDN state pass: prepare's tiles must be 16-byte aligned");
  CUtensorMap map;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(kC), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(kC) * 2};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(kC), static_cast<cuuint32_t>(kC)};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<bf16_t*>(tiles), dims, strides, box,
                            element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  HYDRA_ASSERT(r == CUDA_SUCCESS, "cuTensorMapEncodeTiled failed (error {}) for {} tile rows", static_cast<int>(r), rows);
  return map;
}

// The bf16 A fragments of the 4 k-steps (16 columns each) of an m64n64 fp32 accumulator
// (FlashAttention's P trick: accumulator columns become the K dimension).
__device__ __forceinline__ void pack_a(const float (&c)[32], uint32_t (&a)[4][4]) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
#pragma unroll
    for (int j = 0; j < 4; ++j) a[kk][j] = cuda::pack_bf16(c[8 * kk + 2 * j], c[8 * kk + 2 * j + 1]);
}

template <int D, bool Out>
struct StateSmemT {
  static constexpr int kGroups = D / 64;
  static constexpr int kStages = Out ? 2 : 3;
  static constexpr uint32_t rows = kGroups * kBlock;  // a chunk's K, V or Q rows (D/64 column blocks)
  static constexpr uint32_t kFactorBytes = 4 * kC * 4;
  // One stage: K, V, T, (Q, P with outputs), then prepare's factors (β, β e^γ, e^{γ_C−γ}, e^γ).
  static constexpr uint32_t k = 0, v = rows, t = 2 * rows, q = t + kBlock, p = q + rows;
  static constexpr uint32_t f = Out ? p + kBlock : q;
  static constexpr uint32_t stage = f + kFactorBytes;
  static constexpr uint32_t outs = kStages * stage;                    // per warpgroup: 2 output blocks
  static constexpr uint32_t barriers = outs + (Out ? kGroups * 2 * kBlock : 0);
  static constexpr size_t total = barriers + 2 * kStages * sizeof(uint64_t) + 1024;  // + alignment
};

// The producer thread: per chunk, waits for a free stage, then loads K, V (value tiles), T and,
// with outputs, Q and P by TMA, and prepare's per-row factors by bulk copy.
template <int D, bool Out>
__device__ __forceinline__ void state_produce(const StateParams& prm, unsigned char* base, uint64_t* full, uint64_t* empty,
                                              bool is_map, int chunk_begin, int chunk_end, int head) {
  using L = StateSmemT<D, Out>;
  constexpr int kGroups = L::kGroups, kStages = L::kStages;
  const StatePassArgs& a = prm.a;
  cuda::tma_prefetch_map(&prm.maps.k);
  cuda::tma_prefetch_map(&prm.maps.t);
  if (!is_map) cuda::tma_prefetch_map(&prm.maps.v);
  if constexpr (Out) {
    cuda::tma_prefetch_map(&prm.maps.q);
    cuda::tma_prefetch_map(&prm.maps.p);
  }
  const uint32_t bytes = L::rows * (is_map ? 1 : 2) + kBlock + (Out ? L::rows + kBlock : 0) + L::kFactorBytes;
  for (int chunk = chunk_begin, i = 0; chunk < chunk_end; ++chunk, ++i) {
    const int st = i % kStages;
    cuda::mbar_wait(&empty[st], ((i / kStages) & 1) ^ 1);
    unsigned char* sb = base + st * L::stage;
    const int t0 = chunk * kC, tile = chunk * a.heads + head;
    cuda::mbar_expect_bytes(&full[st], bytes);
#pragma unroll
    for (int b = 0; b < kGroups; ++b) {
      cuda::tma_load_3d(sb + L::k + b * kBlock, &prm.maps.k, 64 * b, head, t0, &full[st]);
      if (!is_map) cuda::tma_load_3d(sb + L::v + b * kBlock, &prm.maps.v, 64 * b, head, t0, &full[st]);
      if constexpr (Out) cuda::tma_load_3d(sb + L::q + b * kBlock, &prm.maps.q, 64 * b, head, t0, &full[st]);
    }
    cuda::tma_load_2d_row(sb + L::t, &prm.maps.t, tile * kC, &full[st]);
    if constexpr (Out) cuda::tma_load_2d_row(sb + L::p, &prm.maps.p, tile * kC, &full[st]);
    cuda::bulk_load(sb + L::f, a.factors + int64_t(tile) * 4 * kC, L::kFactorBytes, &full[st]);
  }
}

// A consumer thread's place: warpgroup grp owns state columns [col0, col0 + 64) as the rows of Sᵀ;
// this thread holds rows vrow and vrow + 8 of them.
struct StateLane {
  int grp, warp, lane, g4, c4, col0, vrow;
  __device__ __forceinline__ StateLane(int warp_id, int lane)
      : grp(warp_id / 4), warp(warp_id % 4), lane(lane), g4(lane / 4), c4(lane % 4), col0(64 * grp), vrow(16 * warp + g4) {}
  // The 8×8 transposing loads (V) and stores (O) of a [64][64] block, 4 matrices each: lane l
  // addresses row 8 (2q + l / 16) + l % 8, columns 16 warp + 8 ((l / 8) % 2) .. + 8.
  __device__ __forceinline__ uint32_t lane_off(int q) const {
    return swz(8 * (2 * q + lane / 16) + lane % 8, 16 * warp + 8 * ((lane / 8) % 2));
  }
};

// The starting state: s[mb][4 nt + e] = Sᵀ[col0 + vrow + 8 (e / 2)][64 mb + 8 nt + 2 c4 + e % 2]
// (accumulator layout), from state_in (zeros without), or I for a map tile.
template <int D>
__device__ __forceinline__ void state_init(float (&s)[D / 64][32], const StatePassArgs& a, const StateLane& at, bool is_map,
                                           int64_t seg, int64_t hblock) {
#pragma unroll
  for (int mb = 0; mb < D / 64; ++mb)
#pragma unroll
    for (int e = 0; e < 32; ++e) {
      const int v = at.col0 + at.vrow + 8 * ((e % 4) / 2), d = 64 * mb + 8 * (e / 4) + 2 * at.c4 + (e % 2);
      s[mb][e] = is_map ? (v == d ? 1.0f : 0.0f) : (a.state_in ? a.state_in[seg + hblock + int64_t(d) * D + v] : 0.0f);
    }
}

// Sᵀ as bf16 A fragments sa, k-step kk = d in [16 kk, 16 kk + 16).
template <int D>
__device__ __forceinline__ void pack_state(const float (&s)[D / 64][32], uint32_t (&sa)[D / 16][4]) {
#pragma unroll
  for (int mb = 0; mb < D / 64; ++mb)
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
#pragma unroll
      for (int j = 0; j < 4; ++j) sa[4 * mb + kk][j] = cuda::pack_bf16(s[mb][8 * kk + 2 * j], s[mb][8 * kk + 2 * j + 1]);
}

// An m64n64 accumulator c (rows: state columns, columns: n0 + 8 nt + 2 c4 ..) into a row-major
// [n][D] bf16 matrix (the backward's records): lanes 4 apart hold neighbouring state columns, so
// one exchange gives every lane a pair along the row.
template <int D>
__device__ __forceinline__ void store_transposed(const float (&c)[32], bf16_t* dst, int n0, const StateLane& at) {
  const bool odd = at.g4 & 1;
#pragma unroll
  for (int e = 0; e < 32; e += 2) {
    const float c0 = c[e], c1 = c[e + 1];
    const float recv = __shfl_xor_sync(0xffffffffu, odd ? c0 : c1, 4);
    const int n = n0 + 8 * (e / 4) + 2 * at.c4 + (odd ? 1 : 0);
    const int v = at.col0 + at.vrow + 8 * ((e % 4) / 2) - (odd ? 1 : 0);
    *reinterpret_cast<uint32_t*>(dst + int64_t(n) * D + v) = odd ? cuda::pack_bf16(recv, c1) : cuda::pack_bf16(c0, recv);
  }
}

// The backward's record of the state at the start of `chunk` (value tiles, when asked for).
template <int D>
__device__ __forceinline__ void record_state(const float (&s)[D / 64][32], const StatePassArgs& a, const StateLane& at,
                                             bool is_map, int chunk, int chunk_end, int head) {
  if (a.chunk_states && !is_map && chunk < chunk_end) {
#pragma unroll
    for (int mb = 0; mb < D / 64; ++mb)
      store_transposed<D>(s[mb], a.chunk_states + (int64_t(chunk) * a.heads + head) * D * D, 64 * mb, at);
  }
}

// Xᵀ = Sᵀ Kᵀ (and Yᵀ = Sᵀ Qᵀ with outputs); waits for X (Y may still run).
template <int D, bool Out>
__device__ __forceinline__ void state_xy(uint32_t (&sa)[D / 16][4], float (&x)[32], float (&y)[32], uint32_t k_addr,
                                         uint32_t q_addr) {
  cuda::fence_operands(sa);
  cuda::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
    cuda::wgmma_m64n64k16_rs<0>(x, sa[kk], desc_k_major(k_addr + (kk / 4) * kBlock + (kk % 4) * 32), kk > 0);
  cuda::wgmma_commit();
  cuda::fence_operands(x);
  if constexpr (Out) {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      cuda::wgmma_m64n64k16_rs<0>(y, sa[kk], desc_k_major(q_addr + (kk / 4) * kBlock + (kk % 4) * 32), kk > 0);
    cuda::wgmma_commit();
    cuda::fence_operands(y);
    cuda::wgmma_wait<1>();
  } else {
    cuda::wgmma_wait<0>();
    cuda::fence_operands(sa);
  }
  cuda::fence_operands(x);
}

// R̃ᵀ = β ⊙ Vᵀ − β e^γ ⊙ Xᵀ (factors per column j), as the A fragments ra of V'ᵀ = R̃ᵀ Tᵀ.
__device__ __forceinline__ void state_residual(const float (&x)[32], const float* fac, uint32_t v_addr, bool is_map,
                                               const StateLane& at, uint32_t (&ra)[4][4]) {
  const float2* fb = reinterpret_cast<const float2*>(fac) + at.c4;  // column 8 nt + 2 c4: [4 nt]
  const float2* fbe = reinterpret_cast<const float2*>(fac + kC) + at.c4;
  float r[32];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    uint32_t vv[4] = {0u, 0u, 0u, 0u};  // (nt, rows) = (2q, vrow), (2q, vrow + 8), (2q + 1, vrow), (2q + 1, vrow + 8)
    if (!is_map) cuda::ldmatrix_x4_trans(vv, v_addr + at.lane_off(q));
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int nt = 2 * q + h;
      const float2 b = fb[4 * nt], be = fbe[4 * nt];
#pragma unroll
      for (int h2 = 0; h2 < 2; ++h2) {
        float v[2];
        cuda::unpack_bf16<2>(vv[2 * h + h2], v);
        r[4 * nt + 2 * h2] = b.x * v[0] - be.x * x[4 * nt + 2 * h2];
        r[4 * nt + 2 * h2 + 1] = b.y * v[1] - be.y * x[4 * nt + 2 * h2 + 1];
      }
    }
  }
  pack_a(r, ra);
}

// V'ᵀ = R̃ᵀ Tᵀ; waits for it and for Y (committed before it).
template <int D, bool Out>
__device__ __forceinline__ void state_vprime(uint32_t (&ra)[4][4], float (&u)[32], uint32_t t_addr, float (&y)[32],
                                             uint32_t (&sa)[D / 16][4]) {
  cuda::fence_operands(ra);
  cuda::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kC / 16; ++kk)
    cuda::wgmma_m64n64k16_rs<0>(u, ra[kk], desc_k_major(t_addr + kk * 32), kk > 0);
  cuda::wgmma_commit();
  cuda::fence_operands(u);
  cuda::wgmma_wait<0>();  // V', and Y (committed before it)
  cuda::fence_operands(u);
  cuda::fence_operands(ra);
  if constexpr (Out) {
    cuda::fence_operands(y);
    cuda::fence_operands(sa);
  }
}

// V''ᵀ = V'ᵀ ⊙ e^{γ_C−γ} (fragments wa) for the state, V'ᵀ (ua) for the output; V' recorded for
// the backward; S ← e^{γ_C} S; Y ← scale e^γ Y.
template <int D, bool Out>
__device__ __forceinline__ void state_scale(const float (&u)[32], float (&s)[D / 64][32], float (&y)[32], const float* fac,
                                            const StatePassArgs& a, const StateLane& at, bool is_map, int chunk, int head,
                                            uint32_t (&wa)[4][4], uint32_t (&ua)[4][4]) {
  const float2* fd = reinterpret_cast<const float2*>(fac + 2 * kC) + at.c4;
  float w[32];
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
    const float2 d = fd[4 * nt];
#pragma unroll
    for (int h2 = 0; h2 < 2; ++h2) {
      w[4 * nt + 2 * h2] = u[4 * nt + 2 * h2] * d.x;
      w[4 * nt + 2 * h2 + 1] = u[4 * nt + 2 * h2 + 1] * d.y;
    }
  }
  pack_a(w, wa);
  if constexpr (Out) pack_a(u, ua);
  if (a.vnew && !is_map) store_transposed<D>(u, a.vnew + (int64_t(chunk) * a.heads + head) * kC * D, 0, at);
  const float decay = fac[4 * kC - 1];  // e^{γ_C}
#pragma unroll
  for (int mb = 0; mb < D / 64; ++mb)
#pragma unroll
    for (int j = 0; j < 32; ++j) s[mb][j] *= decay;
  if constexpr (Out) {
    const float2* fe = reinterpret_cast<const float2*>(fac + 3 * kC) + at.c4;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      const float2 e = fe[4 * nt];
#pragma unroll
      for (int h2 = 0; h2 < 2; ++h2) {
        y[4 * nt + 2 * h2] *= a.scale * e.x;
        y[4 * nt + 2 * h2 + 1] *= a.scale * e.y;
      }
    }
  }
}

// The state update Sᵀ += V''ᵀ K (K block mb read N-major), and Yᵀ += V'ᵀ Pᵀ with outputs; waits
// for the state update (Y may still run).
template <int D, bool Out>
__device__ __forceinline__ void state_update(float (&s)[D / 64][32], uint32_t (&wa)[4][4], uint32_t (&ua)[4][4],
                                             float (&y)[32], uint32_t k_addr, uint32_t p_addr) {
  cuda::fence_operands(wa);
#pragma unroll
  for (int mb = 0; mb < D / 64; ++mb) cuda::fence_operands(s[mb]);
  cuda::wgmma_fence();
#pragma unroll
  for (int mb = 0; mb < D / 64; ++mb) {
#pragma unroll
    for (int kk = 0; kk < kC / 16; ++kk)
      cuda::wgmma_m64n64k16_rs<1>(s[mb], wa[kk], desc_mn_major(k_addr + mb * kBlock + kk * 2048), 1);
  }
  cuda::wgmma_commit();
#pragma unroll
  for (int mb = 0; mb < D / 64; ++mb) cuda::fence_operands(s[mb]);
  if constexpr (Out) {
    cuda::fence_operands(ua);
#pragma unroll
    for (int kk = 0; kk < kC / 16; ++kk) cuda::wgmma_m64n64k16_rs<0>(y, ua[kk], desc_k_major(p_addr + kk * 32), 1);
    cuda::wgmma_commit();
    cuda::fence_operands(y);
    cuda::wgmma_wait<1>();  // the state update
  } else {
    cuda::wgmma_wait<0>();
  }
#pragma unroll
  for (int mb = 0; mb < D / 64; ++mb) cuda::fence_operands(s[mb]);
  cuda::fence_operands(wa);
}

// The output epilogue: waits for Y, writes O = Yᵀ transposed into this chunk's staging block (two
// per warpgroup, alternating), then one TMA store; the store of the previous chunk has read the
// other block before the barrier.
__device__ __forceinline__ void state_store_output(float (&y)[32], uint32_t (&ua)[4][4], const CUtensorMap* o_map,
                                                   uint32_t ob, const StateLane& at, bool issuer, int head, int t0) {
  cuda::wgmma_wait<0>();
  cuda::fence_operands(y);
  cuda::fence_operands(ua);
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const uint32_t r[4] = {cuda::pack_bf16(y[8 * q], y[8 * q + 1]), cuda::pack_bf16(y[8 * q + 2], y[8 * q + 3]),
                           cuda::pack_bf16(y[8 * q + 4], y[8 * q + 5]), cuda::pack_bf16(y[8 * q + 6], y[8 * q + 7])};
    cuda::stmatrix_x4_trans(ob + at.lane_off(q), r);
  }
  cuda::fence_proxy_async();
  if (issuer) cuda::bulk_wait_read_all();
  cuda::named_barrier_sync(1 + at.grp, 128);
  if (issuer) {
    cuda::tma_store_3d(o_map, ob, at.col0, head, t0);
    cuda::bulk_commit();
  }
}

// Each consumer warpgroup keeps its 64 state columns transposed, Sᵀ[cols][D] (the m64n64
// accumulators of D/64 blocks of d), so that every product takes its left operand from registers
// and no intermediate goes through shared memory:
//   Xᵀ = Sᵀ Kᵀ, Yᵀ = Sᵀ Qᵀ        (A: Sᵀ as bf16 fragments; B: K, Q read K-major)
//   R̃ᵀ = β ⊙ Vᵀ − β e^γ ⊙ Xᵀ        (per column j; Vᵀ through transposing ldmatrix)
//   V'ᵀ = R̃ᵀ Tᵀ                    (B: T read K-major)
//   Sᵀ ← e^{γ_C} Sᵀ + (V'ᵀ ⊙ e^{γ_C−γ}) K   (B: K read N-major)
//   Oᵀ = scale e^γ ⊙ Yᵀ + V'ᵀ Pᵀ    -> transposing stmatrix into a staging block -> TMA store
// The only shared-memory writes of the loop are the output's, so the only proxy fence and
// warpgroup barrier are the output's (none without outputs). The kernel is the sequence of the
// stages above (state_produce; state_init, then per chunk state_xy, state_residual, state_vprime,
// state_scale, state_update, pack_state, record_state, state_store_output).
template <int D, bool Out>
__global__ void __launch_bounds__(128 * (D / 64 + 1), 1) gdn_state_kernel(const __grid_constant__ StateParams prm) {
  using L = StateSmemT<D, Out>;
  constexpr int kGroups = L::kGroups, kStages = L::kStages, kMb = D / 64;
  const StatePassArgs& a = prm.a;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* base = smem_raw + ((1024u - (cuda::smem_addr(smem_raw) & 1023u)) & 1023u);  // swizzle atoms
  uint64_t* full = reinterpret_cast<uint64_t*>(base + L::barriers);
  uint64_t* empty = full + kStages;
  const int head = blockIdx.y, segment = blockIdx.z;
  const bool is_map = a.map_tiles && blockIdx.x == 1;  // tile 0: S (values), tile 1: M
  const int chunk_begin = segment * a.chunks_per_segment;
  const int chunk_end = min(a.chunks, chunk_begin + a.chunks_per_segment);
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      cuda::mbar_init(&full[s], 1);
      cuda::mbar_init(&empty[s], 4 * kGroups);
    }
    cuda::mbar_fence_init();
  }
  __syncthreads();
  const int warp_id = threadIdx.x / 32, lane = threadIdx.x % 32;

  if (warp_id >= 4 * kGroups) {  // the producer warpgroup: one thread issues every load
    if constexpr (kGroups == 2) cuda::setmaxnreg_dec<24>();
    if (warp_id == 4 * kGroups && lane == 0) state_produce<D, Out>(prm, base, full, empty, is_map, chunk_begin, chunk_end, head);
    return;
  }

  if constexpr (kGroups == 2) cuda::setmaxnreg_inc<240>();
  const StateLane at(warp_id, lane);
  const int64_t seg = segment * a.segment_stride, hblock = int64_t(head) * D * D;
  const uint32_t o_addr = cuda::smem_addr(base + L::outs) + at.grp * 2 * kBlock;
  const bool issuer = at.warp == 0 && lane == 0;  // the warpgroup's TMA stores
  float s[kMb][32];        // Sᵀ (state_init's layout)
  uint32_t sa[D / 16][4];  // Sᵀ as bf16 A fragments (pack_state)
  state_init<D>(s, a, at, is_map, seg, hblock);
  pack_state<D>(s, sa);
  record_state<D>(s, a, at, is_map, chunk_begin, chunk_end, head);
  for (int chunk = chunk_begin, i = 0; chunk < chunk_end; ++chunk, ++i) {
    const int st = i % kStages;
    unsigned char* sb = base + st * L::stage;
    const uint32_t k_addr = cuda::smem_addr(sb + L::k);
    const float* fac = reinterpret_cast<const float*>(sb + L::f);  // [4][64]
    cuda::mbar_wait(&full[st], (i / kStages) & 1);
    float x[32], u[32];
    [[maybe_unused]] float y[32];
    uint32_t ra[4][4], wa[4][4];
    [[maybe_unused]] uint32_t ua[4][4];
    state_xy<D, Out>(sa, x, y, k_addr, cuda::smem_addr(sb + L::q));
    state_residual(x, fac, cuda::smem_addr(sb + L::v + at.grp * kBlock), is_map, at, ra);
    state_vprime<D, Out>(ra, u, cuda::smem_addr(sb + L::t), y, sa);
    state_scale<D, Out>(u, s, y, fac, a, at, is_map, chunk, head, wa, ua);
    state_update<D, Out>(s, wa, ua, y, k_addr, cuda::smem_addr(sb + L::p));
    pack_state<D>(s, sa);  // for the next chunk (X and Y, the readers of the old fragments, are complete)
    record_state<D>(s, a, at, is_map, chunk + 1, chunk_end, head);
    if constexpr (Out) state_store_output(y, ua, &prm.maps.o, o_addr + (i & 1) * kBlock, at, issuer, head, chunk * kC);
    // Every read of this stage by this warp is complete (its wgmmas waited for, V loaded).
    __syncwarp();
    if (lane == 0) cuda::mbar_arrive(&empty[st]);
  }
  if constexpr (Out) {
    if (issuer) cuda::bulk_wait_all();
  }
  float* dst = is_map ? a.map_out : a.state_out;
  if (dst) {  // the final state (or map), in state_init's layout
    dst += seg + hblock;
#pragma unroll
    for (int mb = 0; mb < kMb; ++mb)
#pragma unroll
      for (int e = 0; e < 32; ++e) {
        const int v = at.col0 + at.vrow + 8 * ((e % 4) / 2), d = 64 * mb + 8 * (e / 4) + 2 * at.c4 + (e % 2);
        dst[int64_t(d) * D + v] = s[mb][e];
      }
  }
}

template <int D>
void launch_state(const StatePassArgs& args) {
  HYDRA_ASSERT(!(args.out && args.map_tiles), "GDN state pass: map tiles have no outputs");
  const int64_t tile_rows = int64_t{args.chunks} * args.heads * kC;
  HYDRA_ASSERT(tile_rows < (int64_t{1} << 31), "GDN state pass: {} chunk-head tiles exceed TMA's coordinates",
               int64_t{args.chunks} * args.heads);
  HYDRA_ASSERT(reinterpret_cast<uintptr_t>(args.factors) % 16 == 0, "GDN state pass: factors must be 16-byte aligned");
  StateParams prm{};
  prm.a = args;
  const int t_len = args.t_len, heads = args.heads;
  prm.maps.k = cuda::make_tma_map_bf16(args.k.ptr, t_len, heads, D, args.k.st, args.k.sh, kC);
  prm.maps.v = cuda::make_tma_map_bf16(args.v.ptr, t_len, heads, D, args.v.st, args.v.sh, kC);
  prm.maps.q = args.out ? cuda::make_tma_map_bf16(args.q.ptr, t_len, heads, D, args.q.st, args.q.sh, kC) : prm.maps.k;
  prm.maps.o = args.out ? cuda::make_tma_map_bf16(args.out, t_len, heads, D, args.out_st, args.out_sh, kC) : prm.maps.k;
  prm.maps.t = tile_map(args.t, tile_rows);
  prm.maps.p = args.out ? tile_map(args.p, tile_rows) : prm.maps.t;
  const dim3 grid(args.map_tiles ? 2 : 1, heads, args.segments);
  auto launch = [&](auto kernel, size_t smem) {
    HYDRA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    kernel<<<grid, 128 * (D / 64 + 1), smem, current_stream()>>>(prm);
    HYDRA_CUDA_LAUNCH_CHECK();
  };
  if (args.out) {
    launch(gdn_state_kernel<D, true>, StateSmemT<D, true>::total);
  } else {
    launch(gdn_state_kernel<D, false>, StateSmemT<D, false>::total);
  }
}

}  // namespace

void state_pass(const StatePassArgs& args, int head_dim) {
  HYDRA_ASSERT(args.chunks_per_segment > 0, "state pass: empty segments");
  if (args.segments == 0) return;
  if (head_dim == 128) {
    launch_state<128>(args);
  } else {
    launch_state<64>(args);
  }
}

}  // namespace hydra::ops::cuda_impl::gdn
