// ops::DeviceUpdate (kernels/adamw/adamw.h) against the eager tail it replaces, on host tensors
// (tests/kernels/adamw_test.cpp) or on the GPU (tests/kernels/cuda_training_test.cpp, launched
// directly and replayed from a CUDA graph): two identical sets of blocks, one updated by
// sum_of_squares → sqrt → clip → adamw_update → zero_tensors with the host's scalars, the other by the
// device update reading its scalars from device buffers. Five steps with a learning rate and step
// that change every step, gradients large enough for the clip in some steps and not in others; then a
// step with an inf in a gradient (skipped: nothing changes, the gradients stay), a finite step after
// it (still skipped: the flag is sticky), and, with the flag cleared, a step whose loss sum is nan
// (skipped). Every value bit for bit.
#pragma once

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kernels/adamw/adamw.h"
#include "runtime/cuda_graph.h"
#include "tests/common/test_util.h"

namespace hydra::test {

inline void check_device_update(Device device, bool graph) {
  const std::vector<int64_t> sizes = {4099, 1, 300, 0, 1000};
  struct Set {
    std::vector<Tensor> master, m, v, grad;
    std::vector<Tensor> weight;  // bf16 on the GPU (the model's copy), f32 on the host; some undefined
    std::vector<ops::AdamWSlice> slices;
    std::vector<TensorView> grads;
  };
  const DType weight_dtype = device == Device::cuda ? DType::bf16 : DType::f32;
  auto make = [&](Set& s) {
    for (size_t i = 0; i < sizes.size(); ++i) {
      const int64_t n = sizes[i];
      s.master.push_back(to(random_tensor({n}, 300 + i), device, DType::f32));
      s.m.push_back(Tensor::zeros({n}, DType::f32, device));
      s.v.push_back(Tensor::zeros({n}, DType::f32, device));
      s.grad.push_back(Tensor::zeros({n}, DType::f32, device));
      s.weight.push_back(i % 2 == 0 ? Tensor::zeros({n}, weight_dtype, device) : Tensor());
    }
    for (size_t i = 0; i < sizes.size(); ++i) {
      s.slices.push_back({s.master[i], s.m[i], s.v[i], s.grad[i], s.weight[i], i != 2});  // block 2: no decay
      s.grads.push_back(s.grad[i]);
    }
  };
  Set eager, dev;
  make(eager);
  make(dev);
  const ops::AdamWParams fixed{.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
  const double clip = 40.0;
  ops::DeviceUpdate update(dev.slices, dev.grads, dev.grads, fixed, clip, device);
  Tensor sums = Tensor::zeros({2, 2}, DType::f64, device), result = Tensor::zeros({3}, DType::f64, device);
  CudaGraph captured;
  auto same = [&](const std::vector<Tensor>& a, const std::vector<Tensor>& b, const std::string& what) {
    for (size_t i = 0; i < a.size(); ++i) {
      if (!a[i].defined()) continue;
      const Tensor ha = to(a[i], Device::host, a[i].dtype()), hb = to(b[i], Device::host, b[i].dtype());
      EXPECT_EQ(std::memcmp(ha.data(), hb.data(), ha.nbytes()), 0) << what << " of block " << i;
    }
  };
  bool clipped = false, unclipped = false, skipped_once = false;
  for (int64_t step = 1; step <= 8; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    // Gradients: scaled so that some steps clip (norm > 40) and some do not.
    const float scale = step % 2 == 0 ? 2.0f : 0.01f;
    for (size_t i = 0; i < sizes.size(); ++i) {
      Tensor g = random_tensor({sizes[i]}, 400 + 10 * step + i, scale);
      if (step == 6 && i == 0) g.data_as<float>()[7] = std::numeric_limits<float>::infinity();
      copy_into(eager.grad[i], g);
      copy_into(dev.grad[i], g);
    }
    Tensor host_sums = Tensor::zeros({2, 2}, DType::f64, Device::host);
    host_sums.data_as<double>()[0] = 3.5 * step;
    host_sums.data_as<double>()[2] = step == 8 ? std::nan("") : 1.25;
    copy_into(sums, host_sums);
    if (step == 8) copy_into(result, Tensor::zeros({3}, DType::f64, Device::host));  // the flag cleared
    const float lr = 1e-2f / static_cast<float>(step);
    // The eager tail (the trainer's order).
    const double norm = std::sqrt(ops::sum_of_squares(eager.grads));
    // Skipped: step 6 (an inf gradient), 7 (finite, but the flag is sticky), 8 (the flag cleared, a nan loss).
    const bool finite = step < 6;
    EXPECT_EQ(std::isfinite(norm), step != 6);
    if (finite) {
      ops::AdamWParams p = fixed;
      p.lr = lr;
      p.step = step;
      p.grad_scale = norm > clip ? static_cast<float>(clip / norm) : 1.0f;
      (norm > clip ? clipped : unclipped) = true;
      ops::adamw_update(eager.slices, p);
      ops::zero_tensors(eager.grads);
    }
    // The device tail: the schedule written, then launched (or replayed: captured at step 2).
    update.write_schedule(lr, step);
    if (graph && step >= 2) {
      if (step == 2) captured.capture([&] { update.launch(sums, result); });
      captured.launch();
    } else {
      update.launch(sums, result);
    }
    const Tensor r = to(result, Device::host, DType::f64);
    const double* out = r.data_as<double>();
    if (finite) {
      EXPECT_EQ(std::memcmp(&out[ops::DeviceUpdate::kNorm], &norm, sizeof norm), 0) << out[0] << " vs " << norm;
      EXPECT_EQ(out[ops::DeviceUpdate::kSkipped], 0.0);
      EXPECT_EQ(out[ops::DeviceUpdate::kClip], norm > clip ? static_cast<float>(clip / norm) : 1.0);
    } else {
      EXPECT_EQ(out[ops::DeviceUpdate::kSkipped], 1.0);
      skipped_once = true;
    }
    same(dev.master, eager.master, "master");
    same(dev.m, eager.m, "m");
    same(dev.v, eager.v, "v");
    same(dev.weight, eager.weight, "weight");
    same(dev.grad, eager.grad, "gradient (zeroed, or left when skipped)");
  }
  EXPECT_TRUE(clipped && unclipped && skipped_once) << "the steps must clip, not clip and skip";
}

}  // namespace hydra::test
