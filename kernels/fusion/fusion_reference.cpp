// The CPU reference of the head fusion and its backward (fusion.h), in fp64 per row; called by the
// entry points (fusion.cpp) for host tensors once shapes are checked.
#include "kernels/fusion/fusion_reference.h"

#include <cmath>
#include <vector>

#include "kernels/common.h"

namespace hydra::ops::reference {
namespace {

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// The per-(token, head) scale of the variant and the gate's σ: c = γ_h · 2σ(s + b) (1 where absent).
template <class T>
struct RowScale {
  double gamma = 1, sig = 0.5, gate = 1, c = 1;
  RowScale(const FusionTensors& p, int64_t t, int64_t h) {
    if (p.gamma.defined()) gamma = static_cast<double>(*at<const T>(p.gamma, {h}));
    if (p.gate.defined()) {
      sig = sigmoid(static_cast<double>(*at<const T>(p.gate, {t, h})) + static_cast<double>(*at<const T>(p.gate_bias, {h})));
      gate = 2 * sig;
    }
    c = gamma * gate;
  }
};

template <class T>
void head_fusion_cpu(const TensorView& y, const TensorView& o, const FusionTensors& p, const HeadFusionParams& params) {
  const int64_t t_len = o.size(0), heads = o.size(1), d = o.size(2);
  const bool norm = fusion_has_norm(params.fusion);
  for (int64_t t = 0; t < t_len; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      const T* x = at<const T>(o, {t, h});
      T* out = at<T>(y, {t, h});
      const T c = static_cast<T>(RowScale<T>(p, t, h).c);
      if (!norm) {
        for (int64_t i = 0; i < d; ++i) out[i] = c * x[i];
        continue;
      }
      const T* w = at<const T>(p.weight, {h});
      double ss = 0;
      for (int64_t i = 0; i < d; ++i) ss += static_cast<double>(x[i]) * x[i];
      const T inv = T(1) / std::sqrt(static_cast<T>(ss / static_cast<double>(d)) + static_cast<T>(params.eps));
      for (int64_t i = 0; i < d; ++i) out[i] = c * (w[i] * (x[i] * inv));
    }
  }
}

// Per (token, head), in fp64, with r = 1/sqrt(mean(o²) + eps), n = w ⊙ o r (o without a norm) and
// d_n = c d_y:
//   d_γ += g d_y · n,  d_s = γ (d_y · n) 2σ(1 − σ),  d_w += d_n ⊙ o r,
//   d_o = r w ⊙ d_n − o r³ mean(o ⊙ w ⊙ d_n)  (d_n without a norm).
// The row's sums are taken before d_o is written, so d_o may alias d_y.
template <class T>
void head_fusion_backward_cpu(const TensorView& d_o, const FusionTensors& grads, const TensorView& d_y,
                              const TensorView& o, const FusionTensors& p, const HeadFusionParams& params) {
  const int64_t t_len = o.size(0), heads = o.size(1), d = o.size(2);
  const bool norm = fusion_has_norm(params.fusion);
  std::vector<double> dw(static_cast<size_t>(heads * d), 0.0), dgamma(static_cast<size_t>(heads), 0.0);
  std::vector<double> dbias(static_cast<size_t>(heads), 0.0);
  for (int64_t t = 0; t < t_len; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      const T* x = at<const T>(o, {t, h});
      const T* dy = at<const T>(d_y, {t, h});
      const T* w = norm ? at<const T>(p.weight, {h}) : nullptr;
      T* dx = at<T>(d_o, {t, h});
      double* dwh = dw.data() + h * d;
      const RowScale<T> scale(p, t, h);
      const double c = scale.c;
      double ss = 0, ydn = 0, s = 0;  // Σ o², d_y · (w ⊙ o) (times r below), Σ o ⊙ w ⊙ d_n
      for (int64_t i = 0; i < d; ++i) {
        const double wi = norm ? static_cast<double>(w[i]) : 1.0;
        ss += static_cast<double>(x[i]) * x[i];
        ydn += static_cast<double>(dy[i]) * wi * x[i];
        s += static_cast<double>(x[i]) * wi * c * dy[i];
      }
      const double inv = norm ? 1.0 / std::sqrt(ss / static_cast<double>(d) + static_cast<double>(params.eps)) : 1.0;
      const double yn = ydn * inv;  // d_y · n
      dgamma[static_cast<size_t>(h)] += scale.gate * yn;
      if (fusion_has_gate(params.fusion)) {
        const double ds = scale.gamma * yn * 2 * scale.sig * (1 - scale.sig);
        dbias[static_cast<size_t>(h)] += ds;
        if (grads.gate.defined()) *at<T>(grads.gate, {t, h}) = static_cast<T>(ds);
      }
      const double k = inv * inv * inv * s / static_cast<double>(d);
      for (int64_t i = 0; i < d; ++i) {
        const double dn = c * dy[i], xi = x[i];
        if (!norm) {
          dx[i] = static_cast<T>(dn);
          continue;
        }
        dwh[i] += dn * xi * inv;
        dx[i] = static_cast<T>(inv * w[i] * dn - xi * k);
      }
    }
  }
  if (grads.weight.defined()) {
    for (int64_t h = 0; h < heads; ++h) {
      T* dwr = at<T>(grads.weight, {h});
      for (int64_t i = 0; i < d; ++i) dwr[i] += static_cast<T>(dw[static_cast<size_t>(h * d + i)]);
    }
  }
  if (grads.gamma.defined()) {
    for (int64_t h = 0; h < heads; ++h) *at<T>(grads.gamma, {h}) += static_cast<T>(dgamma[static_cast<size_t>(h)]);
  }
  if (grads.gate_bias.defined()) {
    for (int64_t h = 0; h < heads; ++h) *at<T>(grads.gate_bias, {h}) += static_cast<T>(dbias[static_cast<size_t>(h)]);
  }
}

}  // namespace

void head_fusion(const TensorView& y, const TensorView& o, const FusionTensors& p, const HeadFusionParams& params) {
  with_host_float({{y, "y"}, {o, "o"}, {p.weight, "weight"}, {p.gamma, "gamma"}, {p.gate, "gate"},
                   {p.gate_bias, "gate bias"}},
                  [&](auto zero) { head_fusion_cpu<decltype(zero)>(y, o, p, params); });
}

void head_fusion_backward(const TensorView& d_o, const FusionTensors& grads, const TensorView& d_y,
                          const TensorView& o, const FusionTensors& p, const HeadFusionParams& params) {
  with_host_float({{d_o, "d_o"}, {grads.weight, "d_weight"}, {grads.gamma, "d_gamma"}, {grads.gate, "d_gate"},
                   {grads.gate_bias, "d_gate_bias"}, {d_y, "d_y"}, {o, "o"}, {p.weight, "weight"},
                   {p.gamma, "gamma"}, {p.gate, "gate"}, {p.gate_bias, "gate bias"}},
                  [&](auto zero) { head_fusion_backward_cpu<decltype(zero)>(d_o, grads, d_y, o, p, params); });
}

}  // namespace hydra::ops::reference
