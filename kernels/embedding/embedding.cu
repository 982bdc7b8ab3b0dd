// CUDA embedding lookup: one block per token row, 16-byte copies when the row allows.
//
// Backward (d_table[id] += d_out[t] for every t with ids[t] = id), deterministic: the (id, t) pairs
// are sorted by id with CUB's stable radix sort over the id's bits only (ids outside [0, V) become
// the key V and are skipped), so each id's tokens form one run in increasing t. The sorted sequence
// is cut into fixed chunks of `chunk` positions; two kernels then sum every run in an order fixed by
// its positions alone:
//   chunks: one block per (chunk, column tile) sums each run's part in the chunk in position order.
//           A run wholly inside the chunk is added to its row of d_table at once; the chunk's last
//           part, when the run goes on past the chunk, is stored as the chunk's partial row; a first
//           part that ends a run begun in an earlier chunk is left to `runs`.
//   runs:   one block per run that crosses a chunk's end, started in the chunk where the run starts:
//           it sums the run's partial rows (its first chunk and every chunk it fills), then the rows
//           of its last chunk, 8 row groups × 4 accumulators interleaved, combined in a fixed order.
// No two blocks write the same row and no atomics are used, so the result has the same bits on every
// run. Every row is read once (plus one partial row per chunk), so a small vocabulary whose ids repeat
// thousands of times costs as little as a large one: the old kernel gave each run to one block and
// spent 181 µs on qwen3-synth's 16384 × 256 step (a few thousand repeats of its frequent ids).
#include <algorithm>
#include <bit>

#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/backward.cuh"
#include "kernels/embedding/embedding.h"

namespace hydra::ops::cuda_impl {
namespace {
__global__ void embedding_kernel(bf16_t* out, int64_t out_stride, const bf16_t* table, int64_t table_stride,
                                 const int32_t* ids, int64_t rows, int64_t dim) {
  cuda::wait_for_previous_grid();  // launched through cuda::launch (PDL in a decode step)
  cuda::allow_next_grid();
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const bf16_t* src = table + ids[r] * table_stride;
    bf16_t* dst = out + r * out_stride;
    if (dim % 8 == 0 && table_stride % 8 == 0 && out_stride % 8 == 0) {
      for (int64_t i = threadIdx.x; i < dim / 8; i += blockDim.x)
        reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<const uint4*>(src)[i];
    } else {
      for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) dst[i] = src[i];
    }
  }
}

// Ids as unsigned keys, an id outside [0, vocab) as the key `vocab` (sorted last, skipped).
__global__ void ids_to_keys_kernel(uint32_t* keys, int32_t* order, const int32_t* ids, int64_t ids_stride, int64_t n,
                                   uint32_t vocab) {
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < n; t += int64_t(gridDim.x) * blockDim.x) {
    const uint32_t id = static_cast<uint32_t>(ids[t * ids_stride]);
    keys[t] = id < vocab ? id : vocab;
    order[t] = static_cast<int32_t>(t);
  }
}

constexpr int kMaxChunk = 256;          // sorted positions a chunk (the chunks kernel's shared arrays)
constexpr int kRunGroups = 8;           // the runs kernel's row groups (blockDim.y)
constexpr int kRunColumns = 64;         // the runs kernel's column threads at most (blockDim.x)
constexpr uint32_t kNoKey = 0xffffffffu;  // beyond the sequence (keys are at most vocab < 2³¹)

// kVec consecutive columns of one row as floats: 16-byte (fp32) or 8-byte (bf16) loads for kVec = 4.
template <int kVec>
struct Cols {
  float v[kVec];
  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int i = 0; i < kVec; ++i) v[i] = 0.0f;
  }
  __device__ __forceinline__ void add(const Cols& o) {
#pragma unroll
    for (int i = 0; i < kVec; ++i) v[i] += o.v[i];
  }
};
template <int kVec>
__device__ __forceinline__ Cols<kVec> load_cols(const cuda::FloatRows& r, int64_t at) {
  Cols<kVec> c;
  if constexpr (kVec == 1) {
    c.v[0] = r.load(at);
  } else {
    static_assert(kVec == 4);
    if (r.bf16) {
      const uint2 u = *reinterpret_cast<const uint2*>(static_cast<const cuda::bf16_t*>(r.data) + at);
      const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.x));
      const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.y));
      c.v[0] = a.x, c.v[1] = a.y, c.v[2] = b.x, c.v[3] = b.y;
    } else {
      const float4 f = *reinterpret_cast<const float4*>(static_cast<const float*>(r.data) + at);
      c.v[0] = f.x, c.v[1] = f.y, c.v[2] = f.z, c.v[3] = f.w;
    }
  }
  return c;
}
template <int kVec>
__device__ __forceinline__ Cols<kVec> load_f32(const float* p) {
  Cols<kVec> c;
  if constexpr (kVec == 1) {
    c.v[0] = *p;
  } else {
    const float4 f = *reinterpret_cast<const float4*>(p);
    c.v[0] = f.x, c.v[1] = f.y, c.v[2] = f.z, c.v[3] = f.w;
  }
  return c;
}
template <int kVec>
__device__ __forceinline__ void store_f32(float* p, const Cols<kVec>& c) {
  if constexpr (kVec == 1) {
    *p = c.v[0];
  } else {
    *reinterpret_cast<float4*>(p) = make_float4(c.v[0], c.v[1], c.v[2], c.v[3]);
  }
}

struct BackwardArgs {
  float* d_table;          // [V, D] fp32, rows table_stride apart
  int64_t table_stride;
  uint32_t vocab;          // V (a key equal to it is an id outside [0, V): skipped)
  cuda::FloatRows d_out;   // [T, D]
  const uint32_t* keys;    // [T] sorted ids
  const int32_t* order;    // [T] the token of each sorted position
  int64_t n;               // T
  int64_t dim;             // D
  int chunk;               // sorted positions a chunk (≤ kMaxChunk)
  float* partial;          // [chunks, D]: a chunk's last run part when the run goes on past it
};

// Block (chunk k, column tile): sums each run's part in the chunk, 8 rows' loads in flight a thread.
template <int kVec>
__global__ void embedding_backward_chunks_kernel(BackwardArgs a) {
  __shared__ uint32_t key[kMaxChunk];
  __shared__ int64_t row[kMaxChunk];  // element offset of the token's row of d_out
  const int64_t k = blockIdx.x, start = k * a.chunk, end = std::min<int64_t>(start + a.chunk, a.n);
  const int len = static_cast<int>(end - start);
  for (int i = threadIdx.x; i < len; i += blockDim.x) {
    key[i] = a.keys[start + i];
    row[i] = a.d_out.offset(a.order[start + i]);
  }
  const uint32_t before = start > 0 ? a.keys[start - 1] : kNoKey, after = end < a.n ? a.keys[end] : kNoKey;
  __syncthreads();
  const int64_t col = (int64_t(blockIdx.y) * blockDim.x + threadIdx.x) * kVec;
  if (col >= a.dim) return;
  Cols<kVec> acc;
  acc.zero();
  int first = 0;  // the current part's first position in the chunk
  for (int base = 0; base < len; base += 8) {
    Cols<kVec> v[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      if (base + j < len) v[j] = load_cols<kVec>(a.d_out, row[base + j] + col);
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int q = base + j;
      if (q >= len) break;
      acc.add(v[j]);
      const uint32_t id = key[q];
      if (q + 1 < len && key[q + 1] == id) continue;  // the part goes on (uniform across the block)
      if (id < a.vocab) {
        if (q + 1 == len && after == id) {
          store_f32<kVec>(a.partial + k * a.dim + col, acc);  // the run goes on: the runs kernel adds it
        } else if (!(first == 0 && before == id)) {           // a whole run: added here
          float* out = a.d_table + int64_t(id) * a.table_stride + col;
          Cols<kVec> sum = load_f32<kVec>(out);
          sum.add(acc);
          store_f32<kVec>(out, sum);
        }  // else the end of a run begun earlier: the runs kernel reads these rows
      }
      acc.zero();
      first = q + 1;
    }
  }
}

// Block (chunk k, column tile) of kRunGroups row groups: works only if a run starts in chunk k and
// goes on past its end; sums the run's partial rows (chunks k … last − 1) and its rows in chunk
// `last`, item i to group i mod 8, accumulator (i / 8) mod 4, the sums combined in a fixed order.
template <int kVec>
__global__ void embedding_backward_runs_kernel(BackwardArgs a) {
  __shared__ float group_sum[kRunGroups][kRunColumns * 4];
  const int64_t k = blockIdx.x, start = k * a.chunk, end = start + a.chunk;
  if (end >= a.n) return;  // uniform across the block from here to the reduction
  const uint32_t id = a.keys[end - 1];
  if (id >= a.vocab || a.keys[end] != id || (start > 0 && a.keys[start - 1] == id)) return;
  int64_t lo = end + 1, hi = a.n;  // the run's end by bisection over the sorted keys
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (a.keys[mid] == id) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  const int64_t run_end = lo, last = (run_end - 1) / a.chunk, partials = last - k;
  const int64_t items = partials + (run_end - last * a.chunk);
  const int64_t col = (int64_t(blockIdx.y) * blockDim.x + threadIdx.x) * kVec;
  const bool active = col < a.dim;
  Cols<kVec> acc[4];
#pragma unroll
  for (int u = 0; u < 4; ++u) acc[u].zero();
  if (active) {
    for (int64_t i = threadIdx.y; i < items; i += 4 * kRunGroups) {
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int64_t it = i + u * kRunGroups;
        if (it < items) {
          acc[u].add(it < partials ? load_f32<kVec>(a.partial + (k + it) * a.dim + col)
                                   : load_cols<kVec>(a.d_out, a.d_out.offset(a.order[last * a.chunk + it - partials]) + col));
        }
      }
    }
  }
  acc[0].add(acc[1]);
  acc[2].add(acc[3]);
  acc[0].add(acc[2]);
#pragma unroll
  for (int i = 0; i < kVec; ++i) group_sum[threadIdx.y][threadIdx.x * kVec + i] = acc[0].v[i];
  __syncthreads();
  if (threadIdx.y != 0 || !active) return;
  float* out = a.d_table + int64_t(id) * a.table_stride + col;
  Cols<kVec> sum = load_f32<kVec>(out);
#pragma unroll
  for (int g = 0; g < kRunGroups; ++g) {
#pragma unroll
    for (int i = 0; i < kVec; ++i) sum.v[i] += group_sum[g][threadIdx.x * kVec + i];
  }
  store_f32<kVec>(out, sum);
}

// A chunk of 32 sorted positions, doubled (up to kMaxChunk) while there are more than 4096 chunks:
// enough blocks to fill the GPU, and the partial rows at most 1/32 of d_out's.
int chunk_positions(int64_t n) {
  int chunk = 32;
  while (chunk < kMaxChunk && (n + chunk - 1) / chunk > 4096) chunk *= 2;
  return chunk;
}

template <int kVec>
void launch_backward(const BackwardArgs& a) {
  const int64_t chunks = (a.n + a.chunk - 1) / a.chunk, cols = (a.dim + kVec - 1) / kVec;
  const auto threads = [&](int64_t most) { return static_cast<int>(std::min<int64_t>(most, (cols + 31) / 32 * 32)); };
  const int tc = threads(128), tr = threads(kRunColumns);
  HYDRA_ASSERT(chunks < (int64_t{1} << 31) && (cols + tr - 1) / tr < 65536, "embedding_backward: grid of {} x {} too large",
               chunks, cols);
  embedding_backward_chunks_kernel<kVec><<<dim3(chunks, (cols + tc - 1) / tc), tc, 0, current_stream()>>>(a);
  HYDRA_CUDA_LAUNCH_CHECK();
  embedding_backward_runs_kernel<kVec>
      <<<dim3(chunks, (cols + tr - 1) / tr), dim3(tr, kRunGroups), 0, current_stream()>>>(a);
  HYDRA_CUDA_LAUNCH_CHECK();
}
}  // namespace

void embedding(const TensorView& out, const TensorView& table, const TensorView& ids) {
  cuda::expect_cuda(out, "embedding out", DType::bf16);
  cuda::expect_cuda(table, "embedding table", DType::bf16);
  cuda::expect_cuda(ids, "token ids", DType::i32);
  cuda::launch(embedding_kernel, cuda::capped_grid(out.size(0)), 128, 0, out.data_as<cuda::bf16_t>(), out.stride(0),
               table.data_as<const cuda::bf16_t>(), table.stride(0), ids.data_as<const int32_t>(), out.size(0),
               out.size(1));
  HYDRA_CUDA_LAUNCH_CHECK();
}

void embedding_backward(const TensorView& d_table, const TensorView& d_out, const TensorView& ids) {
  cuda::expect_cuda(d_table, "embedding d_table", DType::f32);
  cuda::expect_cuda(ids, "token ids", DType::i32);
  const cuda::FloatRows fdo = cuda::float_rows(d_out, "embedding d_out");
  HYDRA_ASSERT(d_table.rank() == 2 && d_table.stride(1) == 1 && d_out.rank() == 2 && ids.rank() == 1 &&
                   d_out.size(0) == ids.size(0) && d_out.size(1) == d_table.size(1),
               "embedding_backward: d_table {} (unit column stride), d_out {} and ids {} must be [V, D], [T, D], [T]",
               d_table.shape_string(), d_out.shape_string(), ids.shape_string());
  const int64_t n = ids.size(0), dim = d_out.size(1);
  HYDRA_ASSERT(n < (int64_t{1} << 31), "embedding_backward: {} tokens exceed the sort's 32-bit indices", n);
  const int64_t vocab = d_table.size(0);
  HYDRA_ASSERT(vocab < (int64_t{1} << 31), "embedding_backward: {} rows exceed the sort's 32-bit keys", vocab);
  if (n == 0 || dim == 0 || vocab == 0) return;
  Tensor keys_in = Tensor::empty({n}, DType::i32, Device::cuda), keys = Tensor::empty({n}, DType::i32, Device::cuda);
  Tensor order_in = Tensor::empty({n}, DType::i32, Device::cuda), order = Tensor::empty({n}, DType::i32, Device::cuda);
  ids_to_keys_kernel<<<cuda::capped_grid((n + 255) / 256), 256, 0, current_stream()>>>(
      static_cast<uint32_t*>(keys_in.data()), order_in.data_as<int32_t>(), ids.data_as<const int32_t>(), ids.stride(0),
      n, static_cast<uint32_t>(vocab));
  HYDRA_CUDA_LAUNCH_CHECK();
  // Keys are at most vocab: sorting their low bit_width(vocab) bits is the whole sort (2 passes of
  // CUB's 8-bit digits for V = 512 instead of 4 for 32 bits).
  const int key_bits = std::bit_width(static_cast<uint32_t>(vocab));
  const auto sort = [&](void* temp, size_t& temp_bytes) {
    HYDRA_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, static_cast<const uint32_t*>(keys_in.data()),
                                                     static_cast<uint32_t*>(keys.data()),
                                                     order_in.data_as<const int32_t>(), order.data_as<int32_t>(),
                                                     static_cast<int>(n), 0, key_bits, current_stream()));
  };
  size_t temp_bytes = 0;
  sort(nullptr, temp_bytes);  // size query only
  Tensor temp = Tensor::empty({static_cast<int64_t>((temp_bytes + 3) / 4)}, DType::i32, Device::cuda);
  sort(temp.data(), temp_bytes);
  const int chunk = chunk_positions(n);
  Tensor partial = Tensor::empty({(n + chunk - 1) / chunk, dim}, DType::f32, Device::cuda);  // [chunks, D]
  const BackwardArgs args{.d_table = d_table.data_as<float>(), .table_stride = d_table.stride(0),
                          .vocab = static_cast<uint32_t>(vocab), .d_out = fdo,
                          .keys = static_cast<const uint32_t*>(keys.data()), .order = order.data_as<const int32_t>(),
                          .n = n, .dim = dim, .chunk = chunk, .partial = partial.data_as<float>()};
  // 4 columns a thread when every row (d_out's, d_table's, the partials') starts on a vector boundary.
  const bool vec = dim % 4 == 0 && cuda::row_starts_aligned(fdo, fdo.bf16 ? 8 : 16) && d_table.stride(0) % 4 == 0 &&
                   reinterpret_cast<uintptr_t>(d_table.data()) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(partial.data()) % 16 == 0;
  if (vec) {
    launch_backward<4>(args);
  } else {
    launch_backward<1>(args);
  }
}

}  // namespace hydra::ops::cuda_impl
