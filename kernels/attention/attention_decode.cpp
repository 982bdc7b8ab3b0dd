// The decode-step attention ops' entry points (attention_decode.h): shape checks, then the CUDA kernels
// (tensors on the GPU, attention_decode*.cu) or the CPU reference (host tensors,
// attention_decode_reference.cpp); the merge of partial results composes attention_merge.
#include "kernels/attention/attention_decode.h"

#include <limits>

#include "kernels/attention/attention_decode_reference.h"
#include "kernels/common.h"

namespace hydra::ops {
namespace {

void check_index_vector(const TensorView& v, const char* what, int64_t rows) {
  expect_shape(v, what, {{"B", rows}});
  expect_dtype(v, what, DType::i32);
}

}  // namespace

void attention_decode(const TensorView& out, const TensorView& lse, const TensorView& q, const TensorView& k_cache,
                      const TensorView& v_cache, const TensorView& slots, const TensorView& lengths,
                      int64_t max_length, const TensorView& q_positions, const AttentionParams& params) {
  expect_shape(q, "decode q", {{"B", -1}, {"Hq", -1}, {"d", -1}});
  const int64_t rows = q.size(0), hq = q.size(1), d = q.size(2);
  expect_shape(k_cache, "decode k cache", {{"S", -1}, {"cap", -1}, {"Hk", -1}, {"d", d}});
  expect_shape(v_cache, "decode v cache", {{"S", k_cache.size(0)}, {"cap", k_cache.size(1)}, {"Hk", k_cache.size(2)}, {"dv", -1}});
  const int64_t hk = k_cache.size(2), dv = v_cache.size(3);
  expect_shape(out, "decode out", {{"B", rows}, {"Hq", hq}, {"dv", dv}});
  expect_shape(lse, "decode lse", {{"Hq", hq}, {"B", rows}});
  HYDRA_ASSERT(params.kv_head_of_query.empty() ? hq % hk == 0 : static_cast<int64_t>(params.kv_head_of_query.size()) == hq,
               "decode attention: {} query heads, {} KV heads, mapping of {}", hq, hk, params.kv_head_of_query.size());
  if (slots.defined()) check_index_vector(slots, "decode slots", rows);
  check_index_vector(lengths, "decode lengths", rows);
  if (params.tau_log_base > 0) {
    expect_shape(q_positions, "decode positions", {{"B", rows}});
    expect_dtype(q_positions, "decode positions", DType::i64);
  }
  HYDRA_ASSERT(max_length >= 0 && max_length <= k_cache.size(1), "decode attention: at most {} keys in a cache of {} rows",
               max_length, k_cache.size(1));
  if (shapes_only({out, lse, q, k_cache, v_cache, slots, lengths, q_positions})) return;
  if (on_cuda({out, lse, q, k_cache, v_cache, slots, lengths, q_positions})) {
#if HYDRA_CUDA
    cuda_impl::attention_decode(out, lse, q, k_cache, v_cache, slots, lengths, max_length, q_positions, params);
    return;
#endif
  }
  reference::attention_decode(out, lse, q, k_cache, v_cache, slots, lengths, max_length, q_positions, params);
}

void kv_cache_append(const TensorView& k_cache, const TensorView& v_cache, const TensorView& k_new,
                     const TensorView& v_new, const TensorView& slots, const TensorView& rows) {
  expect_shape(k_new, "append k", {{"B", -1}, {"Hk", -1}, {"d", -1}});
  const int64_t n = k_new.size(0);
  expect_shape(v_new, "append v", {{"B", n}, {"Hk", k_new.size(1)}, {"dv", -1}});
  expect_shape(k_cache, "append k cache", {{"S", -1}, {"cap", -1}, {"Hk", k_new.size(1)}, {"d", k_new.size(2)}});
  expect_shape(v_cache, "append v cache", {{"S", k_cache.size(0)}, {"cap", k_cache.size(1)}, {"Hk", k_new.size(1)}, {"dv", v_new.size(2)}});
  if (slots.defined()) check_index_vector(slots, "append slots", n);
  check_index_vector(rows, "append rows", n);
  HYDRA_ASSERT(k_cache.dtype() == k_new.dtype() && v_cache.dtype() == v_new.dtype(), "append: cache {} / rows {}",
               dtype_name(k_cache.dtype()), dtype_name(k_new.dtype()));
  if (shapes_only({k_cache, v_cache, k_new, v_new, slots, rows})) return;
  if (on_cuda({k_cache, v_cache, k_new, v_new, slots, rows})) {
#if HYDRA_CUDA
    cuda_impl::kv_cache_append(k_cache, v_cache, k_new, v_new, slots, rows);
    return;
#endif
  }
  reference::kv_cache_append(k_cache, v_cache, k_new, v_new, slots, rows);
}

void attention_merge_partials(const TensorView& out, const TensorView& lse, const TensorView& part_out,
                              const TensorView& part_lse) {
  expect_shape(part_out, "merge parts out", {{"n", -1}, {"B", -1}, {"Hq", -1}, {"dv", -1}});
  const int64_t n = part_out.size(0), rows = part_out.size(1), hq = part_out.size(2), dv = part_out.size(3);
  expect_shape(part_lse, "merge parts lse", {{"n", n}, {"Hq", hq}, {"B", rows}});
  expect_shape(out, "merge out", {{"B", rows}, {"Hq", hq}, {"dv", dv}});
  expect_shape(lse, "merge lse", {{"Hq", hq}, {"B", rows}});
  if (shapes_only({out, lse, part_out, part_lse})) return;
  if (on_cuda({out, lse, part_out, part_lse})) {
#if HYDRA_CUDA
    cuda_impl::attention_merge_partials(out, lse, part_out, part_lse);
    return;
#endif
  }
  fill(out, 0.0);
  fill(lse, -std::numeric_limits<double>::infinity());
  for (int64_t i = 0; i < n; ++i) attention_merge(out, lse, part_out.select(0, i), part_lse.select(0, i));
}

}  // namespace hydra::ops
