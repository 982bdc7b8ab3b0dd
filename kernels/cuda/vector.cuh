// Vectorised element access for the bandwidth-bound kernels: N consecutive bf16 or fp32 values as
// fp32, in one access of 2N bytes (bf16, N = 1, 2, 4, 8) or in float4 accesses (fp32, N = 4, 8),
// and the same on FloatRows (backward.cuh), whose element type is chosen at run time. The one home
// of bf16 words packed from and unpacked to fp32 (unpack_bf16, pack_bf16_word); mma.cuh's pack_bf16
// is the MMA fragments' pair form. The caller
// guarantees the alignment (backward.cuh's row_starts_aligned on the host side); a misaligned vector access
// faults. Included only by .cu files.
//
// Why: one warp-wide 16-byte access moves 512 bytes; the same loop with 2-byte scalar loads moves
// 64 and leaves the memory system waiting on latency (the conv backward was latency-bound so).
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/backward.cuh"

namespace hydra::cuda {

// The raw word of N consecutive bf16 values (N = 1, 2, 4, 8): a kernel that issues the loads of
// several rows before using any keeps the words (half the registers of their fp32 values) and
// unpacks each when it is needed.
template <int N>
using Bf16Word = std::conditional_t<
    N == 1, unsigned short, std::conditional_t<N == 2, uint32_t, std::conditional_t<N == 4, uint2, uint4>>>;

template <int N>
__device__ __forceinline__ Bf16Word<N> load_bf16_word(const bf16_t* p) {
  static_assert(N == 1 || N == 2 || N == 4 || N == 8, "1, 2, 4 or 8 bf16 values per access");
  return *reinterpret_cast<const Bf16Word<N>*>(p);
}

// load_bf16_word<8> for a stream read once beside data worth keeping in L2 (the decode attention's
// cache under the decode weight prefetch): an L2 evict-first cache policy (createpolicy, sm_80+) and
// no L1 allocation. The policy is a pure value (the compiler may hoist it); the load is volatile,
// so it stays in program order with the other volatile asm (griddepcontrol.wait above all, which
// plain loads follow through its memory clobber).
__device__ __forceinline__ Bf16Word<8> load_bf16_word_evict_first(const bf16_t* p) {
  uint64_t policy;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  uint4 w;
  asm volatile("ld.global.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;\n"
               : "=r"(w.x), "=r"(w.y), "=r"(w.z), "=r"(w.w)
               : "l"(p), "l"(policy));
  return w;
}

template <int N>
__device__ __forceinline__ void unpack_bf16(const Bf16Word<N>& word, float (&v)[N]) {
  if constexpr (N == 1) {
    v[0] = __bfloat162float(__ushort_as_bfloat16(word));
  } else {
    const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&word);
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      v[2 * i] = __low2float(pairs[i]);
      v[2 * i + 1] = __high2float(pairs[i]);
    }
  }
}

template <int N>
__device__ __forceinline__ void load_bf16(const bf16_t* p, float (&v)[N]) {
  unpack_bf16<N>(load_bf16_word<N>(p), v);
}

// N fp32 values rounded to nearest bf16, as one word (the inverse of unpack_bf16).
template <int N>
__device__ __forceinline__ Bf16Word<N> pack_bf16_word(const float (&v)[N]) {
  static_assert(N == 1 || N == 2 || N == 4 || N == 8, "1, 2, 4 or 8 bf16 values per access");
  if constexpr (N == 1) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(v[0]));
  } else {
    Bf16Word<N> word;
    __nv_bfloat162* pairs = reinterpret_cast<__nv_bfloat162*>(&word);
#pragma unroll
    for (int i = 0; i < N / 2; ++i) pairs[i] = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
    return word;
  }
}

template <int N>
__device__ __forceinline__ void store_bf16(bf16_t* p, const float (&v)[N]) {
  *reinterpret_cast<Bf16Word<N>*>(p) = pack_bf16_word<N>(v);
}

template <int N>
__device__ __forceinline__ void load_f32(const float* p, float (&v)[N]) {
  static_assert(N % 4 == 0, "fp32 vectors are float4 accesses");
#pragma unroll
  for (int i = 0; i < N / 4; ++i) {
    const float4 f = reinterpret_cast<const float4*>(p)[i];
    v[4 * i] = f.x;
    v[4 * i + 1] = f.y;
    v[4 * i + 2] = f.z;
    v[4 * i + 3] = f.w;
  }
}

template <int N>
__device__ __forceinline__ void store_f32(float* p, const float (&v)[N]) {
  static_assert(N % 4 == 0, "fp32 vectors are float4 accesses");
#pragma unroll
  for (int i = 0; i < N / 4; ++i)
    reinterpret_cast<float4*>(p)[i] = make_float4(v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]);
}

// N (4 or 8) values of FloatRows r at element offset `at`; the type test is uniform across a warp.
template <int N>
__device__ __forceinline__ void load_vec(const FloatRows& r, int64_t at, float (&v)[N]) {
  if (r.bf16) {
    load_bf16<N>(static_cast<const bf16_t*>(r.data) + at, v);
  } else {
    load_f32<N>(static_cast<const float*>(r.data) + at, v);
  }
}

template <int N>
__device__ __forceinline__ void store_vec(const FloatRows& r, int64_t at, const float (&v)[N]) {
  if (r.bf16) {
    store_bf16<N>(static_cast<bf16_t*>(r.data) + at, v);
  } else {
    store_f32<N>(static_cast<float*>(r.data) + at, v);
  }
}

}  // namespace hydra::cuda
