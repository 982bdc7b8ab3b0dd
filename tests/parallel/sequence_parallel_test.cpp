// Sequence parallelism across MPI ranks (DESIGN.md §3). Every rank builds the same global
// inputs from a seed, runs the distributed op on its zigzag rows, and compares them with the same
// rows of a single-process run it computes itself. Runs under mpirun with P = 1, 2, 3, 4.
// Tolerance 1e-5 relative (fp32; only summation order differs between the layouts).
#include <limits>

#include "kernels/attention/attention.h"
#include "kernels/delta_rule/delta_rule.h"
#include "kernels/conv/conv.h"
#include "kernels/l2norm/l2norm.h"
#include "model/model.h"
#include "model/params.h"
#include "parallel/gdn_scan.h"
#include "parallel/mpi_communicator.h"
#include "parallel/ring_attention.h"
#include "parallel/self_communicator.h"
#include "tests/common/test_util.h"
#include "tests/parallel/parallel_test_util.h"

namespace hydra::test {
namespace {

constexpr double kTol = 1e-5;

// Admissible lengths for P ranks, including segments that are not multiples of 64.
std::vector<int64_t> lengths_for(int p) { return admissible_lengths(p, {3, 37, 64, 70}); }

TEST(Communicator, CollectivesMoveKnownValues) {
  MpiCommunicator& comm = world();
  const int p = comm.size(), r = comm.rank();
  Tensor mine = Tensor::empty({3}, DType::i64);
  for (int i = 0; i < 3; ++i) mine.data_as<int64_t>()[i] = 100 * r + i;
  Tensor all = Tensor::empty({p, 3}, DType::i64);
  comm.all_gather(mine, all);
  for (int q = 0; q < p; ++q)
    for (int i = 0; i < 3; ++i) EXPECT_EQ(all.data_as<int64_t>()[q * 3 + i], 100 * q + i);
  Tensor sum = Tensor::empty({2}, DType::f32);
  sum.data_as<float>()[0] = static_cast<float>(r + 1);
  sum.data_as<float>()[1] = 0.5f;
  comm.all_reduce_sum(sum);
  EXPECT_EQ(sum.data_as<float>()[0], p * (p + 1) / 2.0f);
  EXPECT_EQ(sum.data_as<float>()[1], 0.5f * p);
  Tensor b = Tensor::empty({1}, DType::i32);
  b.data_as<int32_t>()[0] = r == p - 1 ? 42 : -1;
  comm.broadcast(b, p - 1);
  EXPECT_EQ(b.data_as<int32_t>()[0], 42);
  // A full ring: after P steps every value is back home.
  Tensor held = clone(mine), next = Tensor::empty({3}, DType::i64);
  for (int step = 0; step < p; ++step) {
    const int src = (r - step + p) % p;
    EXPECT_EQ(held.data_as<int64_t>()[0], 100 * src);
    auto t = comm.start_send_recv(held, (r + 1) % p, next, (r - 1 + p) % p);
    t->wait();
    std::swap(held, next);
  }
  EXPECT_EQ(held.data_as<int64_t>()[2], 100 * r + 2);
}

TEST(Layout, ZigzagOwnershipAndErrors) {
  MpiCommunicator& comm = world();
  const int p = comm.size();
  const int64_t t = SequenceLayout::granularity(p) * 5;
  std::vector<int> owner(static_cast<size_t>(t), -1);
  for (int r = 0; r < p; ++r) {
    const SequenceLayout l = SequenceLayout::zigzag(t, p, r);
    EXPECT_EQ(l.local_length(), t / p);
    for (const Segment& s : l.local_segments()) {
      EXPECT_EQ(l.owner_of(s.index), r);
      for (int64_t i = 0; i < s.length; ++i) {
        EXPECT_EQ(owner[s.start + i], -1);
        owner[s.start + i] = r;
      }
    }
  }
  for (int o : owner) EXPECT_GE(o, 0);
  if (p > 1) {
    try {
      SequenceLayout::zigzag(t + 1, p, 0);
      ADD_FAILURE() << "length " << t + 1 << " accepted";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("not divisible by 2P = " + std::to_string(2 * p)), std::string::npos) << e.what();
    }
  }
}

// Any ring topology's steps (parallel/ring_attention.h ring_steps) must be a walk the double-buffered
// exchange can run: every rank holds every rank's block exactly once, starting with its own, and
// what it holds at step s is what its `prev` held at step s − 1 (sent to it then); checked for every
// rank of worlds up to 9, and the flat ring against its formula on this world.
TEST(RingAttention, EveryTopologysStepsAreAWalkOfTheRing) {
  for (const RingTopology topology : {RingTopology::flat}) {
    for (int p = 1; p <= 9; ++p) {
      std::vector<std::vector<RingStep>> steps;
      for (int r = 0; r < p; ++r) steps.push_back(ring_steps(topology, p, r));
      for (int r = 0; r < p; ++r) {
        ASSERT_EQ(steps[r].size(), static_cast<size_t>(p));
        EXPECT_EQ(steps[r][0].source, r) << "rank " << r << " of " << p << " starts with its own block";
        std::vector<int> seen(static_cast<size_t>(p), 0);
        for (int s = 0; s < p; ++s) {
          const RingStep& at = steps[r][static_cast<size_t>(s)];
          ++seen[static_cast<size_t>(at.source)];
          EXPECT_EQ(steps[static_cast<size_t>(at.next)][static_cast<size_t>(s)].prev, r) << "step " << s << ": sends match";
          if (s > 0) {
            const RingStep& before = steps[r][static_cast<size_t>(s - 1)];
            EXPECT_EQ(at.source, steps[static_cast<size_t>(before.prev)][static_cast<size_t>(s - 1)].source)
                << "rank " << r << " of " << p << ", step " << s;
          }
        }
        for (int q = 0; q < p; ++q) EXPECT_EQ(seen[static_cast<size_t>(q)], 1) << "rank " << r << " holds rank " << q;
      }
    }
  }
  MpiCommunicator& comm = world();
  const std::vector<RingStep> flat = ring_steps(RingTopology::flat, comm.size(), comm.rank());
  for (int s = 0; s < comm.size(); ++s) {
    EXPECT_EQ(flat[static_cast<size_t>(s)].source, (comm.rank() - s + comm.size()) % comm.size());
    EXPECT_EQ(flat[static_cast<size_t>(s)].next, (comm.rank() + 1) % comm.size());
  }
}

TEST(RingAttention, EqualsSingleProcessAttention) {
  MpiCommunicator& comm = world();
  const int p = comm.size();
  const int64_t hq = 3, hk = 2, d = 16;
  const std::vector<int> map = {0, 1, 1};
  for (int64_t t : lengths_for(p)) {
    Tensor q = random_tensor({t, hq, d}, 1), k = random_tensor({t, hk, d}, 2), v = random_tensor({t, hk, d}, 3);
    const ops::AttentionParams params{.tau_log_base = 362.0, .kv_head_of_query = map};
    Tensor ref = Tensor::empty({t, hq, d}, DType::f32), ref_lse = Tensor::empty({hq, t}, DType::f32);
    ops::attention_forward(ref, ref_lse, q, k, v, params);
    const SequenceLayout layout = SequenceLayout::zigzag(t, p, comm.rank());
    Tensor out = Tensor::empty({layout.local_length(), hq, d}, DType::f32);
    Tensor lse = Tensor::empty({hq, layout.local_length()}, DType::f32);
    ring_attention(comm, layout, out, lse, local_rows(layout, q), local_rows(layout, k), local_rows(layout, v), params);
    expect_close(out, local_rows(layout, ref), kTol, "ring attention T=" + std::to_string(t));
    Tensor lse_t = clone(lse.view().split_dim(0, hq, 1).select(1, 0));
    Tensor ref_lse_local = Tensor::empty({hq, layout.local_length()}, DType::f32);
    for (const Segment& s : layout.local_segments())
      copy_into(ref_lse_local.view().narrow(1, s.local_offset, s.length), ref_lse.view().narrow(1, s.start, s.length));
    expect_close(lse, ref_lse_local, kTol, "ring lse T=" + std::to_string(t));
  }
}

TEST(GdnScan, EqualsSingleProcessChunkedScan) {
  MpiCommunicator& comm = world();
  const int p = comm.size();
  const int64_t h = 2, dk = 16, dv = 24;
  for (int64_t t : lengths_for(p)) {
    Tensor q = random_tensor({t, h, dk}, 4), k = random_tensor({t, h, dk}, 5), v = random_tensor({t, h, dv}, 6);
    ops::l2_norm(q, 1e-6f);
    ops::l2_norm(k, 1e-6f);
    Tensor g = uniform_tensor({t, h}, 7, -0.3f, 0.0f), beta = uniform_tensor({t, h}, 8, 0.0f, 1.0f);
    Tensor ref = Tensor::empty({t, h, dv}, DType::f32), state = Tensor::zeros({h, dk, dv}, DType::f32);
    ops::delta_rule_chunked(ref, state, q, k, v, g, beta, {});
    const SequenceLayout layout = SequenceLayout::zigzag(t, p, comm.rank());
    Tensor out = Tensor::empty({layout.local_length(), h, dv}, DType::f32);
    gdn_sequence_parallel(comm, layout, out, local_rows(layout, q), local_rows(layout, k), local_rows(layout, v),
                          local_rows(layout, g), local_rows(layout, beta), {});
    expect_close(out, local_rows(layout, ref), kTol, "GDN scan T=" + std::to_string(t));
  }
}

TEST(ConvHalo, EqualsSingleProcessConv) {
  MpiCommunicator& comm = world();
  const int p = comm.size();
  for (int64_t t : lengths_for(p)) {
    Tensor x = random_tensor({t, 10}, 9), w = random_tensor({10, 4}, 10), ref = Tensor::empty({t, 10}, DType::f32);
    ops::causal_conv_silu(ref, x, w, TensorView());
    const SequenceLayout layout = SequenceLayout::zigzag(t, p, comm.rank());
    Tensor out = Tensor::empty({layout.local_length(), 10}, DType::f32);
    causal_conv_sequence_parallel(comm, layout, out, local_rows(layout, x), w);
    expect_close(out, local_rows(layout, ref), kTol, "conv T=" + std::to_string(t));
  }
}

Tensor logits_of(const Model& model, Communicator& comm, const SequenceLayout& layout, const TensorView& ids) {
  ForwardContext context{comm, layout};
  const Tensor hidden = model.forward(context, ids);
  Tensor logits = Tensor::empty({layout.local_length(), model.config().vocab_size}, DType::f32);
  model.lm_head(logits, hidden);
  return logits;
}

void expect_parallel_logits_equal_single(const ModelConfig& config, const std::string& what) {
  MpiCommunicator& comm = world();
  const int p = comm.size();
  const Model model(config, random_parameters(config, 21));
  SelfCommunicator self;
  for (int64_t t : lengths_for(p)) {
    Tensor ids = Tensor::empty({t}, DType::i32);
    for (int64_t i = 0; i < t; ++i) ids.data_as<int32_t>()[i] = static_cast<int32_t>((i * 7919 + 13) % config.vocab_size);
    const Tensor single = logits_of(model, self, SequenceLayout::zigzag(t, 1, 0), ids);
    const SequenceLayout layout = SequenceLayout::zigzag(t, p, comm.rank());
    const Tensor parallel = logits_of(model, comm, layout, local_rows(layout, ids));
    expect_close(parallel, local_rows(layout, single), kTol, what + " T=" + std::to_string(t));
  }
}

TEST(Model, HydraHeadLogitsEqualSingleProcess) {
  expect_parallel_logits_equal_single(preset_config("hydrahead-tiny"), "hydrahead-tiny");
}

TEST(Model, LayerwiseHybridLogitsEqualSingleProcess) {
  ModelConfig c = preset_config("qwen3-tiny");
  c.arch = Arch::hydrahead;
  c.num_layers = 4;
  c.fa_heads = {{0, 1, 2, 3}, {}, {}, {}};  // 3:1 layer-wise, its FA layer first (layerwise:4 puts it last)
  expect_parallel_logits_equal_single(c, "layer-wise 3:1 hybrid");
}

TEST(Model, TeacherLogitsEqualSingleProcess) {
  expect_parallel_logits_equal_single(preset_config("qwen3-tiny"), "qwen3-tiny");
}

}  // namespace
}  // namespace hydra::test
