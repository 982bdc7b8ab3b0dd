// Dispatcher and CPU reference of the single-token delta-rule step (delta_rule_step.h).
#include "kernels/delta_rule/delta_rule_step.h"

#include <cmath>
#include <vector>

#include "kernels/common.h"

namespace hydra::ops {
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
                     const DeltaRuleParams& params) {
  expect_shape(k, "delta step k", {{"B", -1}, {"H", -1}, {"dk", -1}});
  const int64_t rows = k.size(0), heads = k.size(1), dk = k.size(2);
  expect_shape(q, "delta step q", {{"B", rows}, {"H", heads}, {"dk", dk}});
  expect_shape(v, "delta step v", {{"B", rows}, {"H", heads}, {"dv", -1}});
  const int64_t dv = v.size(2);
  expect_shape(out, "delta step out", {{"B", rows}, {"H", heads}, {"dv", dv}});
  expect_shape(g, "delta step g", {{"B", rows}, {"H", heads}});
  expect_shape(beta, "delta step beta", {{"B", rows}, {"H", heads}});
  expect_shape(state, "delta step state", {{"S", -1}, {"H", heads}, {"dk", dk}, {"dv", dv}});
  if (slots.defined()) {
    expect_shape(slots, "delta step slots", {{"B", rows}});
    expect_dtype(slots, "delta step slots", DType::i32);
  } else {
    HYDRA_ASSERT(state.size(0) >= rows, "delta step: {} rows without a slot map need as many slots (have {})", rows,
                 state.size(0));
  }
  const double scale = params.scale > 0 ? params.scale : 1.0 / std::sqrt(static_cast<double>(dk));
  if (shapes_only({out, state, slots, q, k, v, g, beta})) return;
  if (on_cuda({out, state, slots, q, k, v, g, beta})) {
#if HYDRA_CUDA
    cuda_impl::delta_rule_step(out, state, slots, q, k, v, g, beta, static_cast<float>(scale));
    return;
#endif
  }
  with_host_float({{out, "out"}, {state, "state"}, {q, "q"}, {k, "k"}, {v, "v"}, {g, "g"}, {beta, "beta"}},
                  [&](auto zero) { step_cpu<decltype(zero)>(out, state, slots, q, k, v, g, beta, scale); });
}

}  // namespace hydra::ops
