// Stage 2 of the GPU gated delta rule (delta_rule_cuda.cuh): the sequential pass over the chunks
// of a segment, with the outputs fused in (no chunk state or V' ever goes to memory).
//
// CTA = 4 warps = one (column tile of BV columns, head, segment). The state tile S[:, cols]
// (D × BV, fp32) lives in registers, warp w holding rows [w·D/4, (w+1)·D/4). Per chunk (mma.sync
// m16n8k16, bf16 operands, fp32 accumulation; warp w computes rows 16w.. of chunk-row products):
//   [A] K S (bf16 copy of S in shared memory)  ->  R = β ⊙ (V − e^γ ⊙ K S)  (bf16, shared)
//   [B] V' = T R                                ->  V'' = e^{γ_C−γ} ⊙ V', V' (bf16, shared)
//   [C] S ← e^{γ_C} S + Kᵀ V''  and  O = scale · e^γ ⊙ (Q S_old) + P V'   (independent: interleaved)
//   [D] S (bf16) back to shared memory for the next chunk
// with a CTA barrier between the phases. With outputs, loads run one chunk ahead through cp.async
// in two groups per chunk: K, T, V, γ, β into a 2-stage ring (needed first), Q and P into one
// buffer (needed after phase B; issued once the previous chunk's output is done). Without outputs
// (segment maps, the backward's chunk states) a chunk step is short next to a memory round trip,
// so K, T, V, γ, β run two chunks ahead in a 3-stage ring (the Q/P and V' buffers are left off,
// which keeps two CTAs per SM).
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/delta_rule/delta_rule_cuda.cuh"

namespace hydra::ops::cuda_impl::gdn {
namespace {

constexpr int kC = kChunk, kBV = kTileColumns, kThreads = 128;
constexpr int kPad = kBV + 8;  // padded rows of BV-wide bf16 tiles (conflict-free ldmatrix.trans)

template <int D, bool Out>
struct StateSmem {
  static constexpr size_t k_bytes = size_t(kC) * D * 2;  // K (swizzled)
  static constexpr size_t t_bytes = size_t(kC) * kC * 2;  // T (swizzled)
  static constexpr size_t v_bytes = size_t(kC) * kPad * 2;
  static constexpr size_t stage = k_bytes + t_bytes + v_bytes + 2 * kC * 4;  // + γ, β
  static constexpr int ring = Out ? 2 : 3;                                    // stages of the ring
  static constexpr size_t q_bytes = size_t(kC) * D * 2, p_bytes = t_bytes;
  static constexpr size_t s_bytes = size_t(D) * kPad * 2;
  static constexpr size_t tile_bytes = size_t(kC) * kPad * 2;  // R, V'' (and V' with outputs)
  static constexpr size_t no_q = ring * stage + s_bytes + (Out ? 3 : 2) * tile_bytes;
  static constexpr size_t total = no_q + (Out ? q_bytes + p_bytes : 0);  // Q and P last
};

__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src, bool ok) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(ok ? 4 : 0));
}

// acc (16 chunk rows × kBV columns) += A[m0 .. m0+15][0 .. K) · B[0 .. K)[0 .. kBV): A a swizzled
// bf16 tile of K columns (K, Q, T or P), B a padded bf16 tile of kBV columns (S, R or V').
template <int K>
__device__ __forceinline__ void rows_times_tile(float (&acc)[kBV / 8][4], uint32_t a_tile, int m0, uint32_t b_tile,
                                                int lane) {
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
    uint32_t af[4];
    cuda::ldmatrix_x4(af, a_tile + cuda::swizzled<K / 8>(m0 + lane % 16, kk * 2 + lane / 16));
#pragma unroll
    for (int nt = 0; nt < kBV / 8; nt += 2) {
      uint32_t b[4];
      const int row = kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8, c = nt * 8 + (lane / 16) * 8;
      cuda::ldmatrix_x4_trans(b, b_tile + (row * kPad + c) * 2);
      cuda::mma_bf16(acc[nt], af, b[0], b[1]);
      cuda::mma_bf16(acc[nt + 1], af, b[2], b[3]);
    }
  }
}

template <int D, bool Out>
__global__ void __launch_bounds__(kThreads, 2) gdn_state_kernel(const StatePassArgs a) {
  using S = StateSmem<D, Out>;
  constexpr int kChunks = D / 8, kRows = D / 4, kMt = kRows / 16, kNt = kBV / 8;
  constexpr int kValueTiles = D / kBV;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16_t* ss = reinterpret_cast<bf16_t*>(smem + S::ring * S::stage);
  bf16_t* sr = reinterpret_cast<bf16_t*>(smem + S::ring * S::stage + S::s_bytes);
  bf16_t* svs = sr + kC * kPad;  // V'' = e^{γ_C−γ} V' for the state update
  bf16_t* svo = svs + kC * kPad;  // V' for the output (Out only, as Q and P)
  unsigned char* sq = smem + S::no_q;
  unsigned char* sp = sq + S::q_bytes;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g4 = lane / 4, c4 = lane % 4;
  const int head = blockIdx.y, segment = blockIdx.z;
  // Tiles [0, kValueTiles): columns of S (if value_tiles); then columns of M (if map_tiles).
  const int tile = a.value_tiles ? static_cast<int>(blockIdx.x) : static_cast<int>(blockIdx.x) + kValueTiles;
  const bool is_map = tile >= kValueTiles;
  const int col0 = (is_map ? tile - kValueTiles : tile) * kBV;
  const bool with_out = Out && !is_map;
  const int chunk_begin = segment * a.chunks_per_segment;
  const int chunk_end = min(a.chunks, chunk_begin + a.chunks_per_segment);
  const int64_t seg = segment * a.segment_stride;
  const int64_t hblock = int64_t(head) * D * D;

  // State tile in registers: warp w rows [w·kRows, +kRows) × kBV columns (accumulator layout).
  float s[kMt][kNt][4];
#pragma unroll
  for (int mt = 0; mt < kMt; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNt; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = warp * kRows + mt * 16 + g4 + (e / 2) * 8, c = col0 + nt * 8 + c4 * 2 + (e % 2);
        s[mt][nt][e] = is_map ? (r == c ? 1.0f : 0.0f) : (a.state_in ? a.state_in[seg + hblock + int64_t(r) * D + c] : 0.0f);
      }

  auto stage_ptr = [&](int chunk) { return smem + ((chunk - chunk_begin) % S::ring) * S::stage; };
  // A chunk's rows of a [T, H, D] sequence (zeros past the end) and its [64][64] prepare tile
  // (T or P), into swizzled shared memory.
  auto load_rows = [&](uint32_t dst, const Rows& x, int t0, int valid) {
    for (int i = tid; i < kC * kChunks; i += kThreads) {
      const int r = i / kChunks, c = i % kChunks;
      const bool ok = r < valid;
      const bf16_t* src = static_cast<const bf16_t*>(x.ptr) + (ok ? int64_t(t0 + r) * x.st : 0) + head * x.sh + c * 8;
      cuda::cp_async_16(dst + cuda::swizzled<kChunks>(r, c), src, ok ? 16 : 0);
    }
  };
  auto load_square = [&](uint32_t dst, const bf16_t* tiles, int chunk) {
    const bf16_t* src = tiles + (int64_t(chunk) * a.heads + head) * kC * kC;
    for (int i = tid; i < kC * 8; i += kThreads)
      cuda::cp_async_16(dst + cuda::swizzled<8>(i / 8, i % 8), src + (i / 8) * kC + (i % 8) * 8, 16);
  };
  // Group 1 of a chunk: K, T, V tile, γ, β.
  auto load_main = [&](int chunk) {
    unsigned char* st = stage_ptr(chunk);
    const int t0 = chunk * kC, valid = min(kC, a.t_len - t0);
    load_rows(cuda::smem_addr(st), a.k, t0, valid);
    load_square(cuda::smem_addr(st + S::k_bytes), a.t, chunk);
    if (!is_map) {
      for (int i = tid; i < kC * (kBV / 8); i += kThreads) {
        const int r = i / (kBV / 8), c = i % (kBV / 8);
        const bool ok = r < valid;
        const bf16_t* vp = static_cast<const bf16_t*>(a.v.ptr) + (ok ? int64_t(t0 + r) * a.v.st : 0) + head * a.v.sh +
                           col0 + c * 8;
        cuda::cp_async_16(cuda::smem_addr(st + S::k_bytes + S::t_bytes) + (r * kPad + c * 8) * 2, vp, ok ? 16 : 0);
      }
    }
    const uint32_t sg = cuda::smem_addr(st + S::k_bytes + S::t_bytes + S::v_bytes);
    if (tid < kC / 4) cuda::cp_async_16(sg + tid * 16, a.gamma + (int64_t(chunk) * a.heads + head) * kC + tid * 4, 16);
    if (tid < kC) {
      const bool ok = tid < valid;
      const float* bp = static_cast<const float*>(a.beta.ptr) + (ok ? int64_t(t0 + tid) * a.beta.st : 0) + head * a.beta.sh;
      cp_async_4(sg + kC * 4 + tid * 4, bp, ok);
    }
  };
  // Group 2 of a chunk: Q and P (outputs only).
  auto load_out = [&](int chunk) {
    if (!with_out) return;
    const int t0 = chunk * kC;
    load_rows(cuda::smem_addr(sq), a.q, t0, min(kC, a.t_len - t0));
    load_square(cuda::smem_addr(sp), a.p, chunk);
  };
  auto store_state = [&](int chunk) {  // S (bf16) to shared memory, and for the backward to memory
#pragma unroll
    for (int mt = 0; mt < kMt; ++mt)
#pragma unroll
      for (int nt = 0; nt < kNt; ++nt)
#pragma unroll
        for (int h2 = 0; h2 < 2; ++h2) {
          const int r = warp * kRows + mt * 16 + g4 + h2 * 8, c = nt * 8 + c4 * 2;
          const uint32_t packed = cuda::pack_bf16(s[mt][nt][2 * h2], s[mt][nt][2 * h2 + 1]);
          *reinterpret_cast<uint32_t*>(ss + r * kPad + c) = packed;
          if (a.chunk_states && !is_map && chunk < chunk_end)
            *reinterpret_cast<uint32_t*>(a.chunk_states + ((int64_t(chunk) * a.heads + head) * D + r) * D + col0 + c) = packed;
        }
  };

  // Commit groups: with outputs main(c), out(c) per chunk, so at the top of a chunk only its out
  // group may be pending and in the middle only the next chunk's main; without outputs one main
  // group per chunk, two chunks ahead, so one may be pending at the top.
  if (chunk_begin < chunk_end) {
    load_main(chunk_begin);
    cuda::cp_async_commit();
    if constexpr (Out) {
      load_out(chunk_begin);
    } else if (chunk_begin + 1 < chunk_end) {
      load_main(chunk_begin + 1);
    }
    cuda::cp_async_commit();
  }
  store_state(chunk_begin);
  const int m0 = warp * 16;  // chunk rows of this warp in the chunk-row products
  for (int chunk = chunk_begin; chunk < chunk_end; ++chunk) {
    unsigned char* st = stage_ptr(chunk);
    const bf16_t* sv = reinterpret_cast<const bf16_t*>(st + S::k_bytes + S::t_bytes);
    const float* sgamma = reinterpret_cast<const float*>(st + S::k_bytes + S::t_bytes + S::v_bytes);
    const float* sbeta = sgamma + kC;
    cuda::cp_async_wait<1>();  // this chunk's group 1 (its group 2 / the next chunk's may be in flight)
    __syncthreads();           // [A] group 1 and S (bf16) visible to every warp
    if (chunk + S::ring - 1 < chunk_end) load_main(chunk + S::ring - 1);  // into the stage read last chunk
    cuda::cp_async_commit();
    const float gamma_c = sgamma[kC - 1];
    const int ra = m0 + g4, rb = ra + 8;  // this thread's chunk rows

    // K S, then R = β (V − e^γ K S).
    {
      float acc[kNt][4] = {};
      rows_times_tile<D>(acc, cuda::smem_addr(st), m0, cuda::smem_addr(ss), lane);
      const float ea = expf(sgamma[ra]), eb = expf(sgamma[rb]), ba = sbeta[ra], bb = sbeta[rb];
#pragma unroll
      for (int nt = 0; nt < kNt; ++nt) {
        const int c = nt * 8 + c4 * 2;
        float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (!is_map) {
          v[0] = __bfloat162float(sv[ra * kPad + c]);
          v[1] = __bfloat162float(sv[ra * kPad + c + 1]);
          v[2] = __bfloat162float(sv[rb * kPad + c]);
          v[3] = __bfloat162float(sv[rb * kPad + c + 1]);
        }
        *reinterpret_cast<uint32_t*>(sr + ra * kPad + c) =
            cuda::pack_bf16(ba * (v[0] - ea * acc[nt][0]), ba * (v[1] - ea * acc[nt][1]));
        *reinterpret_cast<uint32_t*>(sr + rb * kPad + c) =
            cuda::pack_bf16(bb * (v[2] - eb * acc[nt][2]), bb * (v[3] - eb * acc[nt][3]));
      }
    }
    __syncthreads();  // [B] R complete
    // V' = T R; V'' = e^{γ_C−γ} V' for the state, V' for the output (and the backward).
    {
      float acc[kNt][4] = {};
      rows_times_tile<kC>(acc, cuda::smem_addr(st + S::k_bytes), m0, cuda::smem_addr(sr), lane);
      const float da = expf(gamma_c - sgamma[ra]), db = expf(gamma_c - sgamma[rb]);
#pragma unroll
      for (int nt = 0; nt < kNt; ++nt) {
        const int c = nt * 8 + c4 * 2;
        *reinterpret_cast<uint32_t*>(svs + ra * kPad + c) = cuda::pack_bf16(da * acc[nt][0], da * acc[nt][1]);
        *reinterpret_cast<uint32_t*>(svs + rb * kPad + c) = cuda::pack_bf16(db * acc[nt][2], db * acc[nt][3]);
        const uint32_t va = cuda::pack_bf16(acc[nt][0], acc[nt][1]), vb = cuda::pack_bf16(acc[nt][2], acc[nt][3]);
        if constexpr (Out) {
          *reinterpret_cast<uint32_t*>(svo + ra * kPad + c) = va;
          *reinterpret_cast<uint32_t*>(svo + rb * kPad + c) = vb;
        }
        if (a.vnew && !is_map) {
          bf16_t* vn = a.vnew + (int64_t(chunk) * a.heads + head) * kC * D + col0 + c;
          *reinterpret_cast<uint32_t*>(vn + ra * D) = va;
          *reinterpret_cast<uint32_t*>(vn + rb * D) = vb;
        }
      }
    }
    if constexpr (Out) cuda::cp_async_wait<1>();  // this chunk's group 2 (Q, P); the next chunk's group 1 may be in flight
    __syncthreads();                               // [C] V'', V', Q, P visible
    // S ← e^{γ_C} S + Kᵀ V''.
    const float decay = expf(gamma_c);
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
        uint32_t af[4];  // A = Kᵀ through a transposing load of K [C][D]
        const int d0 = warp * kRows + mt * 16;
        const int row = kk * 16 + (lane % 8) + (lane / 16) * 8, c = d0 / 8 + (lane / 8) % 2;
        cuda::ldmatrix_x4_trans(af, cuda::smem_addr(st) + cuda::swizzled<kChunks>(row, c));
#pragma unroll
        for (int nt = 0; nt < kNt; nt += 2) {
          uint32_t b[4];
          const int vrow = kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8, vc = nt * 8 + (lane / 16) * 8;
          cuda::ldmatrix_x4_trans(b, cuda::smem_addr(svs) + (vrow * kPad + vc) * 2);
          cuda::mma_bf16(s[mt][nt], af, b[0], b[1]);
          cuda::mma_bf16(s[mt][nt + 1], af, b[2], b[3]);
        }
      }
    }
    // O = scale e^γ (Q S_old) + P V' (S_old: the bf16 copy still in shared memory).
    if (with_out) {
      float o[kNt][4] = {};
      rows_times_tile<D>(o, cuda::smem_addr(sq), m0, cuda::smem_addr(ss), lane);
      const float ea = a.scale * expf(sgamma[ra]), eb = a.scale * expf(sgamma[rb]);
#pragma unroll
      for (int nt = 0; nt < kNt; ++nt) {
        o[nt][0] *= ea;
        o[nt][1] *= ea;
        o[nt][2] *= eb;
        o[nt][3] *= eb;
      }
      rows_times_tile<kC>(o, cuda::smem_addr(sp), m0, cuda::smem_addr(svo), lane);
      const int t0 = chunk * kC, valid = min(kC, a.t_len - t0);
#pragma unroll
      for (int h2 = 0; h2 < 2; ++h2) {
        const int r = h2 == 0 ? ra : rb;
        if (r >= valid) continue;
        bf16_t* orow = a.out + int64_t(t0 + r) * a.out_st + head * a.out_sh + col0;
#pragma unroll
        for (int nt = 0; nt < kNt; ++nt)
          *reinterpret_cast<uint32_t*>(orow + nt * 8 + c4 * 2) = cuda::pack_bf16(o[nt][2 * h2], o[nt][2 * h2 + 1]);
      }
    }
    __syncthreads();  // [D] every read of S (bf16), R, V'', V', Q, P of this chunk is done
    if constexpr (Out) {
      if (chunk + 1 < chunk_end) load_out(chunk + 1);
      cuda::cp_async_commit();
    }
    store_state(chunk + 1);
  }
  cuda::cp_async_wait<0>();

  float* dst = is_map ? a.map_out : a.state_out;
  if (dst) {
    dst += seg + hblock;
#pragma unroll
    for (int mt = 0; mt < kMt; ++mt)
#pragma unroll
      for (int nt = 0; nt < kNt; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = warp * kRows + mt * 16 + g4 + (e / 2) * 8, c = col0 + nt * 8 + c4 * 2 + (e % 2);
          dst[int64_t(r) * D + c] = s[mt][nt][e];
        }
  }
}

template <int D>
void launch_state(const StatePassArgs& args) {
  constexpr int kValueTiles = D / kBV;
  const int tiles = (args.value_tiles ? kValueTiles : 0) + (args.map_tiles ? kValueTiles : 0);
  if (tiles == 0 || args.segments == 0) return;
  // Two CTAs per SM either way (108 KB each without outputs at D = 128: the carveout asks for all
  // of the SM's shared memory).
  auto launch = [&](auto kernel, size_t smem) {
    HYDRA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    HYDRA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                          cudaSharedmemCarveoutMaxShared));
    kernel<<<dim3(tiles, args.heads, args.segments), kThreads, smem, current_stream()>>>(args);
    HYDRA_CUDA_LAUNCH_CHECK();
  };
  if (args.out) {
    launch(gdn_state_kernel<D, true>, StateSmem<D, true>::total);
  } else {
    launch(gdn_state_kernel<D, false>, StateSmem<D, false>::total);
  }
}

}  // namespace

void state_pass(const StatePassArgs& args, int head_dim) {
  HYDRA_ASSERT(args.chunks_per_segment > 0, "state pass: empty segments");
  if (head_dim == 128) {
    launch_state<128>(args);
  } else {
    launch_state<64>(args);
  }
}

}  // namespace hydra::ops::cuda_impl::gdn
