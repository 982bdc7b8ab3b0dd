// AdamW with decoupled weight decay on fp32 master weights (DESIGN.md §1.5), and the sum of squares the
// global gradient-norm clip needs. Both work on flat fp32 buffers so one launch covers a tensor.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "runtime/tensor.h"

namespace hydra::ops {

struct AdamWParams {
  float lr = 0.0f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;  // decoupled: master ← master − lr·wd·master, before the Adam step
  int64_t step = 1;           // 1-based, for the bias corrections 1 − β^step
  float grad_scale = 1.0f;    // multiplies the gradient first (the global-norm clip factor)
};

// One step on a block of N parameters: g = grad_scale·grad; m ← β1 m + (1−β1) g; v ← β2 v + (1−β2) g²;
// master ← master (1 − lr·wd) − lr m̂ / (sqrt(v̂) + eps) with m̂ = m/(1−β1^step), v̂ = v/(1−β2^step);
// then weight ← master (rounded to weight's dtype). master, m, v, grad: [N] fp32 contiguous;
// weight [N] fp32 or bf16, may alias master, or undefined (no model copy).
void adamw_update(const TensorView& master, const TensorView& m, const TensorView& v, const TensorView& grad,
                  const TensorView& weight, const AdamWParams& params);

// The same step on a list of blocks in one launch on the GPU (the optimizer's ~35–450 segments): each
// block with its own buffers and weight decay (`decay`: params.weight_decay applies, else none),
// bit-identical to calling adamw_update on each. On the CPU, adamw_update on each in turn.
struct AdamWSlice {
  TensorView master, m, v, grad, weight;
  bool decay = true;
};
void adamw_update(std::span<const AdamWSlice> slices, const AdamWParams& params);

// Zeroes every tensor of the list (contiguous fp32; on the GPU one launch for all of them).
void zero_tensors(std::span<const TensorView> xs);

// The optimizer's tail as device work that reads nothing back (a training step replayed as a CUDA
// graph, DESIGN.md §1.5 "The step as a CUDA graph"): Σ g² → ‖g‖ → clip scale → non-finite guard →
// AdamW → zeroed gradients, the tables of its list launches uploaded once at construction, the
// values that change every step read from device scalars. Bit-identical to the eager tail (the
// optimizer's grad_norm(), step() and zero_grads()): the same kernels, the norm's sum in the same
// order (sum_of_squares below), the clip scale formed in fp64 as the host forms it, and the step's
// scalars written by the host with the eager update's own arithmetic (write_schedule). On the CPU
// (host tensors) launch() runs the same steps at once through the reference ops.
class DeviceUpdate {
 public:
  // Slots of result() ([3] f64): the gradient norm, the clip scale applied (a float's value), and
  // "skipped": 1 once a step's summed loss or norm is not finite — that step and every later one
  // launched on the same result buffer (the flag is sticky; the caller may write 0 to clear it)
  // update nothing and leave the gradients as they are (the eager trainer stops before the update;
  // the host reads the flag a step late and stops the same way, with the weights the eager one left).
  enum Slot : int64_t { kNorm = 0, kClip = 1, kSkipped = 2, kResultSlots = 3 };

  // slices: the update's blocks (as adamw_update takes them); norm_of: the gradient pieces whose
  // Σ x² is the norm, in order; zero: the gradients zeroed after the update. `fixed`: beta1, beta2,
  // eps and weight_decay (lr and step come from write_schedule); grad_clip 0: no clipping.
  DeviceUpdate(std::span<const AdamWSlice> slices, std::span<const TensorView> norm_of, std::span<const TensorView> zero,
               const AdamWParams& fixed, double grad_clip, Device device);
  ~DeviceUpdate();
  DeviceUpdate(const DeviceUpdate&) = delete;
  DeviceUpdate& operator=(const DeviceUpdate&) = delete;

  // The step's lr and step number into the device scalars, queued on the current stream before the
  // launch that reads them (an upload in stream order; outside a graph capture).
  void write_schedule(float lr, int64_t step);
  // Queues the tail. loss_sums: [G, 2] f64 (Σ loss, Σ answer loss of each micro-batch, the fixed
  // step's); the summed loss ((0 + s_0) + s_1 + …, the trainer's order) must be finite. result:
  // [3] f64 on the device (Slot), written; its kSkipped is read first (sticky).
  void launch(const TensorView& loss_sums, const TensorView& result) const;

 private:
  std::vector<AdamWSlice> slices_;
  std::vector<TensorView> norm_of_, zero_;
  AdamWParams fixed_;
  double grad_clip_ = 0;
  Device device_;
  Tensor schedule_;  // [5] f64 on `device`: lr, step, 1 − β1^step, 1 − β2^step, 1 − lr·wd (float values)
  void* tables_ = nullptr;  // cuda_impl::DeviceUpdateTables (adamw.cu): the list tables and scratch; null on the CPU
};

// The GPU update's scalars, formed on the host by one piece of code for every form of the update (the
// single and list kernels, DeviceUpdate's schedule), so they are the same floats: the bias correction
// 1 − β^step (in fp64, rounded to float) and the decay factor 1 − lr·weight_decay (in float).
float adamw_bias_correction(float beta, int64_t step);
float adamw_decay_factor(float lr, float weight_decay);

// Σ x² of an fp32 tensor, accumulated in fp64 in a fixed order (the same result every run).
double sum_of_squares(const TensorView& x);
// Σ over the tensors of each one's sum_of_squares, added in the order given (the same value as
// adding the single-tensor results in a loop); on the GPU one synchronisation for all of them.
double sum_of_squares(std::span<const TensorView> xs);

#if HYDRA_CUDA
namespace cuda_impl {  // adamw.cu
void adamw_update(const TensorView& master, const TensorView& m, const TensorView& v, const TensorView& grad,
                  const TensorView& weight, const AdamWParams& params);
double sum_of_squares(const TensorView& x);
double sum_of_squares(std::span<const TensorView> xs);
void adamw_update(std::span<const AdamWSlice> slices, const AdamWParams& params);
void zero_tensors(std::span<const TensorView> xs);
struct DeviceUpdateTables;
DeviceUpdateTables* make_device_update(std::span<const AdamWSlice> slices, std::span<const TensorView> norm_of,
                                       std::span<const TensorView> zero);
void free_device_update(DeviceUpdateTables* tables);
void launch_device_update(const DeviceUpdateTables& tables, const AdamWParams& fixed, double grad_clip,
                          const TensorView& schedule, const TensorView& loss_sums, const TensorView& result);
}  // namespace cuda_impl
#endif

}  // namespace hydra::ops
