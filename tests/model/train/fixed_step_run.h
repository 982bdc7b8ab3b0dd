// A small hydra train run for the fixed-step tests (tests/model/train/fixed_step_test.cpp on the CPU,
// tests/model/cuda_train_graph_test.cpp on the GPU): token data whose loss mask counts a different
// number of targets in every window (so the step's gradient scale 1 / counted changes each step), a
// random model, and run_training in the StepMode asked for; returns the summary, the step lines'
// losses and the trained weights by checkpoint name (host f32), and the error that stopped the run.
// `poison`: a parameter whose first element starts as +inf (the first step's loss and gradient are
// then not finite); `save_every`: --save-every (-1: no checkpoint).
#pragma once

#include <limits>
#include <string>
#include <vector>

#include "model/model.h"
#include "model/params.h"
#include "model/train/trainer.h"
#include "parallel/self_communicator.h"
#include "runtime/token_file.h"
#include "tests/common/test_util.h"
#include "tests/launch/train_log.h"

namespace hydra::test {

struct FixedStepRun {
  train::TrainSummary summary;
  std::vector<double> losses;
  NamedTensors weights;
  std::vector<nlohmann::json> lines;
  std::string error;  // the UserError that stopped the run (empty: it ran to the end)
};

// Tokens for `steps` steps of batch_seqs × grad_accum windows of seq_len, the loss mask off for a
// share of the targets that differs from window to window (window w: every (w % 3 + 2)-th target off).
inline std::string write_masked_tokens(const std::string& path, int64_t tokens, int64_t seq_len, uint64_t seed) {
  const std::vector<int32_t> ids = random_tokens(tokens, 256, seed);
  std::vector<uint8_t> mask(ids.size(), 1);
  for (size_t i = 0; i < mask.size(); ++i) {
    const int64_t window = static_cast<int64_t>(i) / seq_len;
    if (static_cast<int64_t>(i) % (window % 3 + 2) == 0) mask[i] = 0;
  }
  write_token_data(path, ids, mask);
  return path;
}

inline FixedStepRun run_fixed_step(train::StepMode mode, const std::string& preset, Device device, DType dtype,
                                   const std::string& data, const std::string& out, int64_t steps, int64_t seq_len,
                                   int64_t batch_seqs, int64_t grad_accum, const std::string& poison = "",
                                   int64_t save_every = -1) {
  const ModelConfig config = preset_config(preset);
  NamedTensors params = random_parameters(config, 71);
  if (!poison.empty()) params.at(poison).data_as<float>()[0] = std::numeric_limits<float>::infinity();
  Model student(config, params, device, dtype);
  SelfCommunicator comm(device);
  SequenceGroups topology(comm, 1);
  train::TrainConfig c;
  c.stage = train::Stage::pretrain;
  c.data = {data};
  c.seq_len = seq_len;
  c.steps = steps;
  c.batch_seqs = batch_seqs;
  c.grad_accum = grad_accum;
  c.seed = 5;
  c.save_every = save_every;
  c.out_dir = out;
  c.optim.lr = 3e-3;
  c.step_mode = mode;
  FixedStepRun r;
  try {
    r.summary = train::run_training(c, topology, student, nullptr);
  } catch (const UserError& e) {
    r.error = e.what();
  }
  r.losses = losses(out);
  r.lines = log_lines(out);
  r.weights = student.unpack(student.weights());
  return r;
}

}  // namespace hydra::test
