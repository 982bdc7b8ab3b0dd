// The CPU reference of the decode GEMV (gemv.h), called by its entry point (gemv.cpp) for host tensors
// once shapes are checked.
#include "kernels/gemv/gemv_reference.h"

#include "kernels/common.h"

namespace hydra::ops::reference {
namespace {

// The reference: each output one float64 sum over k in order, then the old value added (accumulate).
template <class T>
void gemv_cpu(const TensorView& out, const TensorView& x, const TensorView& w, Accumulate accumulate) {
  const int64_t m_len = out.size(0), n_len = out.size(1), k_len = x.size(1);
  for (int64_t m = 0; m < m_len; ++m) {
    const T* xr = at<const T>(x, {m});
    T* o = at<T>(out, {m});
    for (int64_t n = 0; n < n_len; ++n) {
      const T* wr = at<const T>(w, {n});
      double sum = 0;
      for (int64_t k = 0; k < k_len; ++k) sum += static_cast<double>(xr[k]) * static_cast<double>(wr[k]);
      if (accumulate == Accumulate::yes) sum += static_cast<double>(o[n]);
      o[n] = static_cast<T>(sum);
    }
  }
}

}  // namespace

void gemv(const TensorView& out, const TensorView& x, const TensorView& w, Accumulate accumulate) {
  with_host_float({{out, "gemv out"}, {x, "gemv x"}, {w, "gemv w"}},
                  [&](auto zero) { gemv_cpu<decltype(zero)>(out, x, w, accumulate); });
}

}  // namespace hydra::ops::reference
