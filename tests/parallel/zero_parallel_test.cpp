// ZeRO-1: the optimizer state spread over the world equals the replicated optimizer.
// Under mpirun with P = 1..4 ranks, two copies of one model train side by side for 20 steps on the
// same windows — one with --zero 0 (every gradient tensor all-reduced, every rank updating every
// parameter), one with --zero 1 (gradients reduce-scattered into the owners in buckets, each rank
// updating its 1/P of the flat fp32 state, weights all-gathered back) — over the whole world as one
// sequence group and, for even P, as 2 replicas of P/2 ranks (data × sequence parallel). Both forms
// add the ranks' gradients in one order (the same bucketed reduce-scatter; the replicated form then
// all-gathers the sums) and take the norm from the same per-rank sums of squares, so losses,
// gradient norms (clipping active), weights and the gathered state agree to 1e-10 relative in
// float64 and 1e-6 in float32 (an all-reduce per tensor in the replicated form gave 2.1e-5 in
// float32 weights: Adam's 1/sqrt(v) magnifies a last-bit difference of a near-zero gradient).
// A shard boundary that dropped or doubled an element, a bucket off by one or a norm missing a
// rank's range shows up as O(1e-3) or worse. The host's live-byte counter (runtime/host_memory.h)
// holds the sharded state to 12·N/P bytes plus one bucket no larger than the largest tensor.
#include <algorithm>
#include <cmath>

#include "model/memory_plan.h"
#include "model/model.h"
#include "model/params.h"
#include "model/train/objective.h"
#include "model/train/optimizer.h"
#include "model/train/trainer.h"
#include "model/train/training_plan.h"
#include "runtime/host_memory.h"
#include "tests/common/test_util.h"
#include "tests/parallel/parallel_test_util.h"

namespace hydra::test {
namespace {

std::vector<int32_t> window_ids(int64_t t, int64_t vocab, uint64_t salt) {
  std::vector<int32_t> ids(static_cast<size_t>(t));
  for (int64_t i = 0; i < t; ++i) {
    ids[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7919 + 13 + salt * 104729 + (i * i * salt) % 31) % vocab);
  }
  return ids;
}

struct Trained {
  std::vector<double> losses, norms;
};

// `steps` steps of one optimizer: replica r of the topology trains on window step·R + r.
Trained train_steps(SequenceGroups& topology, Model& model, train::AdamW& optimizer, int64_t t, int steps) {
  Communicator& seq = topology.sequence();
  const SequenceLayout layout = SequenceLayout::zigzag(t, seq.size(), seq.rank());
  const int replicas = topology.replicas();
  const double scale = 1.0 / static_cast<double>(replicas * (t - 1));
  Trained out;
  for (int step = 1; step <= steps; ++step) {
    optimizer.zero_grads();
    const uint64_t salt = static_cast<uint64_t>(step * replicas + topology.replica());
    const TokenRows rows = layout.token_rows(window_ids(t, model.config().vocab_size, salt));
    ForwardContext context{.comm = seq, .layout = layout};
    const train::LossSums local =
        train::sequence_gradients(context, model, rows, train::Objective::cross_entropy, scale, &optimizer.grads());
    optimizer.reduce_gradients();
    Tensor loss = Tensor::empty({1}, DType::f64);
    loss.data_as<double>()[0] = local.loss;
    all_reduce_sum_host(topology.world(), loss);
    const double norm = optimizer.grad_norm();
    optimizer.step(step, norm);
    out.losses.push_back(loss.data_as<double>()[0] * scale);
    out.norms.push_back(norm);
  }
  return out;
}

void expect_close(const NamedTensors& actual, const NamedTensors& expected, double tol, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  double worst = 0;
  for (const auto& [name, e] : expected) {
    ASSERT_TRUE(actual.count(name)) << what << ": " << name;
    const Tensor& a = actual.at(name);
    ASSERT_EQ(count_non_finite(to(a, Device::host, DType::f32)), 0) << what << ": " << name;
    const double err = norm_rel_error(a, e);
    EXPECT_LT(err, tol) << what << ": " << name;
    worst = std::max(worst, err);
  }
  if (world().rank() == 0) std::printf("%s: P=%d, worst relative difference %.3g\n", what.c_str(), world().size(), worst);
}

// `tol` bounds the losses; `tensor_tol` the gradient norms, weights and state (see the header).
void expect_zero_equals_replicated(DType dtype, double tol, double tensor_tol, int sp) {
  MpiCommunicator& comm = world();
  SequenceGroups topology(comm, sp);
  const ModelConfig config = preset_config("hydrahead-tiny");
  const NamedTensors params = random_parameters(config, 43);
  Model replicated_model(config, params, Device::host, dtype), sharded_model(config, params, Device::host, dtype);
  train::OptimizerConfig oc;
  oc.lr = 3e-3;
  oc.min_lr = 3e-4;
  oc.warmup = 3;
  oc.total_steps = 20;
  oc.grad_clip = 1.5;  // below the first steps' norms: the clip factor from the shards is exercised
  const auto all = [](const std::string&) { return true; };
  train::AdamW replicated(replicated_model, oc, all, &comm, train::Zero::replicated);
  train::AdamW sharded(sharded_model, oc, all, &comm, train::Zero::sharded);
  const int64_t t = SequenceLayout::granularity(topology.sp()) * 5;
  const Trained a = train_steps(topology, replicated_model, replicated, t, 20);
  const Trained b = train_steps(topology, sharded_model, sharded, t, 20);
  const std::string what = fmt::format("{} {} x {}", dtype_name(dtype), topology.replicas(), topology.sp());
  int clipped = 0;
  double worst_loss = 0, worst_norm = 0;
  for (size_t i = 0; i < a.losses.size(); ++i) {
    worst_loss = std::max(worst_loss, std::abs(b.losses[i] - a.losses[i]) / std::abs(a.losses[i]));
    worst_norm = std::max(worst_norm, std::abs(b.norms[i] - a.norms[i]) / a.norms[i]);
    clipped += a.norms[i] > oc.grad_clip ? 1 : 0;
  }
  if (comm.rank() == 0) {
    std::printf("%s: P=%d, 20 steps, worst relative difference: loss %.3g, gradient norm %.3g\n", what.c_str(),
                comm.size(), worst_loss, worst_norm);
  }
  EXPECT_LT(worst_loss, tol) << what << ": losses";
  EXPECT_LT(worst_norm, tensor_tol) << what << ": gradient norms";
  EXPECT_GT(clipped, 0) << what << ": no step was clipped; the test would not see the clip factor";
  {  // the 20 updates moved the weights well past the tolerance (the comparison below means something)
    const Model initial(config, params, Device::host, dtype);
    const NamedTensors before = initial.unpack(initial.weights()), after = replicated_model.unpack(replicated_model.weights());
    double moved = 0;
    for (const auto& [name, w] : before) moved = std::max(moved, norm_rel_error(after.at(name), w));
    EXPECT_GT(moved, 1e-3) << what << ": the weights did not move";
  }
  expect_close(sharded_model.unpack(sharded_model.weights()), replicated_model.unpack(replicated_model.weights()),
               tensor_tol, what + " weights");
  expect_close(sharded.state(), replicated.state(), tensor_tol, what + " state");
  expect_close(sharded.master_parameters(), replicated.master_parameters(), tensor_tol, what + " masters");
}

// fp32: every figure to 1e-6 relative (the bound; with one order of additions the two forms
// should agree bit for bit, and the printed worst differences say whether they do).
constexpr double kF32Tensors = 1e-6;
TEST(Zero, ShardedEqualsReplicatedF64) { expect_zero_equals_replicated(DType::f64, 1e-10, 1e-10, world().size()); }
TEST(Zero, ShardedEqualsReplicatedF32) { expect_zero_equals_replicated(DType::f32, 1e-6, kF32Tensors, world().size()); }
// Data × sequence parallel: 2 replicas of P/2 ranks for even P (P = 4: --sp 2), else P replicas of one.
int replica_sp() { return world().size() % 2 == 0 ? world().size() / 2 : 1; }
TEST(Zero, ShardedEqualsReplicatedDataParallelF64) {
  expect_zero_equals_replicated(DType::f64, 1e-10, 1e-10, replica_sp());
}
TEST(Zero, ShardedEqualsReplicatedDataParallelF32) {
  expect_zero_equals_replicated(DType::f32, 1e-6, kF32Tensors, replica_sp());
}

// A state saved by the replicated optimizer loads into the sharded one (each rank its range) and
// back: both forms then hold the same state and weights, bit for bit.
TEST(Zero, StateMovesBetweenFormsExactly) {
  MpiCommunicator& comm = world();
  SequenceGroups topology(comm, comm.size());
  const ModelConfig config = preset_config("hydrahead-tiny");
  const NamedTensors params = random_parameters(config, 44);
  Model a_model(config, params, Device::host, DType::f32), b_model(config, params, Device::host, DType::f32);
  const auto all = [](const std::string&) { return true; };
  train::AdamW a(a_model, {}, all, &comm, train::Zero::replicated);
  train::AdamW b(b_model, {}, all, &comm, train::Zero::sharded);
  train_steps(topology, a_model, a, SequenceLayout::granularity(comm.size()) * 3, 3);
  b.load_state(a.state());
  constexpr double kExact = 1e-300;  // a relative difference of 0: bit for bit
  expect_close(b.state(), a.state(), kExact, "state replicated -> sharded");
  expect_close(b_model.unpack(b_model.weights()), a_model.unpack(a_model.weights()), kExact, "weights replicated -> sharded");
  // And one more identical step on both keeps them equal (the moments and step count carried).
  const Trained ta = train_steps(topology, a_model, a, SequenceLayout::granularity(comm.size()) * 3, 1);
  const Trained tb = train_steps(topology, b_model, b, SequenceLayout::granularity(comm.size()) * 3, 1);
  EXPECT_NEAR(tb.losses[0], ta.losses[0], 1e-6 * ta.losses[0]);
  expect_close(b.state(), a.state(), 1e-6, "state after a step from the moved state");
}

// Bytes the optimizer holds per rank, from the host live-byte counter: with P ranks the masters and
// moments take 12·N/P bytes (fp32) and a step's buckets at most one tensor more; the gradient
// accumulators (4·N, every rank) are not optimizer state and are subtracted.
TEST(Zero, OptimizerBytesPerRank) {
  MpiCommunicator& comm = world();
  const int p = comm.size();
  SequenceGroups topology(comm, p);
  const ModelConfig config = preset_config("hydrahead-tiny");
  Model model(config, random_parameters(config, 45), Device::host, DType::f32);
  // allocate_storage rounds each block up to 64 bytes (runtime/tensor.h): the bounds allow that.
  const auto rounded = [](double bytes) { return std::ceil(bytes / 64) * 64; };
  double largest = 0, grad_bytes = 0;
  {
    const ModelTensors probe = model.zeros_like_weights(DType::f32);
    probe.for_each([&](const std::string&, const Tensor& t) {
      largest = std::max(largest, static_cast<double>(t.nbytes()));
      grad_bytes += rounded(static_cast<double>(t.nbytes()));
    });
  }
  const double before = static_cast<double>(host_tensor_stats().in_use);
  train::AdamW optimizer(model, {}, [](const std::string&) { return true; }, &comm, train::Zero::sharded);
  const double n = static_cast<double>(optimizer.trainable_parameters());
  const double held = static_cast<double>(host_tensor_stats().in_use) - before - grad_bytes;
  if (p == 1) {  // a world of one holds the replicated state: whole tensors, padding rows included
    EXPECT_EQ(held, 3 * grad_bytes) << "optimizer state of a world of one";
    EXPECT_EQ(optimizer_bytes(config, Device::host, DType::f32, 1), grad_bytes + held) << "the memory plan's optimizer";
    return;
  }
  const double rounding = 3 * 64;  // three blocks: masters, m, v
  EXPECT_LE(held, 12 * std::ceil(n / p) + rounding) << "optimizer state per rank";
  EXPECT_GE(held, 12 * std::floor(n / p) - 12) << "the counter missed the state";
  // A step's transient buffers: the reduce-scatter and all-gather buckets, measured apart from the
  // forward and backward (a first step leaves gradients to reduce).
  train_steps(topology, model, optimizer, SequenceLayout::granularity(p) * 3, 1);
  const double settled = static_cast<double>(host_tensor_stats().in_use);
  host_tensor_reset_peak();
  optimizer.reduce_gradients();
  const double reduce_peak = static_cast<double>(host_tensor_stats().peak) - settled;
  host_tensor_reset_peak();
  optimizer.step(2, optimizer.grad_norm());
  const double step_peak = static_cast<double>(host_tensor_stats().peak) - settled;
  EXPECT_LE(held + std::max(reduce_peak, step_peak), 12 * std::ceil(n / p) + largest + rounding + 2 * 64)
      << "state " << held << " + buckets " << std::max(reduce_peak, step_peak) << " bytes";
  // The training memory plan prices the same bytes: gradients, this rank's shard and the buckets
  // (the last rank's shard is shorter: the plan prices the first ranks').
  const double plan = optimizer_bytes(config, Device::host, DType::f32, p);
  const double measured = grad_bytes + held + std::max(reduce_peak, step_peak);
  if (comm.rank() + 1 < p) {
    EXPECT_EQ(plan, measured) << "the memory plan's optimizer bytes";
  }
  EXPECT_LE(measured, plan) << "the memory plan's optimizer bytes";
  if (comm.rank() == 0) {
    std::printf("optimizer bytes per rank, P=%d, N=%.0f: state %.0f (12N/P = %.0f), buckets %.0f (largest tensor %.0f)\n",
                p, n, held, 12 * n / p, std::max(reduce_peak, step_peak), largest);
  }
}

}  // namespace
}  // namespace hydra::test
