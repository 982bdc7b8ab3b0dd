// The CPU reference of the single-token delta-rule step (delta_rule_step.h), in fp64 per row; called
// by the entry point (delta_rule_step.cpp) for host tensors once shapes are checked.
#include "kernels/delta_rule/delta_rule_step_reference.h"

#include <cmath>
#include <vector>

#include "kernels/common.h"

namespace hydra::ops::reference {
namespace {

// Row b's slot: slots[b], or b when no map is given (host int32).
int64_t slot_of(const TensorView& slots, int64_t b) {
  return slots.defined() ? static_cast<int64_t>(*static_cast<const int32_t*>(slots.element_ptr({b}))) : b;
}

template <class T>
void step_cpu(const TensorView& out, const TensorView& state, const TensorView& slots, const TensorView& q,
              const TensorView& k, const TensorView& v, const TensorView& g, const TensorView& beta, double scale) {
  const int64_t rows = k.size(0), heads = k.size(1), dk = k.size(2), dv = v.size(2);
  std::vector<double> s(static_cast<size_t>(dk * dv)), delta(static_cast<size_t>(dv));
  for (int64_t b = 0; b < rows; ++b) {
    const int64_t slot = slot_of(slots, b);
    HYDRA_ASSERT(slot >= 0 && slot < state.size(0), "delta rule step: row {} maps to slot {} of {}", b, slot,
                 state.size(0));
    for (int64_t h = 0; h < heads; ++h) {
      const TensorView sh = state.select(0, slot).select(0, h);  // [dk, dv]
      for (int64_t i = 0; i < dk; ++i) {
        const T* row = at<const T>(sh, {i});
        for (int64_t j = 0; j < dv; ++j) s[static_cast<size_t>(i * dv + j)] = row[j];
      }
      const T* kt = at<const T>(k, {b, h});
      const T* vt = at<const T>(v, {b, h});
      const T* qt = at<const T>(q, {b, h});
      const double decay = std::exp(static_cast<double>(*at<const T>(g, {b, h})));
      const double bt = *at<const T>(beta, {b, h});
      for (double& x : s) x *= decay;
      for (int64_t j = 0; j < dv; ++j) {
        double kv = 0;
        for (int64_t i = 0; i < dk; ++i) kv += s[static_cast<size_t>(i * dv + j)] * kt[i];
        delta[static_cast<size_t>(j)] = bt * (vt[j] - kv);
      }
      for (int64_t i = 0; i < dk; ++i)
        for (int64_t j = 0; j < dv; ++j) s[static_cast<size_t>(i * dv + j)] += kt[i] * delta[static_cast<size_t>(j)];
      T* ot = at<T>(out, {b, h});
      for (int64_t j = 0; j < dv; ++j) {
        double o = 0;
        for (int64_t i = 0; i < dk; ++i) o += s[static_cast<size_t>(i * dv + j)] * qt[i];
        ot[j] = static_cast<T>(o * scale);
      }
      for (int64_t i = 0; i < dk; ++i) {
        T* row = at<T>(sh, {i});
        for (int64_t j = 0; j < dv; ++j) row[j] = static_cast<T>(s[static_cast<size_t>(i * dv + j)]);
      }
    }
  }
}

}  // namespace

void delta_rule_step(const TensorView& out, const TensorView& state, const TensorView& slots, const TensorView& q,
                     const TensorView& k, const TensorView& v, const TensorView& g, const TensorView& beta,
                     double scale) {
  with_host_float({{out, "out"}, {state, "state"}, {q, "q"}, {k, "k"}, {v, "v"}, {g, "g"}, {beta, "beta"}},
                  [&](auto zero) { step_cpu<decltype(zero)>(out, state, slots, q, k, v, g, beta, scale); });
}

}  // namespace hydra::ops::reference
