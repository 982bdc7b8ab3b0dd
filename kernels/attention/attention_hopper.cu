// Flash attention forward for Hopper (sm_90a), head dim 128: warp-specialised, TMA-fed, wgmma.
//
// CTA = 3 warpgroups, one CTA per SM, persistent:
//  * warpgroup 0, the producer (setmaxnreg 24): one thread loads Q, K and V tiles with TMA
//    (128-byte swizzle, the layout wgmma reads) into shared memory — Q once per tile, K and V
//    through a 2-stage ring — guarded by mbarriers (full: expect-tx; empty: one arrival per
//    consumer warp). It also runs the tile scheduler: tiles are (128-query block, head) pairs
//    handed out longest-first (last query block first, heads inner) through a global atomic
//    counter; the tile index travels to the consumers with the Q tile.
//  * warpgroups 1 and 2, the consumers (setmaxnreg 240): 64 query rows each of the 128-row tile.
//    Key tiles of 128 are visited last to first, so the masked (diagonal, partial) tiles come
//    first. Per key tile j, inside a warpgroup: S_j = Q K_jᵀ is issued together with
//    O += P_{j+1} V_{j+1} (the previous tile's product), the softmax of S_j runs while the P·V
//    product is still on the tensor cores, and P stays in registers (bf16 A fragments). Between
//    the two warpgroups, named barriers enforce a ping-pong: a warpgroup issues its GEMMs only
//    after the other has issued its own, so one warpgroup's softmax overlaps the other's GEMMs.
//  * the epilogue (flash_common.cuh) writes fp32 rows directly: normalised output and natural-log
//    lse, merged in place with an earlier partial result in merge mode (ring attention).
//
// Everything the ring needs is kept from the kernels it replaces: τ folded into the per-row scale,
// positional masks (causal diagonal, partial, full and empty tiles), the GQA map, fp32 merge.
#include "kernels/attention/flash_common.cuh"
#include "kernels/attention/flash_softmax.cuh"
#include "kernels/cuda/hopper.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace hydra::ops::cuda_impl {
namespace {

constexpr int kM = 128, kN = 128, kD = 128, kStages = 2;
constexpr int kConsumerGroups = 2;  // 64 query rows each
constexpr int kThreads = 128 * (1 + kConsumerGroups);
constexpr int kConsumerWarps = 4 * kConsumerGroups;
constexpr int kPingPongBarrier = 1;                // named barriers 1 and 2: consumer warpgroup 0 and 1
constexpr int kPingPongThreads = 2 * 128;          // the waiting warpgroup + the arriving one
constexpr uint32_t kBlockBytes = 128 * 64 * 2;     // one TMA box: [128 rows][64 columns] bf16
constexpr uint32_t kTileBytes = 2 * kBlockBytes;   // a [128][128] tile as two column blocks

struct Barriers {
  uint64_t q_full, q_empty;
  uint64_t k_full[kStages], k_empty[kStages], v_full[kStages], v_empty[kStages];
  int tile;  // the tile whose Q the producer loaded last; ≥ tiles: no more work
};
constexpr size_t kSmemBytes = (1 + 2 * kStages) * kTileBytes + sizeof(Barriers) + 1024;  // + alignment

struct HopperParams {
  CUtensorMap q_map, k_map, v_map;  // [T, H, 128] bf16, boxes of [128][1][64]
  FlashParams f;
  int* next_tile;  // zeroed before the launch; tiles gridDim.x, gridDim.x + 1, ... are handed out in order
  int tiles, m_blocks, heads;
};

// Tile t: query block m_blocks − 1 − t / heads (longest first under causal masking), head t % heads.
__device__ __forceinline__ void decode_tile(const HopperParams& hp, int tile, int& q0, int& head) {
  q0 = (hp.m_blocks - 1 - tile / hp.heads) * kM;
  head = tile % hp.heads;
}
__device__ __forceinline__ int key_tiles(const FlashParams& p, int q0) { return (flash_key_end(p, q0, kM) + kN - 1) / kN; }

__device__ __forceinline__ void load_tile(unsigned char* dst, const CUtensorMap* map, int head, int row, uint64_t* bar) {
  cuda::mbar_expect_bytes(bar, kTileBytes);
  cuda::tma_load_3d_cols128(dst, kBlockBytes, map, head, row, bar);
}

// The producer thread: the tile scheduler and every TMA load.
__device__ void produce(const HopperParams& hp, unsigned char* sq, unsigned char* sk, unsigned char* sv, Barriers& b) {
  const FlashParams& p = hp.f;
  int it = 0;  // K/V tiles loaded so far (ring position)
  for (int t = 0, tile = blockIdx.x;; ++t) {
    cuda::mbar_wait(&b.q_empty, (t & 1) ^ 1);  // the consumers are done with the previous Q
    b.tile = tile;                              // published by the q_full arrival (release)
    if (tile >= hp.tiles) {
      cuda::mbar_arrive(&b.q_full);
      return;
    }
    int q0, head;
    decode_tile(hp, tile, q0, head);
    const int n = key_tiles(p, q0);
    if (n == 0) {
      cuda::mbar_arrive(&b.q_full);  // nothing visible: the consumers only write the empty result
    } else {
      load_tile(sq, &hp.q_map, head, q0, &b.q_full);
    }
    const int kvh = p.kv_of[head];
    for (int j = n - 1; j >= 0; --j, ++it) {
      const int s = it % kStages;
      const uint32_t parity = ((it / kStages) & 1) ^ 1;
      cuda::mbar_wait(&b.k_empty[s], parity);
      load_tile(sk + s * kTileBytes, &hp.k_map, kvh, j * kN, &b.k_full[s]);
      cuda::mbar_wait(&b.v_empty[s], parity);
      load_tile(sv + s * kTileBytes, &hp.v_map, kvh, j * kN, &b.v_full[s]);
    }
    tile = static_cast<int>(gridDim.x) + atomicAdd(hp.next_tile, 1);
  }
}

// S = Q Kᵀ for the warpgroup's 64 rows and a 128-key tile (Q and K K-major in shared memory).
__device__ __forceinline__ void issue_qk(float (&s)[64], uint32_t q_addr, uint32_t k_addr) {
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    const uint32_t koff = static_cast<uint32_t>((kk / 4) * kBlockBytes + (kk % 4) * 32);
    cuda::wgmma_m64n128k16_ss(s, cuda::wgmma_desc(q_addr + koff, 16, 1024), cuda::wgmma_desc(k_addr + koff, 16, 1024),
                              kk > 0 ? 1 : 0);
  }
  cuda::wgmma_commit();
}

// O += P V: P from registers, V [keys][d] read transposed (MN-major B, d in two 64-column blocks).
__device__ __forceinline__ void issue_pv(float (&o)[64], const uint32_t (&pa)[kN / 16][4], uint32_t v_addr) {
#pragma unroll
  for (int kk = 0; kk < kN / 16; ++kk)
    cuda::wgmma_m64n128k16_rs<1>(o, pa[kk], cuda::wgmma_desc(v_addr + static_cast<uint32_t>(kk * 16 * 128), kBlockBytes, 1024), 1);
  cuda::wgmma_commit();
}

// A consumer warp's release of a stage: its share of the wgmma reads has completed.
__device__ __forceinline__ void release(uint64_t* bar, int lane) {
  if (lane == 0) cuda::mbar_arrive(bar);
}

// Consumer warpgroup cw (0 or 1): rows [64·cw, 64·cw + 64) of every tile.
__device__ void consume(const HopperParams& hp, int cw, unsigned char* sq, unsigned char* sk, unsigned char* sv,
                        Barriers& b) {
  const FlashParams& p = hp.f;
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32, g4 = lane / 4, c4 = lane % 4;
  const uint32_t q_addr = cuda::smem_addr(sq) + static_cast<uint32_t>(cw * 64 * 128);
  const uint32_t k_addr = cuda::smem_addr(sk), v_addr = cuda::smem_addr(sv);
  const int my_turn = kPingPongBarrier + cw, other_turn = kPingPongBarrier + 1 - cw;
  if (cw == 1) cuda::named_barrier_arrive(kPingPongBarrier, kPingPongThreads);  // warpgroup 0 issues first

  int it = 0;  // K/V tiles consumed so far (ring position, as the producer counts)
  for (int t = 0;; ++t) {
    cuda::mbar_wait(&b.q_full, t & 1);
    const int tile = *static_cast<volatile int*>(&b.tile);
    if (tile >= hp.tiles) break;
    int q0, head;
    decode_tile(hp, tile, q0, head);
    const int n = key_tiles(p, q0);
    const int row_first = q0 + cw * 64;
    const int row0 = row_first + warp * 16 + g4, row1 = row0 + 8;
    const float rs[2] = {flash_row_scale(p, row0), flash_row_scale(p, row1)};
    float o[64], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < 64; ++i) o[i] = 0.0f;

    auto softmax = [&](float (&s)[64], int j, float (&corr)[2]) {
      const int key0 = j * kN;
      if (flash_tile_needs_mask(p, key0, kN, row_first)) {
        const int last[2] = {flash_last_visible(p, key0, row0), flash_last_visible(p, key0, row1)};
        flash_apply_mask(s, c4, last);
      }
      flash_softmax_step(s, rs, m, l, corr);
    };

    if (n == 0) {
      release(&b.q_empty, lane);
    } else {
      float s[64];
      uint32_t pa[kN / 16][4];
      float corr[2];
      // Last key tile: S only.
      int stage = it % kStages;
      uint32_t parity = (it / kStages) & 1;
      cuda::mbar_wait(&b.k_full[stage], parity);
      cuda::named_barrier_sync(my_turn, kPingPongThreads);
      cuda::wgmma_fence();
      issue_qk(s, q_addr, k_addr + stage * kTileBytes);
      cuda::named_barrier_arrive(other_turn, kPingPongThreads);
      cuda::wgmma_wait<0>();
      cuda::fence_operands(s);
      release(&b.k_empty[stage], lane);
      if (n == 1) release(&b.q_empty, lane);
      softmax(s, n - 1, corr);
      flash_pack_p(s, pa);
      int prev = stage;
      uint32_t prev_parity = parity;
      ++it;
      // Tiles n−2 .. 0: S_j and O += P_{j+1} V_{j+1} in flight together, softmax_j under P·V.
      for (int j = n - 2; j >= 0; --j, ++it) {
        stage = it % kStages;
        parity = (it / kStages) & 1;
        cuda::mbar_wait(&b.k_full[stage], parity);
        cuda::mbar_wait(&b.v_full[prev], prev_parity);
        cuda::named_barrier_sync(my_turn, kPingPongThreads);
        cuda::fence_operands(o);
        cuda::fence_operands(pa);
        cuda::wgmma_fence();
        issue_qk(s, q_addr, k_addr + stage * kTileBytes);
        issue_pv(o, pa, v_addr + prev * kTileBytes);
        cuda::named_barrier_arrive(other_turn, kPingPongThreads);
        cuda::wgmma_wait<1>();  // S_j ready; P·V may still run
        cuda::fence_operands(s);
        release(&b.k_empty[stage], lane);
        if (j == 0) release(&b.q_empty, lane);
        softmax(s, j, corr);
        cuda::wgmma_wait<0>();
        cuda::fence_operands(o);
        release(&b.v_empty[prev], lane);
        flash_rescale(o, corr);
        flash_pack_p(s, pa);
        prev = stage;
        prev_parity = parity;
      }
      // The first key tile's P·V.
      cuda::mbar_wait(&b.v_full[prev], prev_parity);
      cuda::named_barrier_sync(my_turn, kPingPongThreads);
      cuda::fence_operands(o);
      cuda::fence_operands(pa);
      cuda::wgmma_fence();
      issue_pv(o, pa, v_addr + prev * kTileBytes);
      cuda::named_barrier_arrive(other_turn, kPingPongThreads);
      cuda::wgmma_wait<0>();
      cuda::fence_operands(o);
      release(&b.v_empty[prev], lane);
    }
    flash_epilogue<kD>(p, head, row0, row1, c4, o, m, l);
  }
  // Warpgroup 1 arrived once more on warpgroup 0's barrier than warpgroup 0 waited: consume it, so
  // no barrier is left half-arrived.
  if (cw == 0) cuda::named_barrier_sync(kPingPongBarrier, kPingPongThreads);
}

__global__ void __launch_bounds__(kThreads, 1) flash_forward_hopper_kernel(const __grid_constant__ HopperParams hp) {
  extern __shared__ unsigned char smem_raw[];
  unsigned char* base = smem_raw + ((1024u - (cuda::smem_addr(smem_raw) & 1023u)) & 1023u);  // swizzle atoms
  unsigned char* sq = base;
  unsigned char* sk = base + kTileBytes;
  unsigned char* sv = base + (1 + kStages) * kTileBytes;
  Barriers& b = *reinterpret_cast<Barriers*>(base + (1 + 2 * kStages) * kTileBytes);
  if (threadIdx.x == 0) {
    cuda::mbar_init(&b.q_full, 1);
    cuda::mbar_init(&b.q_empty, kConsumerWarps);
    for (int s = 0; s < kStages; ++s) {
      cuda::mbar_init(&b.k_full[s], 1);
      cuda::mbar_init(&b.k_empty[s], kConsumerWarps);
      cuda::mbar_init(&b.v_full[s], 1);
      cuda::mbar_init(&b.v_empty[s], kConsumerWarps);
    }
    cuda::mbar_fence_init();
    cuda::tma_prefetch_map(&hp.q_map);
    cuda::tma_prefetch_map(&hp.k_map);
    cuda::tma_prefetch_map(&hp.v_map);
  }
  __syncthreads();
  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    cuda::setmaxnreg_dec<24>();
    if (threadIdx.x == 0) produce(hp, sq, sk, sv, b);
    return;
  }
  cuda::setmaxnreg_inc<240>();
  consume(hp, wg - 1, sq, sk, sv, b);
}

}  // namespace

bool flash_forward_hopper_supports(const TensorView& q, const TensorView& k, const TensorView& v) {
  auto nested = [](const TensorView& t) { return t.stride(0) >= t.size(1) * t.stride(1) && t.stride(1) >= t.size(2); };
  return q.size(2) == kD && v.size(2) == kD && nested(q) && nested(k) && nested(v);
}

void flash_forward_hopper(const FlashParams& f, const TensorView& q, const TensorView& k, const TensorView& v) {
  HopperParams hp{};
  hp.f = f;
  hp.q_map = cuda::make_tma_map_bf16(q.data(), q.size(0), q.size(1), kD, q.stride(0), q.stride(1), kM);
  hp.k_map = cuda::make_tma_map_bf16(k.data(), k.size(0), k.size(1), kD, k.stride(0), k.stride(1), kN);
  hp.v_map = cuda::make_tma_map_bf16(v.data(), v.size(0), v.size(1), kD, v.stride(0), v.stride(1), kN);
  hp.m_blocks = static_cast<int>((q.size(0) + kM - 1) / kM);
  hp.heads = static_cast<int>(q.size(1));
  hp.tiles = hp.m_blocks * hp.heads;
  Tensor counter = Tensor::zeros({1}, DType::i32, Device::cuda);  // stream-ordered: freed after the kernel
  hp.next_tile = counter.data_as<int>();
  HYDRA_CUDA_CHECK(cudaFuncSetAttribute(flash_forward_hopper_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(kSmemBytes)));
  const int grid = std::min(hp.tiles, cuda::sm_count());
  flash_forward_hopper_kernel<<<grid, kThreads, kSmemBytes, current_stream()>>>(hp);
  HYDRA_CUDA_LAUNCH_CHECK();
}

}  // namespace hydra::ops::cuda_impl
