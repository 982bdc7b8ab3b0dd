// Sequence- and data-parallel gradients equal one process's. Under mpirun with P ranks:
//  - every parameter's gradient of the mean next-token loss of one sequence spread over the P
//    ranks (zigzag layout: ring-attention backward for the FA heads, the GDN state-gradient fold
//    across segments, conv halo gradients) equals the gradient the same rank computes alone;
//  - data × sequence parallel: the world split into replicas of `sp` ranks, each replica on its own
//    window, gradients summed over the world, equals one process summing both windows.
// Models run on the host in float64, so the only difference between the layouts is the order of
// sums: the bound is 1e-10 relative (‖g_P − g_1‖ / ‖g_1‖); a wrong halo row, a missing fold step or
// a ring step off by one shows up as O(1e-2) or worse. A float32 run checks the production path
// to 1e-5.
#include <algorithm>
#include <cmath>

#include "model/model.h"
#include "model/params.h"
#include "model/train/objective.h"
#include "model/train/trainer.h"
#include "parallel/mpi_communicator.h"
#include "parallel/self_communicator.h"
#include "tests/common/test_util.h"
#include "tests/parallel/parallel_test_util.h"

namespace hydra::test {
namespace {

std::vector<int32_t> token_ids(int64_t t, int64_t vocab, uint64_t salt) {
  return strided_ids(t, vocab, 7919, 13 + static_cast<int64_t>(salt) * 101);
}

void expect_same_gradients(const NamedTensors& parallel, const NamedTensors& single, double tol, const std::string& what) {
  ASSERT_EQ(parallel.size(), single.size()) << what;
  double worst = 0;
  for (const auto& [name, g1] : single) {
    ASSERT_TRUE(parallel.count(name)) << what << ": " << name;
    const Tensor& gp = parallel.at(name);
    ASSERT_EQ(count_non_finite(to(gp, Device::host, DType::f32)), 0) << what << ": " << name;
    const double err = norm_rel_error(gp, g1);
    EXPECT_LT(err, tol) << what << ": gradient of " << name;
    worst = std::max(worst, err);
  }
  if (world().rank() == 0) std::printf("%s: P=%d, worst gradient relative error %.3g\n", what.c_str(), world().size(), worst);
}

// Lengths the zigzag layout admits for P ranks, one with segments that are not multiples of 64.
std::vector<int64_t> lengths_for(int p) { return admissible_lengths(p, {5, 37}); }

// A loss mask with runs and gaps whose counted targets fall in every zigzag segment and on segment
// edges (runtime/token_file.h: flag i belongs to the target token i).
std::vector<uint8_t> mask_for(int64_t t, uint64_t salt) {
  std::vector<uint8_t> m(static_cast<size_t>(t));
  for (int64_t i = 0; i < t; ++i) m[static_cast<size_t>(i)] = ((i + static_cast<int64_t>(salt)) % 5 < 2 || i % 11 == 0) ? 1 : 0;
  return m;
}

enum class Masked { no, yes };

void expect_sequence_parallel_equal_single(const ModelConfig& config, DType dtype, double tol, const std::string& what,
                                           Masked masked = Masked::no) {
  MpiCommunicator& comm = world();
  const Model model(config, random_parameters(config, 31), Device::host, dtype);
  SelfCommunicator self;
  for (int64_t t : lengths_for(comm.size())) {
    const std::vector<int32_t> ids = token_ids(t, config.vocab_size, 0);
    const std::vector<uint8_t> mask = masked == Masked::yes ? mask_for(t, 0) : std::vector<uint8_t>{};
    const train::NamedGradients single = train::next_token_gradients(self, model, ids, mask);
    const train::NamedGradients parallel = train::next_token_gradients(comm, model, ids, mask);
    EXPECT_EQ(parallel.sums.tokens, mask.empty() ? t - 1 : std::count(mask.begin() + 1, mask.end(), 1));
    EXPECT_NEAR(parallel.sums.loss, single.sums.loss, tol * std::abs(single.sums.loss)) << what;
    expect_same_gradients(parallel.grads, single.grads, tol, what + " T=" + std::to_string(t));
  }
}

ModelConfig layerwise_hybrid() {
  ModelConfig c = preset_config("qwen3-tiny");
  c.arch = Arch::hydrahead;
  c.num_layers = 4;
  c.fa_heads = {{0, 1, 2, 3}, {}, {}, {}};  // one all-FA layer, three all-GDN layers
  return c;
}

TEST(Gradients, HydraHeadEqualSingleProcessF64) {
  expect_sequence_parallel_equal_single(preset_config("hydrahead-tiny"), DType::f64, 1e-10, "hydrahead-tiny f64");
}

TEST(Gradients, LayerwiseHybridEqualSingleProcessF64) {
  expect_sequence_parallel_equal_single(layerwise_hybrid(), DType::f64, 1e-10, "layer-wise hybrid f64");
}

// Every fusion variant but the default (which the tests above run): the gate's logit gradients
// reach u and x̂ through the projection's backward on each rank's own rows.
TEST(Gradients, FusionVariantsEqualSingleProcessF64) {
  for (const ops::Fusion fusion : {ops::Fusion::gate, ops::Fusion::concat, ops::Fusion::norm, ops::Fusion::scale}) {
    ModelConfig c = preset_config("hydrahead-tiny");
    c.fusion = fusion;
    expect_sequence_parallel_equal_single(c, DType::f64, 1e-10, std::string("hydrahead-tiny fusion ") + ops::fusion_name(fusion));
  }
}

TEST(Gradients, TeacherEqualSingleProcessF64) {
  expect_sequence_parallel_equal_single(preset_config("qwen3-tiny"), DType::f64, 1e-10, "qwen3-tiny f64");
}

TEST(Gradients, MaskedHydraHeadEqualSingleProcessF64) {
  expect_sequence_parallel_equal_single(preset_config("hydrahead-tiny"), DType::f64, 1e-10, "hydrahead-tiny masked f64",
                                        Masked::yes);
}

TEST(Gradients, MaskedTeacherEqualSingleProcessF64) {
  expect_sequence_parallel_equal_single(preset_config("qwen3-tiny"), DType::f64, 1e-10, "qwen3-tiny masked f64",
                                        Masked::yes);
}

TEST(Gradients, HydraHeadEqualSingleProcessF32) {
  expect_sequence_parallel_equal_single(preset_config("hydrahead-tiny"), DType::f32, 1e-5, "hydrahead-tiny f32");
}

// Data × sequence parallel: P even → 2 replicas of P/2 ranks; P odd → P replicas of one rank. The
// parallel run keeps the GDN outputs and the projection for the backward (as hydra train does when
// they fit), the single process recomputes them: both must give the same gradients. With loss masks
// every window has its own mask and the scale is 1 / the step's global count of counted targets
// (what hydra train divides by), known to every rank before the forward.
void expect_data_times_sequence_parallel_equal_single(Masked masked) {
  MpiCommunicator& comm = world();
  const int p = comm.size();
  const int sp = p % 2 == 0 ? p / 2 : 1;
  SequenceGroups topology(comm, sp);
  ASSERT_EQ(topology.replicas() * topology.sp(), p);
  const ModelConfig config = preset_config("hydrahead-tiny");
  const Model model(config, random_parameters(config, 32), Device::host, DType::f64);
  const int64_t t = SequenceLayout::granularity(sp) * 9;
  const int replicas = topology.replicas();

  // Window w: tokens salted by w; the last token without a target; its own mask.
  auto mask_of = [&](int w) { return masked == Masked::yes ? mask_for(t, static_cast<uint64_t>(w)) : std::vector<uint8_t>{}; };
  auto rows_of = [&](const SequenceLayout& layout, int w) {
    const std::vector<int32_t> global = token_ids(t, config.vocab_size, static_cast<uint64_t>(w + 1));
    const std::vector<uint8_t> mask = mask_of(w);
    return layout.token_rows(global, {.counted = mask, .answer = {}});
  };
  int64_t counted = 0;
  for (int w = 0; w < replicas; ++w) {
    const std::vector<uint8_t> mask = mask_of(w);
    counted += mask.empty() ? t - 1 : std::count(mask.begin() + 1, mask.end(), 1);
  }
  const double scale = 1.0 / static_cast<double>(counted);

  // One process, every window.
  SelfCommunicator self;
  ModelTensors single = model.zeros_like_weights(model.acc_dtype());
  int64_t single_tokens = 0;
  for (int w = 0; w < replicas; ++w) {
    const SequenceLayout layout = SequenceLayout::zigzag(t, 1, 0);
    ForwardContext context{.comm = self, .layout = layout};
    single_tokens +=
        train::sequence_gradients(context, model, rows_of(layout, w), train::Objective::cross_entropy, scale, &single).tokens;
  }
  EXPECT_EQ(single_tokens, counted);
  // The world: replica r on window r, its sequence spread over its sp ranks.
  ModelTensors parallel = model.zeros_like_weights(model.acc_dtype());
  {
    Communicator& seq = topology.sequence();
    const SequenceLayout layout = SequenceLayout::zigzag(t, seq.size(), seq.rank());
    // Kept activations (layer 0 also keeps its MLP gate/up, layer 1 recomputes it) against the
    // single process, which recomputes everything: the same gradients.
    ForwardContext context{
        .comm = seq, .layout = layout, .keep = {.gdn_outputs = true, .projection = true, .mlp_layers = 1}};
    train::sequence_gradients(context, model, rows_of(layout, topology.replica()), train::Objective::cross_entropy, scale,
                              &parallel);
  }
  train::all_reduce_gradients(comm, parallel);
  expect_same_gradients(model.unpack(parallel), model.unpack(single), 1e-10,
                        std::string(masked == Masked::yes ? "masked " : "") + "data x sequence parallel (" +
                            std::to_string(replicas) + " x " + std::to_string(sp) + ")");
}

TEST(Gradients, DataTimesSequenceParallelEqualSingleProcess) {
  expect_data_times_sequence_parallel_equal_single(Masked::no);
}

TEST(Gradients, MaskedDataTimesSequenceParallelEqualSingleProcess) {
  expect_data_times_sequence_parallel_equal_single(Masked::yes);
}

}  // namespace
}  // namespace hydra::test
