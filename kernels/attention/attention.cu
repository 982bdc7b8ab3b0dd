// Flash attention forward (CUDA): causal by global positions, GQA with any head map, τ fused into
// the query scale, fp32 output and log-sum-exp that can be merged in place (ring attention).
//
// Structure (FlashAttention-2 style, tensor cores through mma.sync m16n8k16 bf16 -> fp32):
//   CTA = 4 warps = 64 query rows of one head; each warp owns 16 rows and keeps its Q fragments in
//   registers for the whole key loop. K/V tiles of 64 keys stream through a 2-stage cp.async
//   pipeline in XOR-swizzled shared memory (conflict-free ldmatrix). S = QKᵀ and O += PV run on
//   tensor cores; P never leaves registers. Online softmax in base 2 with fp32 statistics.
//   Query blocks are scheduled longest-first (causal work is triangular).
// Masking: key j (position k_pos0 + j) is visible to query i (q_pos0 + i) iff k ≤ q when causal;
// blocks wholly visible skip the per-element mask; blocks wholly invisible are never loaded.
// merge: the epilogue reads the earlier (out, lse) of each row it owns and writes the fp32 merge,
// so a ring step needs no partial buffers and no extra pass.
//
// This file also chooses the kernel for a call (resolve_flash_kernel): the warp-specialised Hopper
// kernel (attention_hopper.cu) for head dim 128 on sm_90 (views TMA can describe), this mma.sync
// kernel for head dim 64, other GPUs and other views. (An earlier two-warpgroup wgmma kernel without
// warp specialisation was removed: its warpgroups ran in lockstep and the tensor cores idled during
// the softmax, so it reached well under half the Hopper kernel's rate; cluster/results/h200-2026-11-30
// and h200-2026-12-01.)
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "kernels/attention/attention.h"
#include "kernels/attention/attention_tau.h"
#include "kernels/attention/flash_common.cuh"
#include "kernels/attention/flash_softmax.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma.cuh"

namespace hydra::ops::cuda_impl {
namespace {

using cuda::bf16_t;
constexpr int kBlockM = 64, kBlockN = 64, kThreads = 128;

template <int D>
__global__ void __launch_bounds__(kThreads, 2) flash_forward_kernel(const __grid_constant__ FlashParams p) {
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
  extern __shared__ __align__(128) unsigned char smem[];
  unsigned char* sq = smem;
  unsigned char* sk = smem + kBlockM * D * 2;
  unsigned char* sv = sk + 2 * kBlockN * D * 2;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int head = blockIdx.y;
  const int q0 = (gridDim.x - 1 - blockIdx.x) * kBlockM;  // longest-first
  const int kvh = p.kv_of[head];
  const bf16_t* qg = p.q + head * p.q_sh;
  const bf16_t* kg = p.k + kvh * p.k_sh;
  const bf16_t* vg = p.v + kvh * p.v_sh;

  const int k_end = flash_key_end(p, q0, kBlockM);  // keys any row of this block may see
  const int n_blocks = (k_end + kBlockN - 1) / kBlockN;
  // Packed documents: key tiles wholly before the block's first document start are skipped.
  const int kb_begin = min(flash_key_begin(p, q0) / kBlockN, n_blocks);

  auto load_tile = [&](unsigned char* dst, const bf16_t* src, int64_t row_stride, int row0, int rows_valid, int rows) {
    for (int i = tid; i < rows * kChunks; i += kThreads) {
      const int r = i / kChunks, c = i % kChunks;
      const bool ok = row0 + r < rows_valid;
      const bf16_t* g = src + (ok ? (row0 + r) * row_stride : 0) + c * 8;
      cuda::cp_async_16(cuda::smem_addr(dst) + cuda::swizzled<kChunks>(r, c), g, ok ? 16 : 0);
    }
  };

  load_tile(sq, qg, p.q_st, q0, p.tq, kBlockM);
  if (n_blocks > kb_begin) {
    load_tile(sk, kg, p.k_st, kb_begin * kBlockN, p.tk, kBlockN);
    load_tile(sv, vg, p.v_st, kb_begin * kBlockN, p.tk, kBlockN);
  }
  cuda::cp_async_commit();

  // Per-lane rows: r0 = 16·warp + lane/4 and r1 = r0 + 8 (of the block); accumulator layout as in
  // flash_softmax.cuh, 8-column group j at [4j, 4j + 4).
  const int g4 = lane / 4, c4 = lane % 4;
  const int row0 = q0 + warp * 16 + g4, row1 = row0 + 8;
  const float rs[2] = {flash_row_scale(p, row0), flash_row_scale(p, row1)};
  auto group = [](float* a, int j) -> float(&)[4] { return *reinterpret_cast<float(*)[4]>(a + 4 * j); };

  float o[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  uint32_t qf[D / 16][4];

  for (int kb = kb_begin; kb < n_blocks; ++kb) {
    const int it = kb - kb_begin;  // the pipeline stage counts from the first tile loaded
    cuda::cp_async_wait<0>();
    __syncthreads();
    if (it == 0) {
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        const int r = warp * 16 + (lane % 16), c = kk * 2 + lane / 16;
        cuda::ldmatrix_x4(qf[kk], cuda::smem_addr(sq) + cuda::swizzled<kChunks>(r, c));
      }
    }
    if (kb + 1 < n_blocks) {  // prefetch the next K/V tile into the other stage
      const int stage = (it + 1) % 2;
      load_tile(sk + stage * kBlockN * D * 2, kg, p.k_st, (kb + 1) * kBlockN, p.tk, kBlockN);
      load_tile(sv + stage * kBlockN * D * 2, vg, p.v_st, (kb + 1) * kBlockN, p.tk, kBlockN);
    }
    cuda::cp_async_commit();
    const unsigned char* ks = sk + (it % 2) * kBlockN * D * 2;
    const unsigned char* vs = sv + (it % 2) * kBlockN * D * 2;

    // S = Q Kᵀ: 16 rows × 64 keys per warp.
    float s[kBlockN / 2];
#pragma unroll
    for (int i = 0; i < kBlockN / 2; ++i) s[i] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
      for (int j = 0; j < kBlockN / 8; j += 2) {
        uint32_t b[4];
        const int key = j * 8 + (lane % 8) + (lane / 16) * 8, c = kk * 2 + (lane / 8) % 2;
        cuda::ldmatrix_x4(b, cuda::smem_addr(ks) + cuda::swizzled<kChunks>(key, c));
        cuda::mma_bf16(group(s, j), qf[kk], b[0], b[1]);
        cuda::mma_bf16(group(s, j + 1), qf[kk], b[2], b[3]);
      }
    }
    // Mask (diagonal and partial tiles only), online softmax, rescale.
    const int key0 = kb * kBlockN;
    if (flash_tile_needs_doc_mask(p, key0, q0 + kBlockM - 1)) {
      const int first[2] = {flash_first_visible(p, key0, row0), flash_first_visible(p, key0, row1)};
      const int last[2] = {flash_last_visible(p, key0, row0), flash_last_visible(p, key0, row1)};
      flash_apply_mask(s, c4, first, last);
    } else if (flash_tile_needs_mask(p, key0, kBlockN, q0)) {
      const int last[2] = {flash_last_visible(p, key0, row0), flash_last_visible(p, key0, row1)};
      flash_apply_mask(s, c4, last);
    }
    float corr[2];
    flash_softmax_step(s, rs, m, l, corr);
    flash_rescale(o, corr);
    uint32_t pa[kBlockN / 16][4];
    flash_pack_p(s, pa);
    // O += P V: P in registers, V through ldmatrix.trans.
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
#pragma unroll
      for (int j = 0; j < D / 8; j += 2) {
        uint32_t b[4];
        const int key = kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8, c = j + lane / 16;
        cuda::ldmatrix_x4_trans(b, cuda::smem_addr(vs) + cuda::swizzled<kChunks>(key, c));
        cuda::mma_bf16(group(o, j), pa[kk], b[0], b[1]);
        cuda::mma_bf16(group(o, j + 1), pa[kk], b[2], b[3]);
      }
    }
  }

  cuda::cp_async_wait<0>();  // no copy may be in flight when the block exits (n_blocks == 0)

  flash_epilogue<D>(p, head, row0, row1, c4, o, m, l);
}

}  // namespace
}  // namespace hydra::ops::cuda_impl

namespace hydra::ops::cuda_impl {
namespace {

bool is_hopper() {
  int device = 0, major = 0, minor = 0;
  HYDRA_CUDA_CHECK(cudaGetDevice(&device));
  HYDRA_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  HYDRA_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return major == 9 && minor == 0;  // the sm_90a kernels run on compute capability 9.0 only
}

}  // namespace

AttentionKernel resolve_flash_kernel(AttentionKernel kernel, int64_t head_dim) {
  if (kernel == AttentionKernel::automatic) kernel = head_dim == 128 && is_hopper() ? AttentionKernel::hopper : AttentionKernel::mma;
  // A choice made for every call (a kernel option); shapes only the mma.sync kernel handles use it.
  if (kernel != AttentionKernel::mma && head_dim != 128) kernel = AttentionKernel::mma;
  return kernel;
}

bool flash_kernel_supported(AttentionKernel kernel, int64_t head_dim) {
  if (kernel == AttentionKernel::mma) return head_dim == 64 || head_dim == 128;
  return kernel != AttentionKernel::automatic && head_dim == 128 && is_hopper();
}

void attention_forward(const TensorView& out, const TensorView& lse, const TensorView& q, const TensorView& k,
                       const TensorView& v, const AttentionParams& params) {
  cuda::expect_cuda(q, "attention q", DType::bf16);
  cuda::expect_cuda(k, "attention k", DType::bf16);
  cuda::expect_cuda(v, "attention v", DType::bf16);
  cuda::expect_cuda(out, "attention out", DType::f32);
  cuda::expect_cuda(lse, "attention lse", DType::f32);
  const int64_t d = q.size(2), hq = q.size(1), hk = k.size(1);
  HYDRA_ASSERT((d == 64 || d == 128) && v.size(2) == d, "CUDA attention supports head dim 64 and 128 (d = dv), got {}/{}",
               d, v.size(2));
  HYDRA_ASSERT(hq <= kMaxHeads, "CUDA attention: {} query heads > {}", hq, kMaxHeads);
  for (const TensorView* t : {&q, &k, &v}) {
    HYDRA_ASSERT(t->stride(2) == 1 && t->stride(0) % 8 == 0 && t->stride(1) % 8 == 0 &&
                     reinterpret_cast<uintptr_t>(t->data()) % 16 == 0,
                 "CUDA attention needs 16-byte aligned rows (strides multiples of 8 elements)");
  }
  HYDRA_ASSERT(out.stride(2) == 1 && out.stride(0) % 2 == 0 && out.stride(1) % 2 == 0, "attention out layout");
  HYDRA_ASSERT(q.size(0) <= INT32_MAX && k.size(0) <= INT32_MAX, "CUDA attention: more than 2^31 rows");
  if (q.size(0) == 0) return;
  FlashParams p{};
  p.q = q.data_as<const cuda::bf16_t>();
  p.k = k.data_as<const cuda::bf16_t>();
  p.v = v.data_as<const cuda::bf16_t>();
  p.out = out.data_as<float>();
  p.lse = lse.data_as<float>();
  p.q_st = q.stride(0);
  p.q_sh = q.stride(1);
  p.k_st = k.stride(0);
  p.k_sh = k.stride(1);
  p.v_st = v.stride(0);
  p.v_sh = v.stride(1);
  p.o_st = out.stride(0);
  p.o_sh = out.stride(1);
  p.lse_sh = lse.stride(0);
  p.lse_st = lse.stride(1);
  p.tq = static_cast<int>(q.size(0));
  p.tk = static_cast<int>(k.size(0));
  p.q_pos0 = params.q_position0;
  p.k_pos0 = params.k_position0;
  const float scale = params.scale > 0 ? params.scale : 1.0f / std::sqrt(static_cast<float>(d));
  p.scale_log2 = scale * 1.4426950408889634f;
  p.tau_base = static_cast<float>(params.tau_log_base);
  p.inv_log_tau_base = inverse_log_tau_base(params.tau_log_base);
  p.causal = params.causality == Causality::causal;
  p.merge = params.output == AttentionOutput::merge;
  p.q_doc_start = nullptr;
  if (params.q_document_start.defined()) {
    cuda::expect_cuda(params.q_document_start, "attention q_document_start", DType::i64);
    HYDRA_ASSERT(params.q_document_start.stride(0) == 1, "attention: q_document_start must be contiguous");
    p.q_doc_start = params.q_document_start.data_as<const int64_t>();
  }
  for (int64_t h = 0; h < hq; ++h) {
    p.kv_of[h] = params.kv_head_of_query.empty() ? static_cast<int>(h / (hq / hk)) : params.kv_head_of_query[h];
    HYDRA_ASSERT(p.kv_of[h] >= 0 && p.kv_of[h] < hk, "query head {} maps to KV head {} of {}", h, p.kv_of[h], hk);
  }

  // Packed documents run on the mma.sync kernel (the only one that takes them).
  const AttentionKernel chosen =
      p.q_doc_start ? AttentionKernel::mma : resolve_flash_kernel(params.forward_kernel, d);
  HYDRA_ASSERT(chosen == AttentionKernel::mma || is_hopper(), "the {} attention kernel needs an sm_90 GPU",
               attention_kernel_name(chosen));
  if (chosen == AttentionKernel::hopper && flash_forward_hopper_supports(q, k, v)) {
    flash_forward_hopper(p, q, k, v);
  } else {  // mma.sync (head dim 64, other GPUs, and views TMA cannot describe)
    const dim3 grid(static_cast<unsigned>((q.size(0) + kBlockM - 1) / kBlockM), static_cast<unsigned>(hq));
    const size_t smem = static_cast<size_t>((kBlockM + 4 * kBlockN) * d * 2);
    auto kernel_fn = d == 128 ? flash_forward_kernel<128> : flash_forward_kernel<64>;
    HYDRA_CUDA_CHECK(cudaFuncSetAttribute(kernel_fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    kernel_fn<<<grid, kThreads, smem, current_stream()>>>(p);
  }
  HYDRA_CUDA_LAUNCH_CHECK();
}

}  // namespace hydra::ops::cuda_impl
