// The previous decode attention kernels (DecodeAttentionKernel::burst), kept only so `hydra bench --op
// decode --decode-attention burst,pipelined` can time them beside their replacement
// (attention_decode.cu) in one GPU job. Remove this file, the enum value and the bench option once
// the GPU has confirmed the pipelined kernels.
//
// attention_decode_burst_kernel: one CTA of 4 warps per (row, KV head, chunk of ≥ 256 keys). Each
// lane issues the loads of U = 4 rounds (its K and V words, 128 bytes) and then waits for all of
// them before the next four: a CTA has 32 keys (d = 128) in flight per dependent round trip, eight
// round trips per 256-key chunk. Chunking: about four CTAs per SM at the longest row.
// attention_merge_burst_kernel: one CTA of 8 warps per (row, head) walks every part (the lse twice,
// then four parts in flight per warp): hundreds of parts are a chain of dependent loads.
#include <algorithm>

#include "kernels/attention/attention_decode_split.cuh"

namespace hydra::ops::cuda_impl::decode {
namespace {

constexpr int kRounds = 4;  // U: rounds of loads in flight per lane

template <int D, int G>
__global__ void __launch_bounds__(32 * kWarps) attention_decode_burst_kernel(const __grid_constant__ DecodeArgs a) {
  cuda::wait_for_previous_grid();  // launched through cuda::launch (PDL in a decode step)
  cuda::allow_next_grid();
  constexpr int L = D / 8;            // lanes per key
  constexpr int KPW = 32 / L;         // keys per warp access
  constexpr int KEYS_PER_ROUND = KPW * kWarps;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int sub = lane % L, group = lane / L;  // element block of a key, key within the warp access
  const int64_t b = blockIdx.y / a.hk, kvh = blockIdx.y % a.hk, split = blockIdx.x;
  const int h0 = a.group_begin[kvh], nh = a.group_begin[kvh + 1] - h0;
  const int64_t slot = a.slots != nullptr ? a.slots[b] : b;
  const int64_t len = a.lengths[b];
  const int64_t key_begin = split * a.chunk, key_end = min(len, key_begin + a.chunk);
  float q[G][8];
  load_scaled_queries<G>(a, b, h0, nh, sub, q);
  float m[G], l[G], acc[G][8];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[g][e] = 0.0f;
  }
  const bf16_t* kbase = a.k + slot * a.cache_stride_slot + kvh * D + sub * 8;
  const bf16_t* vbase = a.v + slot * a.cache_stride_slot + kvh * D + sub * 8;
  for (int64_t t0 = key_begin; t0 < key_end; t0 += int64_t{KEYS_PER_ROUND} * kRounds) {
    cuda::Bf16Word<8> kw[kRounds], vw[kRounds];
    bool valid[kRounds];
#pragma unroll
    for (int u = 0; u < kRounds; ++u) {  // all loads first
      const int64_t key = t0 + int64_t(u) * KEYS_PER_ROUND + warp * KPW + group;
      valid[u] = key < key_end;
      if (valid[u]) {
        kw[u] = cuda::load_bf16_word<8>(kbase + key * a.cache_stride_row);
        vw[u] = cuda::load_bf16_word<8>(vbase + key * a.cache_stride_row);
      } else {
        kw[u] = vw[u] = cuda::Bf16Word<8>{};
      }
    }
    float s[kRounds][G];
#pragma unroll
    for (int u = 0; u < kRounds; ++u) {
      float kf[8];
      cuda::unpack_bf16<8>(kw[u], kf);
#pragma unroll
      for (int g = 0; g < G; ++g) {
        float dot = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; ++e) dot += q[g][e] * kf[e];
#pragma unroll
        for (int o = L / 2; o > 0; o /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, o);
        s[u][g] = valid[u] ? dot : -INFINITY;
      }
    }
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float m_new = m[g];
#pragma unroll
      for (int u = 0; u < kRounds; ++u) m_new = fmaxf(m_new, s[u][g]);
      if (m_new == -INFINITY) continue;  // no key of this lane group yet
      const float corr = cuda::fast_exp2(m[g] - m_new);
      l[g] *= corr;
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[g][e] *= corr;
      m[g] = m_new;
#pragma unroll
      for (int u = 0; u < kRounds; ++u) {
        const float p = cuda::fast_exp2(s[u][g] - m_new);
        float vf[8];
        cuda::unpack_bf16<8>(vw[u], vf);
        l[g] += p;
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[g][e] += p * vf[e];
      }
    }
  }
  write_chunk_result<D, G>(a, split, b, h0, nh, m, l, acc);
}

constexpr int kMergeWarps = 8;
constexpr int kMergeMaxDv = 128;

// out [B, Hq, dv] ← merge of the contiguous parts [n, B, Hq, dv] / [n, Hq, B] (out contiguous).
__global__ void __launch_bounds__(32 * kMergeWarps) attention_merge_burst_kernel(float* out_all, float* lse_all,
                                                                                 const float* part_out,
                                                                                 const float* part_lse, int64_t n,
                                                                                 int64_t rows, int64_t hq, int64_t dv) {
  cuda::wait_for_previous_grid();  // launched through cuda::launch (PDL in a decode step)
  cuda::allow_next_grid();
  const int64_t b = blockIdx.x / hq, h = blockIdx.x % hq;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t lse_stride_n = hq * rows, part_stride_n = rows * hq * dv;
  const float* lse_of = part_lse + h * rows + b;  // part i at [i · lse_stride_n]
  __shared__ float red[kMergeWarps];
  __shared__ float acc_sm[kMergeWarps][kMergeMaxDv];
  float m = -INFINITY;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) m = fmaxf(m, lse_of[i * lse_stride_n]);
  for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (lane == 0) red[warp] = m;
  __syncthreads();
  m = red[0];
  for (int w = 1; w < kMergeWarps; ++w) m = fmaxf(m, red[w]);
  __syncthreads();
  float sum = 0.0f;
  if (m != -INFINITY) {
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const float x = lse_of[i * lse_stride_n];
      sum += x == -INFINITY ? 0.0f : expf(x - m);
    }
  }
  for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (lane == 0) red[warp] = sum;
  __syncthreads();
  sum = 0.0f;
  for (int w = 0; w < kMergeWarps; ++w) sum += red[w];
  const float total = m == -INFINITY ? -INFINITY : m + logf(sum);
  float acc[kMergeMaxDv / 32] = {};
  if (total != -INFINITY) {
    const float* part = part_out + (b * hq + h) * dv;
#pragma unroll 4
    for (int64_t i = warp; i < n; i += kMergeWarps) {
      const float x = lse_of[i * lse_stride_n];
      const float wgt = x == -INFINITY ? 0.0f : expf(x - total);
#pragma unroll
      for (int j = 0; j < kMergeMaxDv / 32; ++j) {
        const int64_t c = lane + 32 * j;
        if (c < dv) acc[j] += wgt * part[i * part_stride_n + c];
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kMergeMaxDv / 32; ++j) acc_sm[warp][lane + 32 * j] = acc[j];
  __syncthreads();
  for (int64_t c = threadIdx.x; c < dv; c += blockDim.x) {
    float o = 0.0f;
    for (int w = 0; w < kMergeWarps; ++w) o += acc_sm[w][c];
    out_all[(b * hq + h) * dv + c] = o;
  }
  if (threadIdx.x == 0) lse_all[h * rows + b] = total;
}

template <int D, int G>
void launch_burst(const DecodeArgs& a, int64_t splits) {
  const dim3 grid(static_cast<unsigned>(splits), static_cast<unsigned>(a.rows * a.hk));
  cuda::launch(attention_decode_burst_kernel<D, G>, grid, 32 * kWarps, 0, a);
  HYDRA_CUDA_LAUNCH_CHECK();
}

template <int D>
void launch_burst_d(const DecodeArgs& a, int64_t splits, int group) {
  if (group <= 1) return launch_burst<D, 1>(a, splits);
  if (group <= 2) return launch_burst<D, 2>(a, splits);
  if (group <= 4) return launch_burst<D, 4>(a, splits);
  if (group <= 8) return launch_burst<D, 8>(a, splits);
  launch_burst<D, 16>(a, splits);
}

}  // namespace

void attention_decode_burst(DecodeArgs a, int group, int64_t max_length, const TensorView& out, const TensorView& lse) {
  const int64_t rows = a.rows, hq = a.hq, hk = a.hk, d = out.size(2);
  const int64_t longest = std::max<int64_t>(max_length, 1);
  const int64_t round = (32 / (d / 8)) * kWarps * kRounds;  // keys per CTA iteration
  const int64_t pairs = rows * hk, target = 4 * static_cast<int64_t>(cuda::sm_count());
  const int64_t per_pair = std::max<int64_t>(1, target / pairs);
  int64_t chunk = std::max<int64_t>(256, (longest + per_pair - 1) / per_pair);
  chunk = (chunk + round - 1) / round * round;
  const int64_t splits = std::max<int64_t>(1, (longest + chunk - 1) / chunk);
  a.chunk = chunk;
  Tensor part_out, part_lse;
  if (splits == 1) {
    a.out = static_cast<float*>(out.data());
    a.lse = static_cast<float*>(lse.data());
  } else {
    part_out = Tensor::empty({splits, rows, hq, d}, DType::f32, Device::cuda);
    part_lse = Tensor::empty({splits, hq, rows}, DType::f32, Device::cuda);
    a.out = static_cast<float*>(part_out.data());
    a.lse = static_cast<float*>(part_lse.data());
  }
  if (d == 64) {
    launch_burst_d<64>(a, splits, group);
  } else {
    launch_burst_d<128>(a, splits, group);
  }
  if (splits == 1) return;
  cuda::launch(attention_merge_burst_kernel, static_cast<unsigned>(rows * hq), 32 * kMergeWarps, 0,
               static_cast<float*>(out.data()), static_cast<float*>(lse.data()),
               static_cast<const float*>(part_out.data()), static_cast<const float*>(part_lse.data()), splits, rows, hq, d);
  HYDRA_CUDA_LAUNCH_CHECK();
}

}  // namespace hydra::ops::cuda_impl::decode
