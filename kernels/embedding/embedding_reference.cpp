// The CPU reference of the embedding lookup and its backward (embedding.h), called by the entry points
// (embedding.cpp) for host tensors once shapes are checked; token ids are checked against the table here.
#include "kernels/embedding/embedding_reference.h"

#include <cstring>

#include "kernels/common.h"

namespace hydra::ops::reference {
namespace {

void check_ids(const TensorView& ids, int64_t vocab) {
  const int32_t* id = ids.data_as<const int32_t>();
  for (int64_t t = 0; t < ids.size(0); ++t) {
    HYDRA_ASSERT(id[t] >= 0 && id[t] < vocab, "token id {} at {} outside [0, {})", id[t], t, vocab);
  }
}

template <class T>
void embedding_cpu(const TensorView& out, const TensorView& table, const TensorView& ids) {
  const int32_t* id = ids.data_as<const int32_t>();
  for (int64_t t = 0; t < ids.size(0); ++t) {
    std::memcpy(at<T>(out, {t}), table.element_ptr({id[t]}), static_cast<size_t>(table.size(1)) * sizeof(T));
  }
}

// Rows are added in token order, so a repeated id sums its gradients deterministically.
template <class T>
void embedding_backward_cpu(const TensorView& d_table, const TensorView& d_out, const TensorView& ids) {
  const int32_t* id = ids.data_as<const int32_t>();
  for (int64_t t = 0; t < ids.size(0); ++t) {
    T* dst = at<T>(d_table, {id[t]});
    const T* src = at<const T>(d_out, {t});
    for (int64_t c = 0; c < d_table.size(1); ++c) dst[c] += src[c];
  }
}

}  // namespace

void embedding(const TensorView& out, const TensorView& table, const TensorView& ids) {
  HYDRA_ASSERT(table.stride(1) == 1 && out.stride(1) == 1, "embedding rows must be contiguous");
  check_ids(ids, table.size(0));
  with_host_float({{out, "embedding out"}, {table, "embedding table"}},
                  [&](auto zero) { embedding_cpu<decltype(zero)>(out, table, ids); });
}

void embedding_backward(const TensorView& d_table, const TensorView& d_out, const TensorView& ids) {
  HYDRA_ASSERT(d_table.stride(1) == 1 && d_out.stride(1) == 1, "embedding gradient rows must be contiguous");
  check_ids(ids, d_table.size(0));
  with_host_float({{d_table, "embedding d_table"}, {d_out, "embedding d_out"}},
                  [&](auto zero) { embedding_backward_cpu<decltype(zero)>(d_table, d_out, ids); });
}

}  // namespace hydra::ops::reference
