// Stage 1 of the GPU gated delta rule (delta_rule_cuda.cuh): per (chunk, head), the cumulative
// decay γ, the gate-free triangular inverse T and, with queries, the intra-chunk attention P.
//
// CTA = 4 warps, one (chunk, head). Tensor cores (mma.sync m16n8k16, bf16 in, fp32 out) for
// K Kᵀ and Q Kᵀ (warp w: rows 16w..16w+15). The inverse T₀ = (I + L₀)⁻¹ of the unit lower
// triangular 64×64 matrix (L₀_ij = β_i k_i·k_j, j < i) is built from blocks:
//   16×16 diagonal blocks: forward substitution, one column per lane, fp32 (warp w: block w);
//   16 → 32: X₁₀ = −X₁₁ (L₁₀ X₀₀) and X₃₂ = −X₃₃ (L₃₂ X₂₂) (warps 0, 1);
//   32 → 64: X[32:, :32] = −X[32:, 32:] (L[32:, :32] X[:32, :32]) (warp w: one 16×16 output block);
// the block products on tensor cores with operands split into bf16 high and low parts
// (a·b ≈ a_hi b_hi + a_hi b_lo + a_lo b_hi, ~16 significant bits) so T₀ keeps near-fp32 accuracy.
// Then T_ij = T₀_ij e^{γ_i−γ_j}: the decay enters only as factors ≤ 1. With γ the CTA also writes
// the state pass's per-row factors (β, β e^γ, e^{γ_C−γ}, e^γ).
// For the backward (PrepareFor::backward) the same CTA also writes K̃ = e^{γ_C−γ} K and
// Q̂ = scale·e^γ Q (from the rows already in shared memory) and W = T (β e^γ K) (a tensor-core
// product with the bf16 T just formed), so the backward has no inverse of its own.
// The kernel is the sequence of its stages (prepare_load, prepare_gamma, prepare_products,
// prepare_backward_rows, invert_diagonal_block, merge_16_to_32, merge_32_to_64, prepare_store_t,
// prepare_w), one __forceinline__ function each, with the barriers between them in the kernel.
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/delta_rule/delta_rule_cuda.cuh"

namespace hydra::ops::cuda_impl::gdn {
namespace {

constexpr int kC = kChunk, kLd = kC + 4;  // fp32 64×64 matrices with padded rows

template <int D>
struct PrepareSmem {
  static constexpr size_t row_bytes = size_t(kC) * D * 2;                     // K or Q, bf16 swizzled
  static constexpr size_t y_bytes = size_t(kC) * kLd * 4;                      // block-product scratch
  static constexpr size_t q_bytes = row_bytes > y_bytes ? row_bytes : y_bytes;  // Q, later the scratch
  static constexpr size_t total = row_bytes + q_bytes + 2 * y_bytes + 3 * kC * 4;
};

// The high and low bf16 parts of two fp32 values, packed as an mma operand register.
struct Split {
  uint32_t hi, lo;
};
__device__ __forceinline__ Split split(float x0, float x1) {
  const __nv_bfloat16 h0 = __float2bfloat16_rn(x0), h1 = __float2bfloat16_rn(x1);
  return {cuda::pack_bf16(__bfloat162float(h0), __bfloat162float(h1)),
          cuda::pack_bf16(x0 - __bfloat162float(h0), x1 - __bfloat162float(h1))};
}

// acc (a 16×16 block as two 16×8 accumulator tiles) += A[16×K] · B[K×16], A and B fp32 row-major
// in shared memory (leading dimension kLd), with the split-bf16 products above. Fragment layouts
// of mma.m16n8k16 (kernels/cuda/mma.cuh), g = lane / 4, c = lane % 4.
template <int K>
__device__ __forceinline__ void block_product(const float* a, const float* b, float (&acc)[2][4], int lane) {
  const int g = lane / 4, c = lane % 4;
#pragma unroll
  for (int k0 = 0; k0 < K; k0 += 16) {
    const Split a0 = split(a[g * kLd + k0 + 2 * c], a[g * kLd + k0 + 2 * c + 1]);
    const Split a1 = split(a[(g + 8) * kLd + k0 + 2 * c], a[(g + 8) * kLd + k0 + 2 * c + 1]);
    const Split a2 = split(a[g * kLd + k0 + 8 + 2 * c], a[g * kLd + k0 + 9 + 2 * c]);
    const Split a3 = split(a[(g + 8) * kLd + k0 + 8 + 2 * c], a[(g + 8) * kLd + k0 + 9 + 2 * c]);
    const uint32_t ahi[4] = {a0.hi, a1.hi, a2.hi, a3.hi}, alo[4] = {a0.lo, a1.lo, a2.lo, a3.lo};
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      const int col = 8 * n + g;
      const Split b0 = split(b[(k0 + 2 * c) * kLd + col], b[(k0 + 2 * c + 1) * kLd + col]);
      const Split b1 = split(b[(k0 + 8 + 2 * c) * kLd + col], b[(k0 + 9 + 2 * c) * kLd + col]);
      cuda::mma_bf16(acc[n], ahi, b0.hi, b1.hi);
      cuda::mma_bf16(acc[n], ahi, b0.lo, b1.lo);
      cuda::mma_bf16(acc[n], alo, b0.hi, b1.hi);
    }
  }
}

// Outputs of the backward's preparation (all null in the forward), [chunks, H, 64, D] bf16.
struct BackwardTiles {
  bf16_t* w;   // T (β e^γ K)
  bf16_t* kt;  // e^{γ_C−γ} K
  bf16_t* qh;  // scale · e^γ Q
};

// dst (16×16 block, leading dimension kLd) = sign · acc.
__device__ __forceinline__ void store_block(float* dst, const float (&acc)[2][4], float sign, int lane) {
  const int g = lane / 4, c = lane % 4;
#pragma unroll
  for (int n = 0; n < 2; ++n) {
    dst[g * kLd + 8 * n + 2 * c] = sign * acc[n][0];
    dst[g * kLd + 8 * n + 2 * c + 1] = sign * acc[n][1];
    dst[(g + 8) * kLd + 8 * n + 2 * c] = sign * acc[n][2];
    dst[(g + 8) * kLd + 8 * n + 2 * c + 1] = sign * acc[n][3];
  }
}

// The shared-memory tiles of one CTA: K and Q rows (bf16, swizzled; Q's buffer is the block-product
// scratch Y once Q Kᵀ is done), L and X = T₀ (fp32, padded rows), and γ, β, the raw gates.
template <int D>
struct PrepareTiles {
  unsigned char *k, *q;
  float *y, *l, *x, *gamma, *beta, *raw;
  __device__ __forceinline__ explicit PrepareTiles(unsigned char* smem) {
    using S = PrepareSmem<D>;
    k = smem;
    q = smem + S::row_bytes;
    y = reinterpret_cast<float*>(q);
    l = reinterpret_cast<float*>(smem + S::row_bytes + S::q_bytes);
    x = l + kC * kLd;
    gamma = x + kC * kLd;
    beta = gamma + kC;
    raw = beta + kC;
  }
};

// This thread's place: its CTA's (chunk, head) and the first [.., D] row of this chunk-head in the
// per-chunk outputs; warp w owns rows m0() = 16w .. of the products.
struct PreparePos {
  int chunk, head, t0, tid, warp, lane, g4, c4, valid;
  int64_t rows0;
  __device__ __forceinline__ PreparePos(int t_len, int heads)
      : chunk(blockIdx.x), head(blockIdx.y), t0(chunk * kC), tid(threadIdx.x), warp(tid / 32), lane(tid % 32), g4(lane / 4),
        c4(lane % 4), valid(min(kC, t_len - t0)), rows0((int64_t(chunk) * heads + head) * kC) {}
  __device__ __forceinline__ int m0() const { return warp * 16; }
};

// Load: K (and Q) rows by cp.async (committed, not waited for), T₀'s buffer zeroed (its upper
// blocks stay zero), the raw gates and β (zeros past the end).
template <int D>
__device__ __forceinline__ void prepare_load(const Rows& q, const Rows& k, const Rows& g, const Rows& beta, bool with_q,
                                             const PrepareTiles<D>& sm, const PreparePos& at) {
  constexpr int kChunks = D / 8;
  const int tid = at.tid;
  for (int i = tid; i < kC * kChunks; i += 128) {
    const int r = i / kChunks, c = i % kChunks;
    const bool ok = r < at.valid;
    const int64_t row = ok ? at.t0 + r : 0;
    const bf16_t* kp = static_cast<const bf16_t*>(k.ptr) + row * k.st + at.head * k.sh + c * 8;
    cuda::cp_async_16(cuda::smem_addr(sm.k) + cuda::swizzled<kChunks>(r, c), kp, ok ? 16 : 0);
    if (with_q) {
      const bf16_t* qp = static_cast<const bf16_t*>(q.ptr) + row * q.st + at.head * q.sh + c * 8;
      cuda::cp_async_16(cuda::smem_addr(sm.q) + cuda::swizzled<kChunks>(r, c), qp, ok ? 16 : 0);
    }
  }
  cuda::cp_async_commit();
  for (int i = tid; i < kC * kLd; i += 128) sm.x[i] = 0.0f;  // upper blocks of T₀ stay zero
  if (tid < kC) {
    const bool ok = tid < at.valid;
    sm.raw[tid] = ok ? static_cast<const float*>(g.ptr)[(at.t0 + tid) * g.st + at.head * g.sh] : 0.0f;
    sm.beta[tid] = ok ? static_cast<const float*>(beta.ptr)[(at.t0 + tid) * beta.st + at.head * beta.sh] : 0.0f;
  }
}

// γ: the inclusive prefix sum of g over the chunk (warp 0, two values per lane).
__device__ __forceinline__ void prepare_gamma(float* gamma, const float* raw, int lane) {
  float a = raw[2 * lane], b = a + raw[2 * lane + 1];
  for (int o = 1; o < 32; o *= 2) {
    const float up = __shfl_up_sync(0xffffffffu, b, o);
    if (lane >= o) {
      a += up;
      b += up;
    }
  }
  gamma[2 * lane] = a;
  gamma[2 * lane + 1] = b;
}

// K Kᵀ and Q Kᵀ, rows m0.. × 64 keys per warp: L = β_i k_i·k_j (j < i) into shared memory and, with
// queries, P = scale · (Q Kᵀ ⊙ e^{γ_i−γ_j}) (j ≤ i) to p_out.
template <int D>
__device__ __forceinline__ void prepare_products(const PrepareTiles<D>& sm, const PreparePos& at, bool with_q, float scale,
                                                 int heads, bf16_t* p_out) {
  constexpr int kChunks = D / 8;
  const int m0 = at.m0(), lane = at.lane;
  float kk_acc[kC / 8][4] = {}, qk_acc[kC / 8][4] = {};
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t ka[4], qa[4];
    cuda::ldmatrix_x4(ka, cuda::smem_addr(sm.k) + cuda::swizzled<kChunks>(m0 + lane % 16, kk * 2 + lane / 16));
    if (with_q) cuda::ldmatrix_x4(qa, cuda::smem_addr(sm.q) + cuda::swizzled<kChunks>(m0 + lane % 16, kk * 2 + lane / 16));
#pragma unroll
    for (int j = 0; j < kC / 8; j += 2) {
      uint32_t b[4];
      const int key = j * 8 + (lane % 8) + (lane / 16) * 8, c = kk * 2 + (lane / 8) % 2;
      cuda::ldmatrix_x4(b, cuda::smem_addr(sm.k) + cuda::swizzled<kChunks>(key, c));
      cuda::mma_bf16(kk_acc[j], ka, b[0], b[1]);
      cuda::mma_bf16(kk_acc[j + 1], ka, b[2], b[3]);
      if (with_q) {
        cuda::mma_bf16(qk_acc[j], qa, b[0], b[1]);
        cuda::mma_bf16(qk_acc[j + 1], qa, b[2], b[3]);
      }
    }
  }
  const int64_t base = (int64_t(at.chunk) * heads + at.head) * kC * kC;
#pragma unroll
  for (int j = 0; j < kC / 8; ++j)
#pragma unroll
    for (int h2 = 0; h2 < 2; ++h2) {
      const int i = m0 + at.g4 + 8 * h2, jj = j * 8 + 2 * at.c4;
      sm.l[i * kLd + jj] = jj < i ? sm.beta[i] * kk_acc[j][2 * h2] : 0.0f;
      sm.l[i * kLd + jj + 1] = jj + 1 < i ? sm.beta[i] * kk_acc[j][2 * h2 + 1] : 0.0f;
      if (with_q) {
        const float p0 = jj <= i ? scale * qk_acc[j][2 * h2] * expf(sm.gamma[i] - sm.gamma[jj]) : 0.0f;
        const float p1 = jj + 1 <= i ? scale * qk_acc[j][2 * h2 + 1] * expf(sm.gamma[i] - sm.gamma[jj + 1]) : 0.0f;
        *reinterpret_cast<uint32_t*>(p_out + base + i * kC + jj) = cuda::pack_bf16(p0, p1);
      }
    }
}

// Backward: K̃ = e^{γ_C−γ} K and Q̂ = scale·e^γ Q from the rows in shared memory.
template <int D>
__device__ __forceinline__ void prepare_backward_rows(const PrepareTiles<D>& sm, const PreparePos& at, float scale,
                                                      const BackwardTiles& bt) {
  constexpr int kChunks = D / 8;
  for (int i = at.tid; i < kC * kChunks; i += 128) {
    const int r = i / kChunks, c = i % kChunks;
    const int64_t o = (at.rows0 + r) * D + c * 8;
    const uint32_t off = cuda::swizzled<kChunks>(r, c);
    *reinterpret_cast<uint4*>(bt.kt + o) =
        scaled8(*reinterpret_cast<const uint4*>(sm.k + off), expf(sm.gamma[kC - 1] - sm.gamma[r]));
    *reinterpret_cast<uint4*>(bt.qh + o) = scaled8(*reinterpret_cast<const uint4*>(sm.q + off), scale * expf(sm.gamma[r]));
  }
}

// Diagonal 16×16 blocks of T₀: warp w, block w, lane c < 16 solves column c:
// X[i][c] = −Σ_{c ≤ j < i} L[i][j] X[j][c] for i > c, X[c][c] = 1, X[i][c] = 0 for i < c.
__device__ __forceinline__ void invert_diagonal_block(const float* l, float* x_out, int m0, int lane) {
  const float* lb = l + m0 * kLd + m0;
  float x[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) x[i] = i == lane ? 1.0f : 0.0f;
#pragma unroll
  for (int i = 1; i < 16; ++i) {
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < i; ++j) acc = fmaf(lb[i * kLd + j], x[j], acc);
    if (i > lane) x[i] = -acc;
  }
#pragma unroll
  for (int i = 0; i < 16; ++i) x_out[(m0 + i) * kLd + m0 + lane] = x[i];
}

// 16 → 32: warp 0 forms X₁₀, warp 1 X₃₂ (scratch: its own 16 rows of y).
__device__ __forceinline__ void merge_16_to_32(const float* l, float* x, float* y_scratch, int warp, int lane) {
  const int r0 = 32 * warp + 16, c0 = 32 * warp;  // block (i, j) = rows r0.., columns c0..
  float acc[2][4] = {};
  block_product<16>(l + r0 * kLd + c0, x + c0 * kLd + c0, acc, lane);  // L_ij X_jj
  float* y = y_scratch + warp * 16 * kLd;
  store_block(y, acc, 1.0f, lane);
  __syncwarp();
  float acc2[2][4] = {};
  block_product<16>(x + r0 * kLd + r0, y, acc2, lane);  // X_ii (L_ij X_jj)
  store_block(x + r0 * kLd + c0, acc2, -1.0f, lane);
}

// 32 → 64: Y = L[32:, :32] X[:32, :32], then X[32:, :32] = −X[32:, 32:] Y; warp w: block (w/2, w%2).
// Every thread of the CTA calls it (a CTA barrier between the two products).
__device__ __forceinline__ void merge_32_to_64(const float* l, float* x, float* y, int warp, int lane) {
  const int bi = warp / 2, bj = warp % 2;
  float acc[2][4] = {};
  block_product<32>(l + (32 + 16 * bi) * kLd, x + 16 * bj, acc, lane);
  store_block(y + 16 * bi * kLd + 16 * bj, acc, 1.0f, lane);
  __syncthreads();
  float acc2[2][4] = {};
  block_product<32>(x + (32 + 16 * bi) * kLd + 32, y + 16 * bj, acc2, lane);
  store_block(x + (32 + 16 * bi) * kLd + 16 * bj, acc2, -1.0f, lane);
}

// Epilogue: T = T₀ ⊙ e^{γ_i−γ_j} (lower triangle, diagonal 1), bf16 row-major, and with `backward`
// a swizzled bf16 copy of T in L's buffer (free now) for W; γ and the state pass's per-row factors
// β, β e^γ, e^{γ_C−γ}, e^γ (β = 0 past the end).
template <int D>
__device__ __forceinline__ void prepare_store_t(const PrepareTiles<D>& sm, const PreparePos& at, int heads, bool backward,
                                                bf16_t* t_out, float* gamma_out, float* factors_out) {
  const int64_t base = (int64_t(at.chunk) * heads + at.head) * kC * kC;
  unsigned char* stb = reinterpret_cast<unsigned char*>(sm.l);
  for (int e = at.tid; e < kC * kC / 2; e += 128) {
    const int i = e / (kC / 2), j = 2 * (e % (kC / 2));
    const float v0 = j <= i ? sm.x[i * kLd + j] * expf(sm.gamma[i] - sm.gamma[j]) : 0.0f;
    const float v1 = j + 1 <= i ? sm.x[i * kLd + j + 1] * expf(sm.gamma[i] - sm.gamma[j + 1]) : 0.0f;
    const uint32_t packed = cuda::pack_bf16(v0, v1);
    *reinterpret_cast<uint32_t*>(t_out + base + i * kC + j) = packed;
    if (backward) *reinterpret_cast<uint32_t*>(stb + cuda::swizzled<8>(i, j / 8) + (j % 8) * 2) = packed;
  }
  const int tid = at.tid;
  if (tid < kC) {
    gamma_out[(int64_t(at.chunk) * heads + at.head) * kC + tid] = sm.gamma[tid];
    float* f = factors_out + (int64_t(at.chunk) * heads + at.head) * 4 * kC + tid;
    const float e = expf(sm.gamma[tid]);
    f[0] = sm.beta[tid];
    f[kC] = sm.beta[tid] * e;
    f[2 * kC] = expf(sm.gamma[kC - 1] - sm.gamma[tid]);
    f[3 * kC] = e;
  }
}

// Backward: W = T (β e^γ K): β e^γ K in place of K, then warp w forms rows 16w.. of the product
// (all D columns; A = the swizzled bf16 T in L's buffer, B = the [C][D] rows through transposing loads).
template <int D>
__device__ __forceinline__ void prepare_w(const PrepareTiles<D>& sm, const PreparePos& at, const BackwardTiles& bt) {
  constexpr int kChunks = D / 8;
  const unsigned char* stb = reinterpret_cast<const unsigned char*>(sm.l);
  for (int i = at.tid; i < kC * kChunks; i += 128) {
    const int r = i / kChunks, c = i % kChunks;
    uint4* p = reinterpret_cast<uint4*>(sm.k + cuda::swizzled<kChunks>(r, c));
    *p = scaled8(*p, sm.beta[r] * expf(sm.gamma[r]));
  }
  __syncthreads();
  const int m0 = at.m0(), lane = at.lane;
  float acc[D / 8][4] = {};
#pragma unroll
  for (int kk = 0; kk < kC / 16; ++kk) {
    uint32_t af[4];
    cuda::ldmatrix_x4(af, cuda::smem_addr(stb) + cuda::swizzled<8>(m0 + lane % 16, kk * 2 + lane / 16));
#pragma unroll
    for (int nt = 0; nt < D / 8; nt += 2) {
      uint32_t b[4];
      const int row = kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8;
      cuda::ldmatrix_x4_trans(b, cuda::smem_addr(sm.k) + cuda::swizzled<kChunks>(row, nt + lane / 16));
      cuda::mma_bf16(acc[nt], af, b[0], b[1]);
      cuda::mma_bf16(acc[nt + 1], af, b[2], b[3]);
    }
  }
#pragma unroll
  for (int nt = 0; nt < D / 8; ++nt)
#pragma unroll
    for (int h2 = 0; h2 < 2; ++h2) {
      const int r = m0 + at.g4 + 8 * h2, c = nt * 8 + 2 * at.c4;
      *reinterpret_cast<uint32_t*>(bt.w + (at.rows0 + r) * D + c) = cuda::pack_bf16(acc[nt][2 * h2], acc[nt][2 * h2 + 1]);
    }
}

// The stages in order (barriers between them in the kernel, one inside merge_32_to_64 and prepare_w).
template <int D>
__global__ void __launch_bounds__(128) gdn_prepare_kernel(Rows q, Rows k, Rows g, Rows beta, int t_len, int heads,
                                                          float scale, bf16_t* t_out, bf16_t* p_out, float* gamma_out,
                                                          float* factors_out,
                                                          BackwardTiles bt) {
  extern __shared__ __align__(128) unsigned char smem[];
  const PrepareTiles<D> sm(smem);
  const PreparePos at(t_len, heads);
  const bool with_q = p_out != nullptr;
  const bool backward = bt.w != nullptr;  // the host guarantees q with it
  prepare_load<D>(q, k, g, beta, with_q, sm, at);
  __syncthreads();
  if (at.warp == 0) prepare_gamma(sm.gamma, sm.raw, at.lane);
  cuda::cp_async_wait<0>();
  __syncthreads();
  prepare_products<D>(sm, at, with_q, scale, heads, p_out);
  __syncthreads();
  if (backward) prepare_backward_rows<D>(sm, at, scale, bt);  // before Q's buffer becomes scratch below
  if (at.lane < 16) invert_diagonal_block(sm.l, sm.x, at.m0(), at.lane);
  __syncthreads();
  if (at.warp < 2) merge_16_to_32(sm.l, sm.x, sm.y, at.warp, at.lane);
  __syncthreads();
  merge_32_to_64(sm.l, sm.x, sm.y, at.warp, at.lane);
  __syncthreads();
  prepare_store_t<D>(sm, at, heads, backward, t_out, gamma_out, factors_out);
  if (backward) prepare_w<D>(sm, at, bt);
}

template <int D>
void launch_prepare(const TensorView& q, const TensorView& k, const TensorView& g, const TensorView& beta, float scale,
                    ChunkPrep& prep) {
  const int t_len = static_cast<int>(k.size(0)), heads = static_cast<int>(k.size(1));
  const size_t smem = PrepareSmem<D>::total;
  HYDRA_CUDA_CHECK(cudaFuncSetAttribute(gdn_prepare_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  gdn_prepare_kernel<D><<<dim3(prep.chunks, heads), 128, smem, current_stream()>>>(
      q.defined() ? rows_of(q) : Rows{}, rows_of(k), rows_of(g), rows_of(beta), t_len, heads, scale,
      prep.t.data_as<bf16_t>(), prep.p.defined() ? prep.p.data_as<bf16_t>() : nullptr, prep.gamma.data_as<float>(),
      prep.factors.data_as<float>(),
      prep.w.defined() ? BackwardTiles{prep.w.data_as<bf16_t>(), prep.kt.data_as<bf16_t>(), prep.qh.data_as<bf16_t>()}
                       : BackwardTiles{nullptr, nullptr, nullptr});
  HYDRA_CUDA_LAUNCH_CHECK();
}

}  // namespace

ChunkPrep prepare(const TensorView& q, const TensorView& k, const TensorView& g, const TensorView& beta, float scale,
                  PrepareFor use) {
  const int64_t t_len = k.size(0), heads = k.size(1);
  ChunkPrep prep;
  prep.chunks = static_cast<int>((t_len + kC - 1) / kC);
  const bool backward = use == PrepareFor::backward;
  HYDRA_ASSERT(!backward || q.defined(), "GDN prepare: the backward's tiles need the queries");
  const DeltaRulePrepareBuffers spec = delta_rule_prepare_buffers(t_len, heads, k.size(2), q.defined(), backward);
  prep.gamma = spec.gamma.empty(Device::cuda);
  prep.factors = spec.factors.empty(Device::cuda);
  prep.t = spec.t.empty(Device::cuda);
  if (spec.p.exists()) prep.p = spec.p.empty(Device::cuda);
  if (spec.tile.exists()) {
    for (Tensor* x : {&prep.w, &prep.kt, &prep.qh}) *x = spec.tile.empty(Device::cuda);
  }
  if (k.size(2) == 128) {
    launch_prepare<128>(q, k, g, beta, scale, prep);
  } else {
    launch_prepare<64>(q, k, g, beta, scale, prep);
  }
  return prep;
}

}  // namespace hydra::ops::cuda_impl::gdn
