// The CPU reference of the causal depthwise conv + SiLU and its backward (conv.h), called by the entry
// points (conv.cpp) for host tensors once shapes are checked.
#include "kernels/conv/conv_reference.h"

#include <cmath>
#include <vector>

#include "kernels/common.h"

namespace hydra::ops::reference {
namespace {

// Input row `src` (may be negative: a halo row from prefix, or null for a zero row).
template <class T>
const T* input_row(const TensorView& x, const TensorView& prefix, int64_t src, int64_t kernel) {
  if (src >= 0) return at<const T>(x, {src});
  if (prefix.defined() && src + kernel - 1 >= 0) return at<const T>(prefix, {src + kernel - 1});
  return nullptr;
}

// Row pointers of the input with its halo: rows[src + K − 1] for src in [−(K − 1), T). Looked up
// once a call, not once an element (per element, the lookups made a 1-rank CPU NIAH evaluation
// take 0.89 s of CPU where it now takes 0.70).
template <class T>
std::vector<const T*> input_rows(const TensorView& x, const TensorView& prefix, int64_t kernel) {
  std::vector<const T*> rows(static_cast<size_t>(x.size(0) + kernel - 1));
  for (int64_t src = -(kernel - 1); src < x.size(0); ++src) {
    rows[static_cast<size_t>(src + kernel - 1)] = input_row<T>(x, prefix, src, kernel);
  }
  return rows;
}

template <class T>
T tap(const T* row, int64_t c) {
  return row ? row[c] : T(0);
}

template <class T>
void conv_cpu(const TensorView& out, const TensorView& x, const TensorView& w, const TensorView& prefix) {
  const int64_t t_len = x.size(0), channels = x.size(1), kernel = w.size(1);
  const std::vector<const T*> rows = input_rows<T>(x, prefix, kernel);
  const T* w0 = channels > 0 ? at<const T>(w, {0}) : nullptr;
  const int64_t w_stride = w.stride(0);
  for (int64_t i = 0; i < t_len; ++i) {
    T* o = at<T>(out, {i});
    const T* const* in = rows.data() + i;  // in[m]: input row i − K + 1 + m
    for (int64_t c = 0; c < channels; ++c) {
      const T* wc = w0 + c * w_stride;
      T acc = T(0);
      for (int64_t m = 0; m < kernel; ++m) acc += wc[m] * tap(in[m], c);
      o[c] = acc / (T(1) + std::exp(-acc));
    }
  }
}

// Per channel c: recompute a_i and d_a_i = d_out_i SiLU'(a_i) (fp64), then scatter through the taps.
// Row i reads input row src = i − K + 1 + m through tap m; src < 0 is halo row src + K − 1. A
// channel's inputs are all read before its dx column is written, so dx may alias d_out or x.
template <class T>
void conv_backward_cpu(const TensorView& dx, const TensorView& dw, const TensorView& d_prefix, const TensorView& d_out,
                       const TensorView& x, const TensorView& w, const TensorView& prefix) {
  const int64_t t_len = x.size(0), channels = x.size(1), kernel = w.size(1), halo = kernel - 1;
  const std::vector<const T*> rows = input_rows<T>(x, prefix, kernel);
  std::vector<const T*> d_out_rows(static_cast<size_t>(t_len));
  std::vector<T*> dx_rows(static_cast<size_t>(t_len));
  for (int64_t i = 0; i < t_len; ++i) {
    d_out_rows[static_cast<size_t>(i)] = at<const T>(d_out, {i});
    dx_rows[static_cast<size_t>(i)] = at<T>(dx, {i});
  }
  std::vector<double> d_a(static_cast<size_t>(t_len)), dxc(static_cast<size_t>(t_len + halo));
  for (int64_t c = 0; c < channels; ++c) {
    const T* wc = at<const T>(w, {c});
    for (int64_t i = 0; i < t_len; ++i) {
      const T* const* in = rows.data() + i;
      T acc = T(0);  // as the forward computes it
      for (int64_t m = 0; m < kernel; ++m) acc += wc[m] * tap(in[m], c);
      const double a = acc, s = 1.0 / (1.0 + std::exp(-a));
      d_a[static_cast<size_t>(i)] = static_cast<double>(d_out_rows[static_cast<size_t>(i)][c]) * s * (1.0 + a * (1.0 - s));
    }
    // dxc[src + halo] = Σ_m w[c][m] d_a[src − m + halo]; dw[c][m] += Σ_i d_a[i] x[i − K + 1 + m].
    std::fill(dxc.begin(), dxc.end(), 0.0);
    for (int64_t m = 0; m < kernel; ++m) {
      double dwm = 0;
      for (int64_t i = 0; i < t_len; ++i) {
        const int64_t src = i - halo + m;
        dxc[static_cast<size_t>(src + halo)] += static_cast<double>(wc[m]) * d_a[static_cast<size_t>(i)];
        dwm += d_a[static_cast<size_t>(i)] * static_cast<double>(tap(rows[static_cast<size_t>(src + halo)], c));
      }
      if (dw.defined()) {
        T* dwc = at<T>(dw, {c, m});
        *dwc = static_cast<T>(*dwc + dwm);
      }
    }
    for (int64_t j = 0; j < t_len; ++j) dx_rows[static_cast<size_t>(j)][c] = static_cast<T>(dxc[static_cast<size_t>(j + halo)]);
    if (d_prefix.defined()) {
      for (int64_t p = 0; p < halo; ++p) at<T>(d_prefix, {p})[c] = static_cast<T>(dxc[static_cast<size_t>(p)]);
    }
  }
}

}  // namespace

void causal_conv_silu(const TensorView& out, const TensorView& x, const TensorView& w, const TensorView& prefix) {
  HYDRA_ASSERT(out.data() != x.data(), "causal_conv_silu cannot run in place");
  with_host_float({{out, "conv out"}, {x, "conv x"}, {w, "conv weight"}, {prefix, "conv prefix"}},
                  [&](auto zero) { conv_cpu<decltype(zero)>(out, x, w, prefix); });
}

void causal_conv_silu_backward(const TensorView& dx, const TensorView& dw, const TensorView& d_prefix,
                               const TensorView& d_out, const TensorView& x, const TensorView& w,
                               const TensorView& prefix) {
  with_host_float({{dx, "conv dx"}, {dw, "conv dw"}, {d_prefix, "conv d_prefix"}, {d_out, "conv d_out"},
                   {x, "conv x"}, {w, "conv weight"}, {prefix, "conv prefix"}},
                  [&](auto zero) { conv_backward_cpu<decltype(zero)>(dx, dw, d_prefix, d_out, x, w, prefix); });
}

}  // namespace hydra::ops::reference
