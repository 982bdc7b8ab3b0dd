// Head selection (model/selection/head_selection.h) in one process, on cases whose answer is known:
//  - a model built so that one head carries the needle (tests/common/needle_head_model.h) ranks
//    that head first in total and direct effect, with total ≈ 1 (patching it undoes retrieval);
//  - a head whose W_o slice is zero has total = direct = lm = 0 exactly;
//  - the direct effect equals a readout computed here by hand from the checkpoint's tensors and the
//    head outputs captured by the test's own observer (plain loops, fp64), and the total and lm
//    scores of a head equal a patched / mean-ablated forward run by the test itself;
//  - group patching (a whole layer; all heads of a layer but one) equals the test's own patched
//    forwards, and on the needle-head model it finds the one head that suffices; the concentration
//    of the direct effect (per-layer share, top-k share, effective heads) on hand-computed grids and
//    on the planted head;
//  - composite normalisation, budgets (global and per layer, ties) and the head-set file that
//    `hydra convert --fa-heads file:PATH` reads.
#include <cmath>

#include "model/selection/head_report.h"
#include "model/fa_heads_file.h"
#include "model/selection/head_selection.h"
#include "parallel/self_communicator.h"
#include "tests/common/needle_head_model.h"
#include "tests/common/test_util.h"

namespace hydra::test {
namespace {

using heads::CalibrationPrompt;
using heads::Grid;

// Prompts for the needle-head model: needles at different places, corrupted value = another value id.
std::vector<CalibrationPrompt> needle_prompts() {
  std::vector<CalibrationPrompt> out;
  const int64_t places[] = {0, 17, 30};
  for (int i = 0; i < 3; ++i) {
    const int32_t value = NeedleHeadModel::kValueBegin + 3 * i + 1;
    const niah::Sample s = needle_head_sample(48, places[i], value, 100 + i);
    const std::vector<int32_t> donor{value + 5};
    out.push_back(heads::corrupt_with_donor(s, donor, "test"));
  }
  return out;
}

Tensor run(const Model& model, const std::vector<int32_t>& ids, LayerObserver* observer) {
  SelfCommunicator self;
  const SequenceLayout layout = SequenceLayout::zigzag(static_cast<int64_t>(ids.size()), 1, 0);
  ForwardContext context{.comm = self, .layout = layout, .observer = observer};
  return model.forward(context, TensorView(const_cast<int32_t*>(ids.data()), DType::i32, Device::host,
                                           {static_cast<int64_t>(ids.size())}));
}

double answer_logprob(const Model& model, const Tensor& hidden, const CalibrationPrompt& p) {
  Tensor logits = Tensor::empty({p.answer_length, model.config().vocab_size}, DType::f32);
  model.lm_head(logits, hidden.view().narrow(0, p.answer_start - 1, p.answer_length));
  return niah::score_answer(logits, p.answer()).logprob;
}

// The test's own observer: copies every layer's head outputs, [T, H, d] (teacher: model order).
struct Capture final : LayerObserver {
  std::vector<Tensor> o;
  void on_head_outputs(int64_t, const TensorView& out, std::span<const int>) override { o.push_back(clone(out)); }
};

// Overwrites one head's output at rows [from, T) with `source` rows (patch) or with a constant (mean).
struct Overwrite final : LayerObserver {
  int64_t layer, head, from;
  const Tensor* source = nullptr;  // [T, H, d]
  std::vector<float> constant;
  void on_head_outputs(int64_t l, const TensorView& o, std::span<const int>) override {
    if (l != layer) return;
    for (int64_t t = from; t < o.size(0); ++t) {
      float* row = static_cast<float*>(o.element_ptr({t, head}));
      for (int64_t k = 0; k < o.size(2); ++k) {
        row[k] = source ? static_cast<const float*>(source->view().element_ptr({t, head}))[k] : constant[k];
      }
    }
  }
};

// Overwrites several heads of one layer at rows [from, T) with `source` rows.
struct OverwriteHeads final : LayerObserver {
  int64_t layer, from;
  std::vector<int64_t> heads;
  const Tensor* source = nullptr;  // [T, H, d]
  void on_head_outputs(int64_t l, const TensorView& o, std::span<const int>) override {
    if (l != layer) return;
    for (int64_t head : heads)
      for (int64_t t = from; t < o.size(0); ++t) {
        float* row = static_cast<float*>(o.element_ptr({t, head}));
        for (int64_t k = 0; k < o.size(2); ++k) row[k] = static_cast<const float*>(source->view().element_ptr({t, head}))[k];
      }
  }
};

TEST(HeadSelection, PlantedNeedleHeadRanksFirst) {
  const NeedleHeadModel m = make_needle_head_model();
  const Model model(m.config, m.params);
  const std::vector<CalibrationPrompt> prompts = needle_prompts();
  const auto text = heads::random_text(m.config.vocab_size, 3, 32, 2);
  SelfCommunicator self;
  SequenceGroups alone(self, 0);
  const heads::HeadScores s = heads::score_heads(model, alone, prompts, text);
  // The model retrieves: the clean answer is near-certain, the corrupted prompt states another value.
  EXPECT_GT(s.logprob_clean, -0.1);
  EXPECT_LT(s.logprob_corrupt, -5.0);
  ASSERT_TRUE(s.total_normalized);
  const auto argmax = [](const Grid& g) {
    std::pair<size_t, size_t> best{0, 0};
    for (size_t l = 0; l < g.size(); ++l)
      for (size_t h = 0; h < g[l].size(); ++h)
        if (g[l][h] > g[best.first][best.second]) best = {l, h};
    return best;
  };
  const std::pair<size_t, size_t> planted{m.planted_layer, m.planted_head};
  EXPECT_EQ(argmax(s.total), planted);
  EXPECT_EQ(argmax(s.direct), planted);
  // Patching the one retrieval head undoes retrieval (total ≈ 1); the other heads barely matter.
  EXPECT_NEAR(s.total[1][2], 1.0, 0.05);
  for (size_t l = 0; l < 2; ++l) {
    for (size_t h = 0; h < 4; ++h) {
      if (std::pair{l, h} != planted) {
        EXPECT_LT(std::abs(s.total[l][h]), 0.05) << l << "," << h;
      }
    }
  }
  // Its direct readout: +7.7 on the clean value, −7.7 on the corrupted one (header of the model).
  EXPECT_GT(s.direct[1][2], 10.0);
  const heads::CompositeScores c = heads::composite_scores(s, {});
  EXPECT_EQ(argmax(c.composite), planted);
  const auto fa = heads::choose_fa_heads(c.composite, {1, heads::BudgetMode::global});
  EXPECT_EQ(fa, (std::vector<std::vector<int>>{{}, {2}}));
}

// The planted head alone retrieves: patching its whole layer undoes retrieval, patching every head
// of the layer but the planted one leaves it intact; the direct effect is concentrated in it.
TEST(HeadSelection, GroupPatchingAndConcentrationFindTheOneHeadThatSuffices) {
  const NeedleHeadModel m = make_needle_head_model();
  const Model model(m.config, m.params);
  SelfCommunicator self;
  SequenceGroups alone(self, 0);
  heads::ScoringOptions options;
  options.group_patching = true;
  const heads::HeadScores s =
      heads::score_heads(model, alone, needle_prompts(), heads::random_text(m.config.vocab_size, 3, 32, 2), options);
  ASSERT_TRUE(s.groups && s.total_normalized);
  const int64_t pl = m.planted_layer, ph = m.planted_head;
  EXPECT_NEAR(s.layer_total[pl], 1.0, 0.05);
  EXPECT_NEAR(s.all_but_one[pl][ph], 0.0, 0.05);
  for (int64_t h = 0; h < m.config.num_heads; ++h) {
    if (h != ph) {
      EXPECT_NEAR(s.all_but_one[pl][h], 1.0, 0.05) << h;
    }
  }
  EXPECT_EQ(s.forwards, 2 * 3 + 2 + 2 * 4 * (3 + 2) + 2 * 5 * 3);
  const heads::Concentration c = heads::concentration(s.direct);
  EXPECT_GT(c.layer_share[pl], 0.9);
  EXPECT_GT(c.top_share.front().second, 0.8);
  EXPECT_EQ(c.top_share.front().first, 1);
  EXPECT_LT(c.effective_heads, 1.5);
  // The JSON that heads.json carries.
  const nlohmann::ordered_json j = heads::concentration_json(s);
  EXPECT_EQ(j["groups"]["all_but_one"].size(), 2u);
  EXPECT_DOUBLE_EQ(j["concentration"]["effective_heads"].get<double>(), c.effective_heads);
}

// Concentration by hand: positive parts {2, 0 | 1, 1}, sum 4.
TEST(HeadSelection, ConcentrationOfTheDirectEffect) {
  const heads::Concentration c = heads::concentration({{2.0, -1.0}, {1.0, 1.0}});
  EXPECT_DOUBLE_EQ(c.positive_total, 4.0);
  EXPECT_EQ(c.layer_share, (std::vector<double>{0.5, 0.5}));
  ASSERT_EQ(c.top_share.size(), 3u);  // k = 1, 2, 4
  EXPECT_EQ(c.top_share[0], (std::pair<int, double>{1, 0.5}));
  EXPECT_EQ(c.top_share[1], (std::pair<int, double>{2, 0.75}));
  EXPECT_EQ(c.top_share[2], (std::pair<int, double>{4, 1.0}));
  EXPECT_NEAR(c.effective_heads, std::exp(-(0.5 * std::log(0.5) + 2 * 0.25 * std::log(0.25))), 1e-12);
  EXPECT_NEAR(heads::concentration({{1.0, 1.0, 1.0}, {1.0, 1.0, 1.0}}).effective_heads, 6.0, 1e-12);
  const heads::Concentration none = heads::concentration({{-1.0, 0.0}});
  EXPECT_EQ(none.effective_heads, 0.0);
  EXPECT_EQ(none.layer_share, (std::vector<double>{0.0}));
  // top_share lists k = 1, 2, 4, ... and the full count: 6 heads -> 1, 2, 4, 6.
  const auto six = heads::concentration({{1, 2, 3}, {4, 5, 6}}).top_share;
  ASSERT_EQ(six.size(), 4u);
  EXPECT_EQ(six[3].first, 6);
  EXPECT_NEAR(six[0].second, 6.0 / 21.0, 1e-12);
}

TEST(HeadSelection, HeadWithZeroOutputProjectionHasExactlyZeroEffect) {
  const NeedleHeadModel m = make_needle_head_model();
  const Model model(m.config, m.params);
  SelfCommunicator self;
  SequenceGroups alone(self, 0);
  const heads::HeadScores s =
      heads::score_heads(model, alone, needle_prompts(), heads::random_text(m.config.vocab_size, 3, 32, 2));
  EXPECT_EQ(s.total[m.zero_layer][m.zero_head], 0.0);
  EXPECT_EQ(s.direct[m.zero_layer][m.zero_head], 0.0);
  EXPECT_EQ(s.lm[m.zero_layer][m.zero_head], 0.0);
  EXPECT_NE(s.total[0][0], 0.0);  // the others do react (random small W_o)
  EXPECT_NE(s.lm[0][0], 0.0);
}

// Direct effects by hand: x_final replayed with plain loops from the checkpoint tensors (original
// head order), rms, and the readout Σ_i w_f[i] (W_o,h Δo)[i] (U[a] − U[a'])[i] / rms in fp64.
TEST(HeadSelection, DirectEffectEqualsHandReadoutAndTotalAndLmEqualHandPatching) {
  ModelConfig c = preset_config("qwen3-tiny");
  const NamedTensors params = random_parameters(c, 21);
  const Model model(c, params);
  const int64_t L = c.num_layers, H = c.num_heads, d = c.head_dim, D = c.hidden_size, I = c.intermediate_size;
  niah::TaskParams task;
  task.task = niah::Task::multikey;
  const std::vector<CalibrationPrompt> prompts = heads::generated_prompts(task, c.vocab_size, 4, 96, 2);
  const auto text = heads::random_text(c.vocab_size, 8, 40, 2);
  SelfCommunicator self;
  SequenceGroups alone(self, 0);
  heads::ScoringOptions options;
  options.group_patching = true;
  const heads::HeadScores s = heads::score_heads(model, alone, prompts, text, options);

  const auto f = [&](const std::string& name) { return params.at(name).data_as<const float>(); };
  const auto rms_norm = [&](std::vector<double> x, const float* w) {
    double ms = 0;
    for (double v : x) ms += v * v;
    const double r = std::sqrt(ms / static_cast<double>(x.size()) + c.rms_norm_eps);
    for (size_t i = 0; i < x.size(); ++i) x[i] = w[i] * x[i] / r;
    return x;
  };
  Grid direct(static_cast<size_t>(L), std::vector<double>(static_cast<size_t>(H), 0.0));
  for (const CalibrationPrompt& p : prompts) {
    Capture clean, corrupt;
    const Tensor hidden = run(model, p.clean, &clean);
    run(model, p.corrupted, &corrupt);
    for (int64_t j = 0; j < p.answer_length; ++j) {
      const int64_t pos = p.answer_start - 1 + j;
      const int32_t a = p.answer()[j], b = p.corrupted_answer[j];
      // Residual stream at pos: embedding, then per layer attention (W_o o) and the MLP.
      std::vector<double> x(static_cast<size_t>(D));
      for (int64_t i = 0; i < D; ++i) x[i] = f("model.embed_tokens.weight")[p.clean[pos] * D + i];
      for (int64_t l = 0; l < L; ++l) {
        const std::string pre = layer_prefix(l);
        const float* o = static_cast<const float*>(clean.o[l].view().element_ptr({pos}));
        for (int64_t i = 0; i < D; ++i)
          for (int64_t k = 0; k < H * d; ++k) x[i] += f(pre + "self_attn.o_proj.weight")[i * H * d + k] * o[k];
        const std::vector<double> xn = rms_norm(x, f(pre + "post_attention_layernorm.weight"));
        std::vector<double> act(static_cast<size_t>(I));
        for (int64_t r = 0; r < I; ++r) {
          double gate = 0, up = 0;
          for (int64_t i = 0; i < D; ++i) {
            gate += f(pre + "mlp.gate_proj.weight")[r * D + i] * xn[i];
            up += f(pre + "mlp.up_proj.weight")[r * D + i] * xn[i];
          }
          act[r] = gate / (1 + std::exp(-gate)) * up;
        }
        for (int64_t i = 0; i < D; ++i)
          for (int64_t r = 0; r < I; ++r) x[i] += f(pre + "mlp.down_proj.weight")[i * I + r] * act[r];
      }
      // The hand replay reproduces the forward's normed output (so its rms is the model's).
      const std::vector<double> normed = rms_norm(x, f("model.norm.weight"));
      for (int64_t i = 0; i < D; ++i) ASSERT_NEAR(normed[i], hidden.data_as<float>()[pos * D + i], 2e-4 * std::abs(normed[i]) + 2e-5);
      if (a == b) continue;
      double ms = 0;
      for (double v : x) ms += v * v;
      const double rms = std::sqrt(ms / static_cast<double>(D) + c.rms_norm_eps);
      for (int64_t l = 0; l < L; ++l) {
        const float* oc = static_cast<const float*>(clean.o[l].view().element_ptr({pos}));
        const float* ox = static_cast<const float*>(corrupt.o[l].view().element_ptr({pos}));
        for (int64_t h = 0; h < H; ++h) {
          double readout = 0;
          for (int64_t i = 0; i < D; ++i) {
            double contribution = 0;
            for (int64_t k = 0; k < d; ++k) {
              contribution += f(layer_prefix(l) + "self_attn.o_proj.weight")[i * H * d + h * d + k] *
                              (static_cast<double>(oc[h * d + k]) - ox[h * d + k]);
            }
            readout += f("model.norm.weight")[i] * contribution *
                       (static_cast<double>(f("lm_head.weight")[a * D + i]) - f("lm_head.weight")[b * D + i]) / rms;
          }
          direct[l][h] += readout / static_cast<double>(prompts.size());
        }
      }
    }
  }
  double scale = 0;
  for (const auto& row : direct)
    for (double v : row) scale = std::max(scale, std::abs(v));
  ASSERT_GT(scale, 0.0);
  for (int64_t l = 0; l < L; ++l)
    for (int64_t h = 0; h < H; ++h) EXPECT_NEAR(s.direct[l][h], direct[l][h], 1e-4 * scale) << l << "," << h;

  // total and lm of head (1, 3) by the test's own patched and mean-ablated forwards.
  const int64_t pl = 1, ph = 3;
  double drop = 0, gap = 0;
  for (const CalibrationPrompt& p : prompts) {
    Capture corrupt;
    const double lp_corrupt = answer_logprob(model, run(model, p.corrupted, &corrupt), p);
    Overwrite patch;
    patch.layer = pl;
    patch.head = ph;
    patch.from = p.patch_start;
    patch.source = &corrupt.o[pl];
    const double lp_clean = answer_logprob(model, run(model, p.clean, nullptr), p);
    drop += lp_clean - answer_logprob(model, run(model, p.clean, &patch), p);
    gap += lp_clean - lp_corrupt;
  }
  const double n = static_cast<double>(prompts.size());
  const double total = gap / n >= heads::kMinLogprobGap ? drop / gap : drop / n;
  EXPECT_NEAR(s.total[pl][ph], total, 1e-5 + 1e-4 * std::abs(total));
  EXPECT_NE(total, 0.0);

  // Group patching of layer pl by the test's own forwards: every head, and every head but ph.
  ASSERT_TRUE(s.groups);
  for (const bool all : {true, false}) {
    double group_drop = 0;
    for (const CalibrationPrompt& p : prompts) {
      Capture corrupt;
      run(model, p.corrupted, &corrupt);
      OverwriteHeads patch;
      patch.layer = pl;
      patch.from = p.patch_start;
      patch.source = &corrupt.o[pl];
      for (int64_t h = 0; h < H; ++h)
        if (all || h != ph) patch.heads.push_back(h);
      group_drop += answer_logprob(model, run(model, p.clean, nullptr), p) - answer_logprob(model, run(model, p.clean, &patch), p);
    }
    const double expected = gap / n >= heads::kMinLogprobGap ? group_drop / gap : group_drop / n;
    const double got = all ? s.layer_total[pl] : s.all_but_one[pl][ph];
    EXPECT_NEAR(got, expected, 1e-5 + 1e-4 * std::abs(expected)) << (all ? "whole layer" : "all but one");
    EXPECT_NE(expected, 0.0);
  }

  std::vector<double> mean(static_cast<size_t>(d), 0.0);
  for (const auto& ids : text) {
    Capture cap;
    run(model, ids, &cap);
    for (int64_t t = 0; t < static_cast<int64_t>(ids.size()); ++t)
      for (int64_t k = 0; k < d; ++k) mean[k] += static_cast<const float*>(cap.o[pl].view().element_ptr({t, ph}))[k] / 80.0;
  }
  const auto nll = [&](const Tensor& hidden, const std::vector<int32_t>& ids) {
    double sum = 0;
    Tensor logits = Tensor::empty({static_cast<int64_t>(ids.size()), c.vocab_size}, DType::f32);
    model.lm_head(logits, hidden);
    for (size_t t = 0; t + 1 < ids.size(); ++t) {
      sum -= niah::score_token({logits.data_as<float>() + t * c.vocab_size, static_cast<size_t>(c.vocab_size)}, ids[t + 1]).logprob;
    }
    return sum;
  };
  Overwrite ablate;
  ablate.layer = pl;
  ablate.head = ph;
  ablate.from = 0;
  ablate.constant.assign(mean.begin(), mean.end());
  double lm = 0;
  for (const auto& ids : text) lm += (nll(run(model, ids, &ablate), ids) - nll(run(model, ids, nullptr), ids)) / 78.0;
  EXPECT_NEAR(s.lm[pl][ph], lm, 1e-5 + 1e-4 * std::abs(lm));
  EXPECT_NE(lm, 0.0);
}

TEST(HeadSelection, CompositeNormalisesEachScoreByItsLargestMagnitude) {
  heads::HeadScores s;
  s.total = {{0.5, -1.0}, {0.25, 0.0}};
  s.direct = {{2.0, 4.0}, {-8.0, 0.0}};
  s.lm = {{0.0, 0.0}, {0.0, 0.0}};  // all zero: contributes nothing, whatever its weight
  const heads::CompositeScores c = heads::composite_scores(s, {.total = 1.0, .direct = 2.0, .lm = 7.0});
  EXPECT_DOUBLE_EQ(c.scale_total, 1.0);
  EXPECT_DOUBLE_EQ(c.scale_direct, 8.0);
  EXPECT_DOUBLE_EQ(c.scale_lm, 0.0);
  EXPECT_DOUBLE_EQ(c.composite[0][0], 0.5 + 2 * 0.25);
  EXPECT_DOUBLE_EQ(c.composite[0][1], -1.0 + 2 * 0.5);
  EXPECT_DOUBLE_EQ(c.composite[1][0], 0.25 - 2 * 1.0);
  EXPECT_DOUBLE_EQ(c.composite[1][1], 0.0);
}

TEST(HeadSelection, BudgetsAreRespectedWithDeterministicTies) {
  const Grid g = {{0.1, 0.9, 0.9, 0.0}, {0.9, 0.2, 0.3, 0.3}, {-1.0, -2.0, -0.5, -0.5}};
  using V = std::vector<std::vector<int>>;
  // Global: 0.9 three times (ties: lower layer, then lower head), then 0.3 (1,2) before (1,3).
  EXPECT_EQ(heads::choose_fa_heads(g, {3, heads::BudgetMode::global}), (V{{1, 2}, {0}, {}}));
  EXPECT_EQ(heads::choose_fa_heads(g, {4, heads::BudgetMode::global}), (V{{1, 2}, {0, 2}, {}}));
  EXPECT_EQ(heads::choose_fa_heads(g, {12, heads::BudgetMode::global}), (V{{0, 1, 2, 3}, {0, 1, 2, 3}, {0, 1, 2, 3}}));
  // Per layer: exactly K in every layer, even where every score is negative.
  EXPECT_EQ(heads::choose_fa_heads(g, {2, heads::BudgetMode::per_layer}), (V{{1, 2}, {0, 2}, {2, 3}}));
  EXPECT_EQ(heads::choose_fa_heads(g, {1, heads::BudgetMode::per_layer}), (V{{1}, {0}, {2}}));
  EXPECT_NE(error_of([&] { heads::choose_fa_heads(g, {13, heads::BudgetMode::global}); }).find("must be in 1..12"),
            std::string::npos);
  EXPECT_NE(error_of([&] { heads::choose_fa_heads(g, {5, heads::BudgetMode::per_layer}); }).find("must be in 1..4"),
            std::string::npos);
  EXPECT_NE(error_of([&] { heads::choose_fa_heads(g, {0, heads::BudgetMode::global}); }), "(no error)");
}

TEST(HeadSelection, HeadSetFileIsWhatConvertReads) {
  TempDir dir;
  const NeedleHeadModel m = make_needle_head_model();
  heads::SelectionReport r;
  r.model = "test";
  r.config = m.config;
  r.budget = {2, heads::BudgetMode::per_layer};
  r.scores.total = {{0.1, 0.2, 0.3, 0.4}, {0.4, 0.3, 0.2, 0.1}};
  r.scores.direct = r.scores.total;
  r.scores.lm = {{0, 0, 0, 0}, {0, 0, 0, 0}};
  r.composite = heads::composite_scores(r.scores, r.weights);
  r.fa_heads = heads::choose_fa_heads(r.composite.composite, r.budget);
  r.selection_json = R"({"tool": "test", "budget": 2})";
  const std::string path = dir.file("heads.json");
  heads::write_heads_json(path, r);
  heads::write_heads_h5(dir.file("heads.h5"), r);
  EXPECT_EQ(r.fa_heads, (std::vector<std::vector<int>>{{2, 3}, {0, 1}}));
  EXPECT_EQ(resolve_fa_heads("file:" + path, m.config, ""), r.fa_heads);
  // uniform:K with --scores ranks by the written composite.
  EXPECT_EQ(resolve_fa_heads("uniform:1", m.config, path), (std::vector<std::vector<int>>{{3}, {0}}));
  const FaHeadsFile back = read_fa_heads_file(path, m.config);
  EXPECT_EQ(back.scores.size(), 4u);
  EXPECT_EQ(back.selection_json, R"({"budget":2,"tool":"test"})");
  const H5File h5 = H5File::open_read(dir.file("heads.h5"));
  EXPECT_EQ(h5.string_attribute("format"), "hydrahead-head-scores");
  EXPECT_EQ(h5.dataset_info("composite").shape, (std::vector<int64_t>{2, 4}));
  const Tensor mask = h5.read("fa_mask");
  EXPECT_EQ(mask.data_as<int32_t>()[2], 1);
  EXPECT_EQ(mask.data_as<int32_t>()[4], 1);
  EXPECT_EQ(mask.data_as<int32_t>()[7], 0);
}

TEST(HeadSelection, RefusesAHydraHeadModel) {
  const ModelConfig c = preset_config("hydrahead-tiny");
  const Model model(c, random_parameters(c, 1));
  SelfCommunicator self;
  SequenceGroups alone(self, 0);
  const std::vector<CalibrationPrompt> prompts = needle_prompts();
  EXPECT_NE(error_of([&] { heads::score_heads(model, alone, prompts, {}); }).find("Qwen3 teacher"), std::string::npos);
}

}  // namespace
}  // namespace hydra::test
