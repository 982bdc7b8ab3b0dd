// Sequence parallelism across GPUs (the multi-GPU prefill): NCCL ring attention, GDN map exchange and conv halo,
// whole-model logits and generation on P GPUs against one GPU, one rank per GPU. Every rank computes the
// single-GPU reference on its own GPU and compares its zigzag rows. Tolerance: bf16 (2e-2 for the
// ops, whose single- and multi-GPU runs differ only in summation order and bf16 roundings of
// partial results; 5e-2 of the largest logit for whole models over 64K tokens).
// Without enough GPUs for the ranks every test reports SKIPPED.
#include "kernels/conv/conv.h"
#include "kernels/l2norm/l2norm.h"
#include "model/generate.h"
#include "model/model.h"
#include "model/params.h"
#include "model/train/objective.h"
#include "model/train/optimizer.h"
#include "parallel/agreement.h"
#include "parallel/device_world.h"
#include "parallel/gdn_scan.h"
#include "parallel/ring_attention.h"
#include "parallel/self_communicator.h"
#include "tests/common/test_util.h"

namespace hydra::test {
namespace {

struct Gpus {
  MpiCommunicator world;
  DeviceWorld device;
  bool ok = false;
};

Gpus& gpus() {
  static Gpus g;
  static const bool initialised = [] {
    int argc = 0;
    char** argv = nullptr;
    MpiRuntime runtime(&argc, &argv);  // MPI is up (test main): this only reads the local rank
    int enough = runtime.local_size() <= cuda_devices() ? 1 : 0, all = 0;
    MPI_Allreduce(&enough, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!all) return true;
    g.device = make_device_world("cuda", runtime, g.world, 120.0);
    g.ok = true;
    return true;
  }();
  (void)initialised;
  return g;
}

#define REQUIRE_GPUS()                                                                   \
  do {                                                                                   \
    if (!gpus().ok) GTEST_SKIP() << "fewer GPUs than ranks on this node: GPU test skipped"; \
  } while (0)

Tensor local_rows(const SequenceLayout& layout, const TensorView& global) {
  std::vector<int64_t> shape(global.shape().begin(), global.shape().end());
  shape[0] = layout.local_length();
  Tensor out = Tensor::empty(shape, global.dtype(), global.device());
  for (const Segment& s : layout.local_segments())
    copy_into(out.view().narrow(0, s.local_offset, s.length), global.narrow(0, s.start, s.length));
  return out;
}


// The agreement check over NCCL (what eval-niah runs per sample on GPUs): buffers staged through the
// device, the same message as on CPU ranks.
TEST(GpuSequenceParallel, AgreementCheckOverNcclNamesTheRanksThatDiffer) {
  REQUIRE_GPUS();
  Communicator& comm = *gpus().device.comm;
  ASSERT_EQ(comm.device(), Device::cuda);
  RunFingerprint same;
  same.add("answer span", "255 + 1");
  EXPECT_NO_THROW(agree_across_ranks(comm, same, "sample 0"));
  RunFingerprint other = same;
  std::vector<int32_t> ids(512, 3);
  if (comm.rank() == comm.size() - 1) ids[7] = 4;
  other.add_tokens("sample tokens", ids);
  const std::string error = error_of([&] { agree_across_ranks(comm, other, "sample 0"); });
  if (comm.size() > 1) {
    EXPECT_NE(error.find(fmt::format("ranks 0 and {} disagree on sample 0: 'sample tokens hash' differs",
                                     comm.size() - 1)), std::string::npos) << error;
  }
}

TEST(GpuSequenceParallel, RingAttentionGdnScanAndConvEqualOneGpu) {
  REQUIRE_GPUS();
  Communicator& comm = *gpus().device.comm;
  const int p = comm.size();
  SelfCommunicator self(Device::cuda);
  for (int64_t t : {SequenceLayout::granularity(p) * 70, SequenceLayout::granularity(p) * 1000}) {
    const SequenceLayout one = SequenceLayout::zigzag(t, 1, 0), layout = SequenceLayout::zigzag(t, p, comm.rank());
    const std::string at = " T=" + std::to_string(t);
    // FA heads: 3 query heads on 2 KV heads, τ on.
    Tensor q = to(random_tensor({t, 3, 128}, 1), Device::cuda, DType::bf16);
    Tensor k = to(random_tensor({t, 2, 128}, 2), Device::cuda, DType::bf16);
    Tensor v = to(random_tensor({t, 2, 128}, 3), Device::cuda, DType::bf16);
    const std::vector<int> map = {0, 1, 1};
    const ops::AttentionParams params{.tau_log_base = 362.0, .kv_head_of_query = map};
    Tensor ref = Tensor::empty({t, 3, 128}, DType::f32, Device::cuda), ref_lse = Tensor::empty({3, t}, DType::f32, Device::cuda);
    ring_attention(self, one, ref, ref_lse, q, k, v, params);
    Tensor out = Tensor::empty({layout.local_length(), 3, 128}, DType::f32, Device::cuda);
    Tensor lse = Tensor::empty({3, layout.local_length()}, DType::f32, Device::cuda);
    ring_attention(comm, layout, out, lse, local_rows(layout, q), local_rows(layout, k), local_rows(layout, v), params);
    expect_close(host(out), host(local_rows(layout, ref)), 2e-2, "ring attention" + at);
    // GDN heads.
    Tensor qg = random_tensor({t, 2, 128}, 4), kg = random_tensor({t, 2, 128}, 5);
    ops::l2_norm(qg, 1e-6f);
    ops::l2_norm(kg, 1e-6f);
    Tensor qd = to(qg, Device::cuda, DType::bf16), kd = to(kg, Device::cuda, DType::bf16);
    Tensor vd = to(random_tensor({t, 2, 128}, 6), Device::cuda, DType::bf16);
    Tensor gd = to(uniform_tensor({t, 2}, 7, -0.2f, 0.0f), Device::cuda, DType::f32);
    Tensor bd = to(uniform_tensor({t, 2}, 8, 0.0f, 1.0f), Device::cuda, DType::f32);
    Tensor gref = Tensor::empty({t, 2, 128}, DType::bf16, Device::cuda);
    gdn_sequence_parallel(self, one, gref, qd, kd, vd, gd, bd, {});
    Tensor gout = Tensor::empty({layout.local_length(), 2, 128}, DType::bf16, Device::cuda);
    gdn_sequence_parallel(comm, layout, gout, local_rows(layout, qd), local_rows(layout, kd), local_rows(layout, vd),
                          local_rows(layout, gd), local_rows(layout, bd), {});
    expect_close(host(gout), host(local_rows(layout, gref)), 2e-2, "GDN scan" + at);
    // Conv halo.
    Tensor x = to(random_tensor({t, 64}, 9), Device::cuda, DType::bf16), w = to(random_tensor({64, 4}, 10), Device::cuda, DType::f32);
    Tensor cref = Tensor::empty({t, 64}, DType::bf16, Device::cuda);
    causal_conv_sequence_parallel(self, one, cref, x, w);
    Tensor cout = Tensor::empty({layout.local_length(), 64}, DType::bf16, Device::cuda);
    causal_conv_sequence_parallel(comm, layout, cout, local_rows(layout, x), w);
    expect_close(host(cout), host(local_rows(layout, cref)), 1e-2, "conv halo" + at);
  }
}

void expect_model_matches_one_gpu(const ModelConfig& config, int64_t t, const std::string& what) {
  Communicator& comm = *gpus().device.comm;
  const Model model(config, random_parameters(config, 3, Device::cuda, DType::bf16), Device::cuda, DType::bf16);
  Tensor ids = Tensor::empty({t}, DType::i32);
  for (int64_t i = 0; i < t; ++i) ids.data_as<int32_t>()[i] = static_cast<int32_t>((i * 7919 + 1) % config.vocab_size);
  SelfCommunicator self(Device::cuda);
  ForwardContext one{self, SequenceLayout::zigzag(t, 1, 0)};
  const Tensor ref_hidden = model.forward(one, ids);
  const SequenceLayout layout = SequenceLayout::zigzag(t, comm.size(), comm.rank());
  ForwardContext many{comm, layout};
  const Tensor hidden = model.forward(many, local_rows(layout, ids));
  // Compare logits of a sample of local rows (all 64K rows × vocab would be large).
  const int64_t rows = std::min<int64_t>(512, layout.local_length());
  Tensor la = Tensor::empty({rows, config.vocab_size}, DType::f32, Device::cuda);
  Tensor lb = Tensor::empty({rows, config.vocab_size}, DType::f32, Device::cuda);
  Tensor picked_ref = Tensor::empty({rows, config.hidden_size}, DType::bf16, Device::cuda);
  Tensor local_ref = local_rows(layout, ref_hidden);
  const int64_t stride = layout.local_length() / rows;
  Tensor picked = Tensor::empty({rows, config.hidden_size}, DType::bf16, Device::cuda);
  for (int64_t i = 0; i < rows; ++i) {
    copy_into(picked.view().narrow(0, i, 1), hidden.view().narrow(0, i * stride, 1));
    copy_into(picked_ref.view().narrow(0, i, 1), local_ref.view().narrow(0, i * stride, 1));
  }
  model.lm_head(la, picked);
  model.lm_head(lb, picked_ref);
  const double err = max_rel_error(host(la), host(lb));
  if (comm.rank() == 0) std::printf("%s T=%lld: %d GPUs vs 1 GPU logits max rel error %.3g\n", what.c_str(), static_cast<long long>(t), comm.size(), err);
  expect_close(host(la), host(lb), 5e-2, what);
}

TEST(GpuSequenceParallel, HydraHeadTinyAt64KEqualsOneGpu) {
  REQUIRE_GPUS();
  expect_model_matches_one_gpu(preset_config("hydrahead-tiny"), 65536, "hydrahead-tiny");
}

TEST(GpuSequenceParallel, LayerwiseHybridEqualsOneGpu) {
  REQUIRE_GPUS();
  ModelConfig c = preset_config("qwen3-tiny");
  c.arch = Arch::hydrahead;
  c.num_layers = 4;
  c.fa_heads = {{}, {}, {}, {0, 1, 2, 3}};
  expect_model_matches_one_gpu(c, 16384, "layer-wise 3:1 hybrid");
}

// Generation over P GPUs (the NCCL decode collective, the distributed bf16 cache) against
// one GPU: the first new token's logits of each prompt (prompt only, so both runs see the same
// input) within bf16 (5e-2 of the largest logit), and the ranks agree on the tokens (rank 0's
// choice is broadcast). Prompts of 4097 and 300 tokens: prefills of several segments per rank.
TEST(GpuSequenceParallel, GenerationEqualsOneGpu) {
  REQUIRE_GPUS();
  Communicator& comm = *gpus().device.comm;
  for (const std::string preset : {"hydrahead-tiny", "qwen3-tiny"}) {
    const ModelConfig config = preset_config(preset);
    const Model model(config, random_parameters(config, 4, Device::cuda, DType::bf16), Device::cuda, DType::bf16);
    std::vector<std::vector<int32_t>> prompts;
    for (const int64_t n : {int64_t{4097}, int64_t{300}}) {
      std::vector<int32_t> p(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) p[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7919 + n) % config.vocab_size);
      prompts.push_back(p);
    }
    const GenerateOptions options{.max_new_tokens = 6, .keep_logits = true};
    SelfCommunicator self(Device::cuda);
    const auto one = generate(self, model, prompts, options);
    const auto many = generate(comm, model, prompts, options);
    const int64_t vocab = config.vocab_size;
    for (size_t b = 0; b < prompts.size(); ++b) {
      Tensor a = Tensor::empty({vocab}, DType::f32), r = Tensor::empty({vocab}, DType::f32);
      std::copy_n(many[b].logits.data(), vocab, a.data_as<float>());
      std::copy_n(one[b].logits.data(), vocab, r.data_as<float>());
      const double err = max_rel_error(a, r);
      if (comm.rank() == 0) {
        std::printf("%s generate prompt %zu: %d GPUs vs 1 GPU first-token logits max rel error %.3g\n", preset.c_str(), b,
                    comm.size(), err);
      }
      expect_close(a, r, 5e-2, preset + " first new token's logits");
      // Every rank holds the same tokens (broadcast from rank 0).
      Tensor mine = Tensor::empty({6}, DType::f32);
      for (int i = 0; i < 6; ++i) mine.data_as<float>()[i] = static_cast<float>(many[b].tokens[static_cast<size_t>(i)]);
      Tensor all = Tensor::empty({comm.size(), 6}, DType::f32, Device::cuda);
      comm.all_gather(to_device(mine, Device::cuda), all);
      const Tensor h = host(all);
      for (int r2 = 0; r2 < comm.size(); ++r2)
        for (int i = 0; i < 6; ++i) EXPECT_EQ(h.data_as<float>()[r2 * 6 + i], mine.data_as<float>()[i]) << "rank " << r2;
    }
  }
}

// ZeRO-1's collectives over NCCL (model/train/optimizer.h): reduce_scatter_sum of a [P, n] buffer
// whose row q on rank r holds (r + 1)·(1000·q + i) leaves Σ_r (r + 1)·(1000·rank + i) on each rank,
// and all_gather of rank r's [n] (r·n + i) fills [P, n] in rank order; n = 1237 (no multiple of
// anything), in f32 and f64, with values small enough to be exact. Then the sharded optimizer against
// the replicated one on the GPUs: both sum the gradients through the same NCCL reduce-scatter, so 5
// steps of hydrahead-tiny (bf16 weights, fp32 state) give the same losses and weights bit for bit.
TEST(GpuZero, NcclReduceScatterAndAllGatherOfKnownValues) {
  REQUIRE_GPUS();
  Communicator& comm = *gpus().device.comm;
  const int64_t p = comm.size(), r = comm.rank(), n = 1237;
  for (const DType dtype : {DType::f32, DType::f64}) {
    Tensor send = Tensor::empty({p, n}, DType::f64), gathered_in = Tensor::empty({n}, DType::f64);
    for (int64_t q = 0; q < p; ++q) {
      for (int64_t i = 0; i < n; ++i) send.data_as<double>()[q * n + i] = static_cast<double>((r + 1) * (1000 * q + i));
    }
    for (int64_t i = 0; i < n; ++i) gathered_in.data_as<double>()[i] = static_cast<double>(r * n + i);
    const Tensor d_send = to(send, Device::cuda, dtype), d_in = to(gathered_in, Device::cuda, dtype);
    Tensor d_recv = Tensor::zeros({n}, dtype, Device::cuda), d_all = Tensor::zeros({p, n}, dtype, Device::cuda);
    comm.reduce_scatter_sum(d_send, d_recv);
    comm.all_gather(d_in, d_all);
    const Tensor recv = to(d_recv, Device::host, DType::f64), all = to(d_all, Device::host, DType::f64);
    const double ranks_sum = static_cast<double>(p * (p + 1) / 2);
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; ++i) wrong += recv.data_as<double>()[i] != ranks_sum * static_cast<double>(1000 * r + i);
    for (int64_t i = 0; i < p * n; ++i) wrong += all.data_as<double>()[i] != static_cast<double>(i);
    EXPECT_EQ(wrong, 0) << dtype_name(dtype) << " on rank " << r;
  }
}

TEST(GpuZero, ShardedEqualsReplicatedOnGpus) {
  REQUIRE_GPUS();
  Communicator& comm = *gpus().device.comm;
  const ModelConfig config = preset_config("hydrahead-tiny");
  const NamedTensors params = random_parameters(config, 43);
  Model a_model(config, params, Device::cuda), b_model(config, params, Device::cuda);
  train::OptimizerConfig oc;
  oc.lr = 3e-3;
  oc.total_steps = 5;
  const auto all = [](const std::string&) { return true; };
  train::AdamW replicated(a_model, oc, all, &comm, train::Zero::replicated);
  train::AdamW sharded(b_model, oc, all, &comm, train::Zero::sharded);
  const int64_t t = SequenceLayout::granularity(comm.size()) * 64;
  const SequenceLayout layout = SequenceLayout::zigzag(t, comm.size(), comm.rank());
  std::vector<int32_t> ids(static_cast<size_t>(t));
  for (int step = 1; step <= 5; ++step) {
    for (int64_t i = 0; i < t; ++i) ids[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7919 + step * 104729) % config.vocab_size);
    const TokenRows rows = layout.token_rows(ids);
    double loss[2] = {};
    int k = 0;
    for (const auto& [model, optimizer] : {std::pair<Model*, train::AdamW*>{&a_model, &replicated}, {&b_model, &sharded}}) {
      optimizer->zero_grads();
      ForwardContext context{.comm = comm, .layout = layout};
      loss[k++] = train::sequence_gradients(context, *model, rows, train::Objective::cross_entropy,
                                            1.0 / static_cast<double>(t - 1), &optimizer->grads()).loss;
      optimizer->reduce_gradients();
      optimizer->step(step, optimizer->grad_norm());
    }
    EXPECT_EQ(loss[0], loss[1]) << "step " << step;
  }
  const NamedTensors wa = a_model.unpack(a_model.weights()), wb = b_model.unpack(b_model.weights());
  for (const auto& [name, w] : wa) EXPECT_EQ(max_rel_error(wb.at(name), w), 0.0) << name;
}

}  // namespace
}  // namespace hydra::test
