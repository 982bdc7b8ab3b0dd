// Packed documents (DESIGN.md §3.6): every document of a packed sequence gives the hidden states, and
// the packed sequence the gradients, of its documents run alone — on P = 1..4 ranks, float64. The
// hidden states differ only in summation order (1e-10 relative); the gradients also in the loss
// kernels' float32 gradient scale (1 / the packed count against 1 / each document's count, each
// rounded to float32: up to 2·2⁻²⁴ ≈ 1.2e-7 relative), so they are held to 2e-7. The boundaries are placed where the machinery is
// delicate: a 1-token document first and last, starts inside GDN chunks (chunk 64) and exactly on a
// chunk edge, starts on the zigzag segment edges of P = 2, 3, 4 (so at rank edges), and a document
// starting one to three tokens before a segment edge (its conv halo is partly another document's).
#include <algorithm>
#include <cmath>

#include "model/model.h"
#include "model/params.h"
#include "model/train/objective.h"
#include "parallel/mpi_communicator.h"
#include "parallel/self_communicator.h"
#include "tests/common/test_util.h"
#include "tests/parallel/parallel_test_util.h"

namespace hydra::test {
namespace {

constexpr int64_t kTokens = 96;  // divisible by 2P for P = 1..4: segments of 96, 24, 16, 12
const std::vector<int64_t> kStarts = {0, 1, 14, 24, 46, 49, 64, 70, 95};

std::vector<int32_t> packed_ids(int64_t vocab) { return strided_ids(kTokens, vocab, 7919, 29); }

int64_t doc_end(size_t d) { return d + 1 < kStarts.size() ? kStarts[d + 1] : kTokens; }

ModelConfig layerwise_hybrid() {
  ModelConfig c = preset_config("qwen3-tiny");
  c.arch = Arch::hydrahead;
  c.num_layers = 3;
  c.fa_heads = {{0, 1, 2, 3}, {}, {1}};  // all-FA, all-GDN, mixed
  return c;
}

void expect_documents_run_alone(const ModelConfig& config, const std::string& what) {
  MpiCommunicator& comm = world();
  const Model model(config, random_parameters(config, 41), Device::host, DType::f64);
  const std::vector<int32_t> ids = packed_ids(config.vocab_size);
  // Each document alone, one process: its final hidden states into the global reference.
  SelfCommunicator self;
  Tensor reference = Tensor::empty({kTokens, config.hidden_size}, DType::f64);
  for (size_t d = 0; d < kStarts.size(); ++d) {
    const int64_t b = kStarts[d], n = doc_end(d) - b;
    const SequenceLayout alone = SequenceLayout::zigzag(n, 1, 0);
    const TokenRows rows = alone.token_rows(std::span<const int32_t>(ids).subspan(static_cast<size_t>(b), static_cast<size_t>(n)));
    ForwardContext context{.comm = self, .layout = alone};
    copy_into(reference.view().narrow(0, b, n), model.forward(context, rows.ids));
  }
  // The packed sequence over the world.
  const SequenceLayout layout = SequenceLayout::zigzag(kTokens, comm.size(), comm.rank(), kStarts);
  const TokenRows rows = layout.token_rows(ids);
  ForwardContext context{.comm = comm, .layout = layout};
  const Tensor hidden = model.forward(context, rows.ids);
  const Tensor expected = layout.local_rows(reference);
  EXPECT_EQ(count_non_finite(to(hidden, Device::host, DType::f32)), 0);
  EXPECT_LT(norm_rel_error(hidden, expected), 1e-10) << what << ": hidden states, P = " << comm.size();

  // Gradients: the packed mean over every document's targets = Σ_d count_d · (mean gradient of d
  // alone) / Σ_d count_d; 1-token documents have no target.
  const train::NamedGradients packed = train::next_token_gradients(comm, model, ids, {}, kStarts);
  int64_t total = 0;
  NamedTensors sum;
  double loss = 0;
  for (size_t d = 0; d < kStarts.size(); ++d) {
    const int64_t b = kStarts[d], n = doc_end(d) - b;
    if (n < 2) continue;
    const train::NamedGradients g = train::next_token_gradients(
        self, model, std::span<const int32_t>(ids).subspan(static_cast<size_t>(b), static_cast<size_t>(n)));
    total += g.sums.tokens;
    loss += g.sums.loss;
    for (const auto& [name, t] : g.grads) {
      Tensor scaled = to(t, Device::host, DType::f64);
      for (int64_t i = 0; i < scaled.numel(); ++i) scaled.data_as<double>()[i] *= static_cast<double>(g.sums.tokens);
      auto [it, fresh] = sum.try_emplace(name, scaled);
      if (!fresh) {
        for (int64_t i = 0; i < scaled.numel(); ++i) it->second.data_as<double>()[i] += scaled.data_as<double>()[i];
      }
    }
  }
  EXPECT_EQ(packed.sums.tokens, total) << what;
  EXPECT_NEAR(packed.sums.loss, loss, 1e-10 * std::abs(loss)) << what;
  for (auto& [name, t] : sum) {
    for (int64_t i = 0; i < t.numel(); ++i) t.data_as<double>()[i] /= static_cast<double>(total);
    ASSERT_TRUE(packed.grads.count(name)) << name;
    EXPECT_LT(norm_rel_error(packed.grads.at(name), t), 2e-7) << what << ": gradient of " << name << ", P = "
                                                               << comm.size();
  }
}

TEST(Documents, HydraHeadDocumentsRunAlone) { expect_documents_run_alone(preset_config("hydrahead-tiny"), "hydrahead-tiny"); }

TEST(Documents, LayerwiseHybridDocumentsRunAlone) { expect_documents_run_alone(layerwise_hybrid(), "layer-wise hybrid"); }

TEST(Documents, TeacherDocumentsRunAlone) { expect_documents_run_alone(preset_config("qwen3-tiny"), "qwen3-tiny"); }

TEST(Documents, LayoutBounds) {
  const SequenceLayout l = SequenceLayout::zigzag(kTokens, 2, 1, kStarts);
  EXPECT_EQ(l.document_start(0), 0);
  EXPECT_EQ(l.document_start(13), 1);
  EXPECT_EQ(l.document_start(14), 14);
  EXPECT_EQ(l.document_end(14), 24);
  EXPECT_EQ(l.document_end(95), kTokens);
  EXPECT_EQ(l.starts_inside(24, 72), (std::vector<int64_t>{46, 49, 64, 70}));
  EXPECT_TRUE(l.starts_inside(24, 25).empty());
  // Rank 1 of 2 owns segments 1 ([24, 48)) and 2 ([48, 72)): positions restart at 24, 46, 49, 64, 70.
  const std::vector<int64_t> pos = l.local_document_positions();
  EXPECT_EQ(pos[0], 0);
  EXPECT_EQ(pos[22], 0);   // 46
  EXPECT_EQ(pos[24], 2);   // 48, in the document from 46
  EXPECT_EQ(pos[40], 0);   // 64
  EXPECT_EQ(pos[47], 1);   // 71, in the document from 70
  EXPECT_EQ(counted_within_documents({}, 5, std::vector<int64_t>{0, 2}), (std::vector<uint8_t>{1, 1, 0, 1, 1}));
}

}  // namespace
}  // namespace hydra::test
