// hydra convert --calib --device cuda: the teacher's head RMS (γ) and the scale fusion's layer-by-layer
// γ measured on the GPU (bf16 weights and activations) against the CPU path (fp32) on the same
// bf16-rounded weights, over windows with document starts inside them. RMS sums over thousands of
// bf16 values, so the two agree to a few parts in a thousand; 2e-2 leaves room for 3 layers of bf16
// rounding (tests/model/cuda_model_test.cpp's logits take 5e-2). SKIPPED without a GPU.
#include <cmath>

#include <fmt/format.h>

#include "model/convert.h"
#include "model/fa_heads_file.h"
#include "model/params.h"
#include "parallel/self_communicator.h"
#include "tests/common/test_util.h"

namespace hydra::test {
namespace {

void expect_gammas_close(const std::vector<std::vector<double>>& got, const std::vector<std::vector<double>>& want,
                         double tolerance, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t l = 0; l < want.size(); ++l) {
    ASSERT_EQ(got[l].size(), want[l].size()) << what;
    for (size_t h = 0; h < want[l].size(); ++h) {
      EXPECT_GT(want[l][h], 0.0) << what << " layer " << l << " head " << h;
      EXPECT_NEAR(got[l][h], want[l][h], tolerance * want[l][h]) << what << " layer " << l << " head " << h;
    }
  }
}

TEST(CudaConvert, CalibrationOnTheGpuMatchesTheCpu) {
  HYDRA_REQUIRE_GPU();
  ModelConfig tc = preset_config("qwen3-tiny");
  tc.num_layers = 3;
  const NamedTensors teacher = random_parameters(tc, 5);
  NamedTensors rounded;
  for (const auto& [name, t] : teacher) rounded.emplace(name, rounded_to_bf16(t));
  // Three windows of 256: documents start at 100 in the first and at 0 and 60 in the third.
  CalibrationWindows calib{.seq_len = 256, .windows = 3};
  for (int64_t i = 0; i < calib.tokens(); ++i) calib.ids.push_back(static_cast<int32_t>((i * 37 + 11) % tc.vocab_size));
  calib.document_starts = {{0, 100}, {}, {0, 60}};
  SelfCommunicator host, device(Device::cuda);
  const Model cpu_teacher(tc, rounded), gpu_teacher(tc, teacher, Device::cuda, DType::bf16);
  const auto want = measure_head_rms(cpu_teacher, host, calib);
  const auto got = measure_head_rms(gpu_teacher, device, calib);
  expect_gammas_close(got, want, 2e-2, "teacher head RMS");
  // The scale fusion's γ, layer by layer over the same windows.
  const ModelConfig sc = student_config(tc, resolve_fa_heads("uniform:1", tc, ""), ops::Fusion::scale);
  NamedTensors student;
  for (const auto& [name, t] : convert_parameters(tc, rounded, sc, 1, {})) student.emplace(name, rounded_to_bf16(t));
  const Model cpu_student(sc, student), gpu_student(sc, student, Device::cuda, DType::bf16);
  expect_gammas_close(calibrate_scale_gamma(gpu_student, device, calib, want),
                      calibrate_scale_gamma(cpu_student, host, calib, want), 2e-2, "scale γ");
}

}  // namespace
}  // namespace hydra::test
