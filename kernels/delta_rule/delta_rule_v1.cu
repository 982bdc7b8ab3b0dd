// The previous chunked gated delta rule on the GPU, kept (HYDRA_GDN_KERNEL=v1) only as the proven
// fallback until the restructured forward (delta_rule_prepare.cu, delta_rule_state.cu,
// delta_rule_forward.cu) has passed its tests on an H200; then this file is deleted.
//
// Chunk C = 64, head dim D = dk = dv ∈ {64, 128}, fp32 state.
//
// Three kernels per call (the WY/UT form of delta_rule.h; bf16 tensor-core products with fp32
// accumulation, fp32 state and statistics):
//  1. prepare  (grid: chunks × heads, parallel): γ = cumsum(g) in the chunk; L = strictly-lower
//     β_i (k_i·k_j) e^{γ_i−γ_j}; T = (I + L)⁻¹ by blocked forward substitution; W = T(β e^γ K),
//     U = T(β V), K̃ = e^{γ_C−γ} K. Written chunk-major to a workspace.
//  2. state    (grid: value-column tiles × heads, sequential over chunks): the state tile
//     S[:, tile] lives in registers; per chunk V' = U − W S and S ← e^{γ_C} S + K̃ᵀ V'. It stores
//     each chunk's starting state (bf16) and V' for kernel 3. The segment affine map uses the same
//     kernel on the augmented state [S_ext | M] with values [U | 0] and initial state [0 | I]
//     (M ← e^{γ_C} M − K̃ᵀ(W M) is the state update with U = 0).
//  3. output   (grid: chunks × heads, parallel): O = scale·(e^γ ⊙ (Q S_c) + ((Q Kᵀ) ⊙ D) V').
// Rows past the end of the sequence are zero-filled with g = β = 0, which makes them identity
// steps, so any length works.
#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/delta_rule/delta_rule.h"
#include "kernels/delta_rule/delta_rule_cuda.cuh"
#include "kernels/matmul/matmul.h"

namespace hydra::ops::cuda_impl {
namespace {

using gdn::fold_maps;
using gdn::StageProfile;

constexpr int kC = 64;  // chunk

struct Seq {  // [T, H, D] bf16 rows, or [T, H] f32 gates
  const void* ptr;
  int64_t st, sh;
};

// ---------------------------------------------------------------------------------------------
// Kernel 1: per-chunk W, U, K̃, γ.
template <int D>
struct PrepareSmem {
  static constexpr int kChunks = D / 8;
  static constexpr size_t k_bytes = kC * D * 2;  // K, later β e^γ K (bf16, swizzled)
  static constexpr size_t v_bytes = kC * D * 2;  // β V (bf16, swizzled)
  // L in fp32 and per-warp 16×16 scratch during the inverse; afterwards the same bytes hold T as
  // bf16 with padded rows (kC·(kC+8)·2 bytes) for the W/U products.
  static constexpr size_t l_bytes = kC * kC * 4 + 4 * 256 * 4;
  static constexpr size_t inv_bytes = kC * kC * 4;  // T = (I + L)⁻¹ in fp32
  static constexpr size_t total = k_bytes + v_bytes + l_bytes + inv_bytes + 5 * kC * 4;
  static_assert(kC * (kC + 8) * 2 <= l_bytes, "bf16 T must fit in the L buffer");
};

template <int D>
__global__ void __launch_bounds__(256) gdn_prepare_kernel(Seq k, Seq v, Seq g, Seq beta, int t_len, int heads,
                                                          bf16_t* w_out, bf16_t* u_out, bf16_t* kt_out,
                                                          float* gamma_out) {
  using S = PrepareSmem<D>;
  constexpr int kChunks = S::kChunks;
  extern __shared__ __align__(128) unsigned char smem[];
  unsigned char* sk = smem;
  unsigned char* sv = sk + S::k_bytes;
  float* sl = reinterpret_cast<float*>(sv + S::v_bytes);
  bf16_t* st = reinterpret_cast<bf16_t*>(sl);  // T (bf16) reuses L's bytes once the inverse is done
  float* sinv = reinterpret_cast<float*>(sv + S::v_bytes + S::l_bytes);
  float* sgamma = sinv + kC * kC;
  float* sbeta = sgamma + kC;
  float* sraw = sbeta + kC;
  float* sexp = sraw + kC;    // e^{γ_i}
  float* stail = sexp + kC;   // e^{γ_C − γ_i}
  const int chunk = blockIdx.x, head = blockIdx.y, t0 = chunk * kC;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int valid = min(kC, t_len - t0);

  // Load K and V rows (zero past the end), g and β.
  for (int i = tid; i < kC * kChunks; i += 256) {
    const int r = i / kChunks, c = i % kChunks;
    const bool ok = r < valid;
    const bf16_t* kp = static_cast<const bf16_t*>(k.ptr) + (ok ? (t0 + r) * k.st : 0) + head * k.sh + c * 8;
    const bf16_t* vp = static_cast<const bf16_t*>(v.ptr) + (ok ? (t0 + r) * v.st : 0) + head * v.sh + c * 8;
    cuda::cp_async_16(cuda::smem_addr(sk) + cuda::swizzled<kChunks>(r, c), kp, ok ? 16 : 0);
    cuda::cp_async_16(cuda::smem_addr(sv) + cuda::swizzled<kChunks>(r, c), vp, ok ? 16 : 0);
  }
  cuda::cp_async_commit();
  if (tid < kC) {
    const bool ok = tid < valid;
    sraw[tid] = ok ? static_cast<const float*>(g.ptr)[(t0 + tid) * g.st + head * g.sh] : 0.0f;
    sbeta[tid] = ok ? static_cast<const float*>(beta.ptr)[(t0 + tid) * beta.st + head * beta.sh] : 0.0f;
  }
  __syncthreads();
  if (warp == 0) {  // inclusive prefix sum of g over the chunk (two values per lane)
    float a = sraw[2 * lane], b = a + sraw[2 * lane + 1];
    for (int o = 1; o < 32; o *= 2) {
      const float up = __shfl_up_sync(0xffffffffu, b, o);
      if (lane >= o) {
        a += up;
        b += up;
      }
    }
    sgamma[2 * lane] = a;
    sgamma[2 * lane + 1] = b;
  }
  cuda::cp_async_wait<0>();
  __syncthreads();

  // KKᵀ (64×64): warp w computes rows 16·(w%4).., columns 32·(w/4).. .
  {
    const int m0 = (warp % 4) * 16, n0 = (warp / 4) * 32;
    float acc[4][4] = {};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t a[4];
      cuda::ldmatrix_x4(a, cuda::smem_addr(sk) + cuda::swizzled<kChunks>(m0 + lane % 16, kk * 2 + lane / 16));
#pragma unroll
      for (int j = 0; j < 4; j += 2) {
        uint32_t b[4];
        const int key = n0 + j * 8 + (lane % 8) + (lane / 16) * 8, c = kk * 2 + (lane / 8) % 2;
        cuda::ldmatrix_x4(b, cuda::smem_addr(sk) + cuda::swizzled<kChunks>(key, c));
        cuda::mma_bf16(acc[j], a, b[0], b[1]);
        cuda::mma_bf16(acc[j + 1], a, b[2], b[3]);
      }
    }
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = m0 + lane / 4 + (e / 2) * 8, jj = n0 + j * 8 + (lane % 4) * 2 + (e % 2);
        sl[i * kC + jj] = jj < i ? sbeta[i] * acc[j][e] * expf(sgamma[i] - sgamma[jj]) : 0.0f;
      }
  }
  __syncthreads();
  // T = (I + L)⁻¹ (unit lower triangular) by 16×16 blocks, into `sinv`:
  //  1. warp b inverts diagonal block b by forward substitution (warp-synchronous, no CTA barrier):
  //     X[i][c] = −(L[i][c] + Σ_{c<j<i} L[i][j] X[j][c]) for c < i;
  //  2. off-diagonal blocks by distance d = i − j: X_ij = −X_ii Σ_{k=j}^{i−1} L_ik X_kj, all blocks of
  //     one distance in parallel (one warp each), a CTA barrier between distances.
  {
    for (int i = tid; i < kC * kC; i += 256) sinv[i] = (i / kC == i % kC) ? 1.0f : 0.0f;
    __syncthreads();
    if (warp < 4) {
      const int r0 = warp * 16, c = lane;
      for (int i = 1; i < 16; ++i) {
        float acc = 0.0f;
        if (c < i) {
          acc = sl[(r0 + i) * kC + r0 + c];
          for (int j = c + 1; j < i; ++j) acc += sl[(r0 + i) * kC + r0 + j] * sinv[(r0 + j) * kC + r0 + c];
        }
        __syncwarp();
        if (c < i) sinv[(r0 + i) * kC + r0 + c] = -acc;
        __syncwarp();
      }
    }
    __syncthreads();
    float* scratch = sl + kC * kC;  // 16×16 per warp
    for (int dist = 1; dist < 4; ++dist) {
      if (warp < 4 - dist) {
        const int bj = warp, bi = warp + dist;
        float* y = scratch + warp * 256;
        for (int e = lane; e < 256; e += 32) {  // Y = Σ_k L_ik X_kj
          const int r = e / 16, cc = e % 16;
          float acc = 0.0f;
          for (int bk = bj; bk < bi; ++bk)
            for (int t = 0; t < 16; ++t) acc += sl[(bi * 16 + r) * kC + bk * 16 + t] * sinv[(bk * 16 + t) * kC + bj * 16 + cc];
          y[e] = acc;
        }
        __syncwarp();
        for (int e = lane; e < 256; e += 32) {  // X_ij = −X_ii Y
          const int r = e / 16, cc = e % 16;
          float acc = 0.0f;
          for (int t = 0; t <= r; ++t) acc += sinv[(bi * 16 + r) * kC + bi * 16 + t] * y[t * 16 + cc];
          sinv[(bi * 16 + r) * kC + bj * 16 + cc] = -acc;
        }
      }
      __syncthreads();
    }
  }
  // T (bf16, diagonal 1; L's bytes are free now) and the scaled right-hand sides β e^γ K (in place
  // of K) and β V.
  for (int i = tid; i < kC * kC; i += 256) st[(i / kC) * (kC + 8) + i % kC] = __float2bfloat16_rn(sinv[i]);
  if (tid < kC) {
    sexp[tid] = expf(sgamma[tid]);
    stail[tid] = expf(sgamma[kC - 1] - sgamma[tid]);
  }
  __syncthreads();
  for (int i = tid; i < kC * D; i += 256) {
    const int r = i / D, c = i % D;
    bf16_t* kp = reinterpret_cast<bf16_t*>(sk + cuda::swizzled<kChunks>(r, c / 8)) + c % 8;
    bf16_t* vp = reinterpret_cast<bf16_t*>(sv + cuda::swizzled<kChunks>(r, c / 8)) + c % 8;
    const float kv = __bfloat162float(*kp);
    const int64_t o = ((int64_t(chunk) * heads + head) * kC + r) * D + c;
    kt_out[o] = __float2bfloat16_rn(kv * stail[r]);
    *kp = __float2bfloat16_rn(kv * sbeta[r] * sexp[r]);
    *vp = __float2bfloat16_rn(__bfloat162float(*vp) * sbeta[r]);
  }
  if (tid < kC) gamma_out[(int64_t(chunk) * heads + head) * kC + tid] = sgamma[tid];
  __syncthreads();
  // W = T (β e^γ K), U = T (β V): warp w: rows 16·(w%4), columns half (w/4) of D.
  {
    const int m0 = (warp % 4) * 16, nbase = (warp / 4) * (D / 2);
    for (int which = 0; which < 2; ++which) {
      const unsigned char* rhs = which == 0 ? sk : sv;
      bf16_t* dst = which == 0 ? w_out : u_out;
      float acc[D / 16][4] = {};
#pragma unroll
      for (int kk = 0; kk < kC / 16; ++kk) {
        uint32_t a[4];
        cuda::ldmatrix_x4(a, cuda::smem_addr(st) + ((m0 + lane % 16) * (kC + 8) + kk * 16 + (lane / 16) * 8) * 2);
#pragma unroll
        for (int j = 0; j < D / 16; j += 2) {
          uint32_t b[4];
          const int row = kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8, c = (nbase + j * 8) / 8 + lane / 16;
          cuda::ldmatrix_x4_trans(b, cuda::smem_addr(rhs) + cuda::swizzled<kChunks>(row, c));
          cuda::mma_bf16(acc[j], a, b[0], b[1]);
          cuda::mma_bf16(acc[j + 1], a, b[2], b[3]);
        }
      }
#pragma unroll
      for (int j = 0; j < D / 16; ++j)
#pragma unroll
        for (int h2 = 0; h2 < 2; ++h2) {
          const int r = m0 + lane / 4 + h2 * 8, c = nbase + j * 8 + (lane % 4) * 2;
          const int64_t o = ((int64_t(chunk) * heads + head) * kC + r) * D + c;
          *reinterpret_cast<uint32_t*>(dst + o) = cuda::pack_bf16(acc[j][2 * h2], acc[j][2 * h2 + 1]);
        }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Kernel 2: the sequential state pass over chunks for one (head, column tile).
template <int D, int BV>
struct StateSmem {
  static constexpr int kPad = BV + 8;                  // padded rows for BV-wide tiles
  static constexpr size_t wk_bytes = kC * D * 2;       // one of W / K̃ (swizzled)
  static constexpr size_t u_bytes = kC * kPad * 2;
  static constexpr size_t stage = 2 * wk_bytes + u_bytes;
  static constexpr size_t s_bytes = D * kPad * 2;      // S (bf16) as a B operand
  static constexpr size_t vn_bytes = kC * kPad * 2;    // V'
  static constexpr size_t total = 2 * stage + s_bytes + vn_bytes + 2 * kC * 4;
};

struct StateArgs {
  const bf16_t* w;
  const bf16_t* u;
  const bf16_t* kt;
  const float* gamma;
  int chunks, heads;
  const float* state_in;   // [H, D, D] or null (zeros); ignored for map tiles
  float* state_out;        // [H, D, D] final state (S_ext for maps)
  float* map_out;          // [H, D, D] M (maps only) or null
  bf16_t* chunk_states;    // [chunks, H, D, D] starting state of each chunk, or null
  bf16_t* vnew;            // [chunks, H, C, D] V', or null
  int value_tiles;         // D / BV; tiles ≥ value_tiles (maps only) are M tiles
  int chunks_per_segment;  // blockIdx.z runs chunks [z·cps, min((z+1)·cps, chunks))
  int64_t segment_stride;  // elements between segments in state_in / state_out / map_out
};

template <int D, int BV>
__global__ void __launch_bounds__(128) gdn_state_kernel(const StateArgs a) {
  using S = StateSmem<D, BV>;
  constexpr int kChunks = D / 8, kPad = S::kPad;
  constexpr int kRowsPerWarp = D / 4, kMt = kRowsPerWarp / 16, kNt = BV / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  unsigned char* stage_base = smem;
  bf16_t* ss = reinterpret_cast<bf16_t*>(smem + 2 * S::stage);
  bf16_t* svn = reinterpret_cast<bf16_t*>(smem + 2 * S::stage + S::s_bytes);
  float* sdecay = reinterpret_cast<float*>(smem + 2 * S::stage + S::s_bytes + S::vn_bytes);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int head = blockIdx.y;
  const bool is_map_tile = static_cast<int>(blockIdx.x) >= a.value_tiles;
  const int col0 = (is_map_tile ? blockIdx.x - a.value_tiles : blockIdx.x) * BV;
  const int chunk_begin = blockIdx.z * a.chunks_per_segment;
  const int chunk_end = min(a.chunks, chunk_begin + a.chunks_per_segment);
  const int64_t seg = blockIdx.z * a.segment_stride;

  // State tile in registers: warp owns rows [warp·D/4, +D/4), all BV columns.
  float s[kMt][kNt][4];
#pragma unroll
  for (int mt = 0; mt < kMt; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNt; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = warp * kRowsPerWarp + mt * 16 + lane / 4 + (e / 2) * 8;
        const int c = col0 + nt * 8 + (lane % 4) * 2 + (e % 2);
        float init = 0.0f;
        if (is_map_tile) {
          init = r == c ? 1.0f : 0.0f;
        } else if (a.state_in) {
          init = a.state_in[seg + (int64_t(head) * D + r) * D + c];
        }
        s[mt][nt][e] = init;
      }

  auto load_chunk = [&](int chunk, int stage) {
    unsigned char* base = stage_base + stage * S::stage;
    const int64_t off = (int64_t(chunk) * a.heads + head) * kC * D;
    for (int i = tid; i < kC * kChunks; i += 128) {
      const int r = i / kChunks, c = i % kChunks;
      cuda::cp_async_16(cuda::smem_addr(base) + cuda::swizzled<kChunks>(r, c), a.w + off + r * D + c * 8, 16);
      cuda::cp_async_16(cuda::smem_addr(base + S::wk_bytes) + cuda::swizzled<kChunks>(r, c), a.kt + off + r * D + c * 8, 16);
    }
    if (!is_map_tile) {
      for (int i = tid; i < kC * (BV / 8); i += 128) {
        const int r = i / (BV / 8), c = i % (BV / 8);
        cuda::cp_async_16(cuda::smem_addr(base + 2 * S::wk_bytes) + (r * kPad + c * 8) * 2,
                          a.u + off + r * D + col0 + c * 8, 16);
      }
    }
    if (tid == 0) sdecay[stage] = expf(a.gamma[(int64_t(chunk) * a.heads + head) * kC + kC - 1]);
  };

  load_chunk(chunk_begin, 0);
  cuda::cp_async_commit();
  for (int chunk = chunk_begin; chunk < chunk_end; ++chunk) {
    const int stage = (chunk - chunk_begin) % 2;
    // S (bf16) to shared memory; also the chunk's starting state for the output kernel.
#pragma unroll
    for (int mt = 0; mt < kMt; ++mt)
#pragma unroll
      for (int nt = 0; nt < kNt; ++nt)
#pragma unroll
        for (int h2 = 0; h2 < 2; ++h2) {
          const int r = warp * kRowsPerWarp + mt * 16 + lane / 4 + h2 * 8, c = nt * 8 + (lane % 4) * 2;
          const uint32_t packed = cuda::pack_bf16(s[mt][nt][2 * h2], s[mt][nt][2 * h2 + 1]);
          *reinterpret_cast<uint32_t*>(ss + r * kPad + c) = packed;
          if (a.chunk_states) {
            *reinterpret_cast<uint32_t*>(a.chunk_states + ((int64_t(chunk) * a.heads + head) * D + r) * D + col0 + c) = packed;
          }
        }
    cuda::cp_async_wait<0>();
    __syncthreads();
    if (chunk + 1 < chunk_end) load_chunk(chunk + 1, stage ^ 1);
    cuda::cp_async_commit();
    const unsigned char* sw = stage_base + stage * S::stage;
    const unsigned char* skt = sw + S::wk_bytes;
    const bf16_t* su = reinterpret_cast<const bf16_t*>(sw + 2 * S::wk_bytes);
    // V' = U − W S: warp w computes rows 16·w of the chunk, all BV columns.
    {
      float p[kNt][4] = {};
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t af[4];
        cuda::ldmatrix_x4(af, cuda::smem_addr(sw) + cuda::swizzled<kChunks>(warp * 16 + lane % 16, kk * 2 + lane / 16));
#pragma unroll
        for (int nt = 0; nt < kNt; nt += 2) {
          uint32_t b[4];
          const int row = kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8, c = nt * 8 + (lane / 16) * 8;
          cuda::ldmatrix_x4_trans(b, cuda::smem_addr(ss) + (row * kPad + c) * 2);
          cuda::mma_bf16(p[nt], af, b[0], b[1]);
          cuda::mma_bf16(p[nt + 1], af, b[2], b[3]);
        }
      }
#pragma unroll
      for (int nt = 0; nt < kNt; ++nt)
#pragma unroll
        for (int h2 = 0; h2 < 2; ++h2) {
          const int r = warp * 16 + lane / 4 + h2 * 8, c = nt * 8 + (lane % 4) * 2;
          float v0 = -p[nt][2 * h2], v1 = -p[nt][2 * h2 + 1];
          if (!is_map_tile) {
            v0 += __bfloat162float(su[r * kPad + c]);
            v1 += __bfloat162float(su[r * kPad + c + 1]);
          }
          const uint32_t packed = cuda::pack_bf16(v0, v1);
          *reinterpret_cast<uint32_t*>(svn + r * kPad + c) = packed;
          if (a.vnew) *reinterpret_cast<uint32_t*>(a.vnew + ((int64_t(chunk) * a.heads + head) * kC + r) * D + col0 + c) = packed;
        }
    }
    __syncthreads();
    // S ← e^{γ_C} S + K̃ᵀ V'.
    const float decay = sdecay[stage];
#pragma unroll
    for (int mt = 0; mt < kMt; ++mt)
#pragma unroll
      for (int nt = 0; nt < kNt; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mt][nt][e] *= decay;
#pragma unroll
    for (int kk = 0; kk < kC / 16; ++kk) {
#pragma unroll
      for (int mt = 0; mt < kMt; ++mt) {
        uint32_t af[4];  // A = K̃ᵀ through a transposing load of K̃ [C][D]
        const int d0 = warp * kRowsPerWarp + mt * 16;
        const int row = kk * 16 + (lane % 8) + (lane / 16) * 8, c = d0 / 8 + (lane / 8) % 2;
        cuda::ldmatrix_x4_trans(af, cuda::smem_addr(skt) + cuda::swizzled<kChunks>(row, c));
#pragma unroll
        for (int nt = 0; nt < kNt; nt += 2) {
          uint32_t b[4];
          const int vrow = kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8, vc = nt * 8 + (lane / 16) * 8;
          cuda::ldmatrix_x4_trans(b, cuda::smem_addr(svn) + (vrow * kPad + vc) * 2);
          cuda::mma_bf16(s[mt][nt], af, b[0], b[1]);
          cuda::mma_bf16(s[mt][nt + 1], af, b[2], b[3]);
        }
      }
    }
    __syncthreads();  // ss / svn are rewritten next chunk
  }
  float* dst = is_map_tile ? a.map_out : a.state_out;
  if (dst) {
    dst += seg;
#pragma unroll
    for (int mt = 0; mt < kMt; ++mt)
#pragma unroll
      for (int nt = 0; nt < kNt; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = warp * kRowsPerWarp + mt * 16 + lane / 4 + (e / 2) * 8;
          const int c = col0 + nt * 8 + (lane % 4) * 2 + (e % 2);
          dst[(int64_t(head) * D + r) * D + c] = s[mt][nt][e];
        }
  }
}

// ---------------------------------------------------------------------------------------------
// Kernel 3: outputs of one chunk.
template <int D>
struct OutputSmem {
  static constexpr size_t row_bytes = kC * D * 2;
  static constexpr size_t total = 3 * row_bytes + size_t(D) * D * 2 + kC * 4;  // Q, K, V', S_c, γ
};

template <int D>
__global__ void __launch_bounds__(128) gdn_output_kernel(Seq q, Seq k, int t_len, int heads, const bf16_t* chunk_states,
                                                         const bf16_t* vnew, const float* gamma, float scale,
                                                         bf16_t* out, int64_t out_st, int64_t out_sh) {
  constexpr int kChunks = D / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  unsigned char* sq = smem;
  unsigned char* sk = sq + OutputSmem<D>::row_bytes;
  unsigned char* svn = sk + OutputSmem<D>::row_bytes;
  unsigned char* sst = svn + OutputSmem<D>::row_bytes;
  float* sgamma = reinterpret_cast<float*>(sst + size_t(D) * D * 2);
  const int chunk = blockIdx.x, head = blockIdx.y, t0 = chunk * kC;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int valid = min(kC, t_len - t0);
  const int64_t coff = (int64_t(chunk) * heads + head);
  for (int i = tid; i < kC * kChunks; i += 128) {
    const int r = i / kChunks, c = i % kChunks;
    const bool ok = r < valid;
    const bf16_t* qp = static_cast<const bf16_t*>(q.ptr) + (ok ? (t0 + r) * q.st : 0) + head * q.sh + c * 8;
    const bf16_t* kp = static_cast<const bf16_t*>(k.ptr) + (ok ? (t0 + r) * k.st : 0) + head * k.sh + c * 8;
    cuda::cp_async_16(cuda::smem_addr(sq) + cuda::swizzled<kChunks>(r, c), qp, ok ? 16 : 0);
    cuda::cp_async_16(cuda::smem_addr(sk) + cuda::swizzled<kChunks>(r, c), kp, ok ? 16 : 0);
    cuda::cp_async_16(cuda::smem_addr(svn) + cuda::swizzled<kChunks>(r, c), vnew + (coff * kC + r) * D + c * 8, 16);
  }
  for (int i = tid; i < D * kChunks; i += 128) {
    const int r = i / kChunks, c = i % kChunks;
    cuda::cp_async_16(cuda::smem_addr(sst) + cuda::swizzled<kChunks>(r, c), chunk_states + (coff * D + r) * D + c * 8, 16);
  }
  cuda::cp_async_commit();
  if (tid < kC) sgamma[tid] = gamma[coff * kC + tid];
  cuda::cp_async_wait<0>();
  __syncthreads();

  const int m0 = warp * 16;
  uint32_t qf[D / 16][4];
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
    cuda::ldmatrix_x4(qf[kk], cuda::smem_addr(sq) + cuda::swizzled<kChunks>(m0 + lane % 16, kk * 2 + lane / 16));
  // Inter-chunk part: Q S_c, rows scaled by scale·e^{γ_i}.
  float o[D / 8][4] = {};
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
    for (int j = 0; j < D / 8; j += 2) {
      uint32_t b[4];
      const int row = kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8, c = j + lane / 16;
      cuda::ldmatrix_x4_trans(b, cuda::smem_addr(sst) + cuda::swizzled<kChunks>(row, c));
      cuda::mma_bf16(o[j], qf[kk], b[0], b[1]);
      cuda::mma_bf16(o[j + 1], qf[kk], b[2], b[3]);
    }
  const int r0 = m0 + lane / 4, r1 = r0 + 8;
  const float e0 = scale * expf(sgamma[r0]), e1 = scale * expf(sgamma[r1]);
#pragma unroll
  for (int j = 0; j < D / 8; ++j) {
    o[j][0] *= e0;
    o[j][1] *= e0;
    o[j][2] *= e1;
    o[j][3] *= e1;
  }
  // Intra-chunk part: P = scale·(Q Kᵀ) ⊙ e^{γ_i−γ_j} (j ≤ i), then O += P V'.
  float sc[kC / 8][4] = {};
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
    for (int j = 0; j < kC / 8; j += 2) {
      uint32_t b[4];
      const int key = j * 8 + (lane % 8) + (lane / 16) * 8, c = kk * 2 + (lane / 8) % 2;
      cuda::ldmatrix_x4(b, cuda::smem_addr(sk) + cuda::swizzled<kChunks>(key, c));
      cuda::mma_bf16(sc[j], qf[kk], b[0], b[1]);
      cuda::mma_bf16(sc[j + 1], qf[kk], b[2], b[3]);
    }
#pragma unroll
  for (int j = 0; j < kC / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = e < 2 ? r0 : r1, jj = j * 8 + (lane % 4) * 2 + (e % 2);
      sc[j][e] = jj <= i ? sc[j][e] * scale * expf(sgamma[i] - sgamma[jj]) : 0.0f;
    }
#pragma unroll
  for (int kk = 0; kk < kC / 16; ++kk) {
    const uint32_t af[4] = {cuda::pack_bf16(sc[2 * kk][0], sc[2 * kk][1]), cuda::pack_bf16(sc[2 * kk][2], sc[2 * kk][3]),
                            cuda::pack_bf16(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                            cuda::pack_bf16(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
#pragma unroll
    for (int j = 0; j < D / 8; j += 2) {
      uint32_t b[4];
      const int row = kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8, c = j + lane / 16;
      cuda::ldmatrix_x4_trans(b, cuda::smem_addr(svn) + cuda::swizzled<kChunks>(row, c));
      cuda::mma_bf16(o[j], af, b[0], b[1]);
      cuda::mma_bf16(o[j + 1], af, b[2], b[3]);
    }
  }
#pragma unroll
  for (int h2 = 0; h2 < 2; ++h2) {
    const int r = h2 == 0 ? r0 : r1;
    if (r >= valid) continue;
    bf16_t* orow = out + (t0 + r) * out_st + head * out_sh;
#pragma unroll
    for (int j = 0; j < D / 8; ++j)
      *reinterpret_cast<uint32_t*>(orow + j * 8 + (lane % 4) * 2) = cuda::pack_bf16(o[j][2 * h2], o[j][2 * h2 + 1]);
  }
}

struct Workspace {
  Tensor w, u, kt, gamma;
};

Seq seq_of(const TensorView& x) { return Seq{x.data(), x.stride(0), x.stride(1)}; }

template <int D>
Workspace prepare(const TensorView& k, const TensorView& v, const TensorView& g, const TensorView& beta) {
  const int t_len = static_cast<int>(k.size(0)), heads = static_cast<int>(k.size(1));
  const int chunks = (t_len + kC - 1) / kC;
  Workspace ws{Tensor::empty({chunks, heads, kC, D}, DType::bf16, Device::cuda),
               Tensor::empty({chunks, heads, kC, D}, DType::bf16, Device::cuda),
               Tensor::empty({chunks, heads, kC, D}, DType::bf16, Device::cuda),
               Tensor::empty({chunks, heads, kC}, DType::f32, Device::cuda)};
  const size_t smem = PrepareSmem<D>::total;
  HYDRA_CUDA_CHECK(cudaFuncSetAttribute(gdn_prepare_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  gdn_prepare_kernel<D><<<dim3(chunks, heads), 256, smem, current_stream()>>>(
      seq_of(k), seq_of(v), Seq{g.data(), g.stride(0), g.stride(1)}, Seq{beta.data(), beta.stride(0), beta.stride(1)},
      t_len, heads, ws.w.data_as<bf16_t>(), ws.u.data_as<bf16_t>(), ws.kt.data_as<bf16_t>(), ws.gamma.data_as<float>());
  HYDRA_CUDA_LAUNCH_CHECK();
  return ws;
}

template <int D, int BV>
void launch_state(const StateArgs& args, int tiles, int segments) {
  const size_t smem = StateSmem<D, BV>::total;
  HYDRA_CUDA_CHECK(cudaFuncSetAttribute(gdn_state_kernel<D, BV>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  gdn_state_kernel<D, BV><<<dim3(tiles, args.heads, segments), 128, smem, current_stream()>>>(args);
  HYDRA_CUDA_LAUNCH_CHECK();
}

// The sequential state pass over `segments` independent chunk ranges. Value tiles are 16 columns
// wide when few CTAs would otherwise leave SMs idle, else 32.
template <int D>
void run_state(StateArgs args, bool with_maps, int segments) {
  const bool narrow = args.heads * (D / 32) * (with_maps ? 2 : 1) * segments < 200;
  if (narrow) {
    args.value_tiles = D / 16;
    launch_state<D, 16>(args, args.value_tiles * (with_maps ? 2 : 1), segments);
  } else {
    args.value_tiles = D / 32;
    launch_state<D, 32>(args, args.value_tiles * (with_maps ? 2 : 1), segments);
  }
}

// Chunks per segment of the in-GPU split scan: long sequences are cut into segments whose maps
// are computed in parallel and folded, so the sequential pass runs over ≤ kSplitChunks chunks.
constexpr int kSplitChunks = 256;
int split_segments(int chunks) { return chunks <= kSplitChunks ? 1 : (chunks + kSplitChunks - 1) / kSplitChunks; }

// Maps (S_ext, M) of every segment of `per_segment` chunks: [segments, H, D, D] each.
template <int D>
std::pair<Tensor, Tensor> segment_maps(const Workspace& ws, int chunks, int heads, int segments, int per_segment) {
  Tensor s_ext = Tensor::empty({segments, heads, D, D}, DType::f32, Device::cuda);
  Tensor m = Tensor::empty({segments, heads, D, D}, DType::f32, Device::cuda);
  StateArgs args{ws.w.data_as<bf16_t>(), ws.u.data_as<bf16_t>(), ws.kt.data_as<bf16_t>(), ws.gamma.data_as<float>(),
                 chunks, heads, nullptr, s_ext.data_as<float>(), m.data_as<float>(), nullptr, nullptr, 0,
                 per_segment, int64_t(heads) * D * D};
  run_state<D>(args, true, segments);
  return {std::move(s_ext), std::move(m)};
}

template <int D>
void chunked(const TensorView& out, const TensorView& state, const TensorView& q, const TensorView& k,
             const TensorView& v, const TensorView& g, const TensorView& beta, float scale) {
  const int t_len = static_cast<int>(k.size(0)), heads = static_cast<int>(k.size(1));
  const int chunks = (t_len + kC - 1) / kC;
  StageProfile profile;
  profile.mark("start");
  Workspace ws = prepare<D>(k, v, g, beta);
  profile.mark("prepare");
  Tensor states = Tensor::empty({chunks, heads, D, D}, DType::bf16, Device::cuda);
  Tensor vnew = Tensor::empty({chunks, heads, kC, D}, DType::bf16, Device::cuda);
  const int segments = split_segments(chunks), per_segment = (chunks + segments - 1) / segments;
  StateArgs args{ws.w.data_as<bf16_t>(), ws.u.data_as<bf16_t>(), ws.kt.data_as<bf16_t>(), ws.gamma.data_as<float>(),
                 chunks, heads, state.data_as<float>(), state.data_as<float>(), nullptr, states.data_as<bf16_t>(),
                 vnew.data_as<bf16_t>(), 0, per_segment, 0};
  Tensor inits;
  if (segments > 1) {
    // Maps of all segments in parallel, then fold them for each segment's initial state.
    const std::pair<Tensor, Tensor> maps = segment_maps<D>(ws, chunks, heads, segments, per_segment);
    profile.mark("maps");
    inits = Tensor::empty({segments + 1, heads, D, D}, DType::f32, Device::cuda);
    copy_into(inits.view().select(0, 0), state);
    const TensorView s_ext = maps.first;
    fold_maps(maps.second, &s_ext, inits, segments - 1);
    profile.mark("fold");
    args.state_in = inits.data_as<float>();
    args.segment_stride = int64_t(heads) * D * D;
    args.state_out = inits.data_as<float>();  // each segment's final state; the last one is the answer
  }
  run_state<D>(args, false, segments);
  profile.mark("states");
  if (segments > 1) copy_into(state, inits.view().select(0, segments - 1));  // final state of the last segment
  const size_t smem = OutputSmem<D>::total;
  HYDRA_CUDA_CHECK(cudaFuncSetAttribute(gdn_output_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  gdn_output_kernel<D><<<dim3(chunks, heads), 128, smem, current_stream()>>>(
      seq_of(q), seq_of(k), t_len, heads, states.data_as<bf16_t>(), vnew.data_as<bf16_t>(), ws.gamma.data_as<float>(),
      scale, out.data_as<bf16_t>(), out.stride(0), out.stride(1));
  HYDRA_CUDA_LAUNCH_CHECK();
  profile.mark("outputs");
}

template <int D>
void segment_map(const TensorView& m, const TensorView& s_ext, const TensorView& k, const TensorView& v,
                 const TensorView& g, const TensorView& beta) {
  const int t_len = static_cast<int>(k.size(0)), heads = static_cast<int>(k.size(1));
  const int chunks = (t_len + kC - 1) / kC;
  Workspace ws = prepare<D>(k, v, g, beta);
  const int segments = split_segments(chunks), per_segment = (chunks + segments - 1) / segments;
  const std::pair<Tensor, Tensor> parts = segment_maps<D>(ws, chunks, heads, segments, per_segment);
  const Tensor& parts_ext = parts.first;
  const Tensor& parts_m = parts.second;
  // Compose: S_ext = the parts' S_ext folded from 0; M = M_{S−1} ⋯ M_0.
  Tensor acc = Tensor::empty({segments + 1, heads, D, D}, DType::f32, Device::cuda);
  fill(acc.view().select(0, 0), 0.0f);
  const TensorView ext = parts_ext;
  fold_maps(parts_m, &ext, acc, segments);
  copy_into(s_ext, acc.view().select(0, segments));
  copy_into(acc.view().select(0, 0), parts_m.view().select(0, 0));
  fold_maps(parts_m.view().narrow(0, 1, segments - 1), nullptr, acc, segments - 1);
  copy_into(m, acc.view().select(0, segments - 1));
}

}  // namespace

// Called by delta_rule_forward.cu after its argument checks.
void delta_rule_chunked_v1(const TensorView& out, const TensorView& state, const TensorView& q, const TensorView& k,
                           const TensorView& v, const TensorView& g, const TensorView& beta, float scale) {
  const int64_t d = k.size(2);
  if (d == 128) {
    chunked<128>(out, state, q, k, v, g, beta, scale);
  } else {
    chunked<64>(out, state, q, k, v, g, beta, scale);
  }
}

void delta_rule_segment_map_v1(const TensorView& m, const TensorView& s_ext, const TensorView& k, const TensorView& v,
                               const TensorView& g, const TensorView& beta) {
  if (k.size(2) == 128) {
    segment_map<128>(m, s_ext, k, v, g, beta);
  } else {
    segment_map<64>(m, s_ext, k, v, g, beta);
  }
}

}  // namespace hydra::ops::cuda_impl
