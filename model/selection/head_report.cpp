#include "model/selection/head_report.h"

#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "model/fa_heads_file.h"
#include "runtime/atomic_file.h"
#include "runtime/hdf5_file.h"

namespace hydra::heads {
namespace {

Tensor grid_tensor(const Grid& g) {  // [L, H] float32
  const int64_t L = static_cast<int64_t>(g.size()), H = L ? static_cast<int64_t>(g.front().size()) : 0;
  Tensor t = Tensor::empty({L, H}, DType::f32);
  for (int64_t l = 0; l < L; ++l)
    for (int64_t h = 0; h < H; ++h) t.data_as<float>()[l * H + h] = static_cast<float>(g[l][h]);
  return t;
}

std::string weights_json(const ScoreWeights& w) {
  return nlohmann::ordered_json{{"total", w.total}, {"direct", w.direct}, {"lm", w.lm}}.dump();
}

const char* mode_name(BudgetMode mode) { return mode == BudgetMode::per_layer ? "per_layer" : "global"; }

}  // namespace

nlohmann::ordered_json concentration_json(const HeadScores& scores) {
  const Concentration c = concentration(scores.direct);
  nlohmann::ordered_json top = nlohmann::ordered_json::object();
  for (const auto& [k, share] : c.top_share) top[std::to_string(k)] = share;
  nlohmann::ordered_json out = {{"concentration", {{"layer_share", c.layer_share},
                                                   {"top_share", top},
                                                   {"effective_heads", c.effective_heads},
                                                   {"positive_direct", c.positive_total}}}};
  if (scores.groups) out["groups"] = {{"layer_total", scores.layer_total}, {"all_but_one", scores.all_but_one}};
  return out;
}

void write_heads_json(const std::string& path, const SelectionReport& report) {
  FaHeadsFile file;
  file.fa_heads = report.fa_heads;
  file.scores = {{"composite", report.composite.composite},
                 {"total", report.scores.total},
                 {"direct", report.scores.direct},
                 {"lm", report.scores.lm}};
  if (report.scores.groups) file.scores["all_but_one"] = report.scores.all_but_one;
  file.selection_json = report.selection_json;
  write_fa_heads_file(path, report.config, file);
}

void write_heads_h5(const std::string& path, const SelectionReport& report) {
  const int64_t L = report.config.num_layers, H = report.config.num_heads;
  require_writable_destination(path, "HDF5 head scores");
  AtomicFile out(path);
  H5File file = H5File::create(out.temp_path());
  file.set_attribute("format", std::string("hydrahead-head-scores"));
  file.set_attribute("format_version", int64_t{1});
  file.set_attribute("model", report.model);
  file.set_attribute("num_layers", L);
  file.set_attribute("num_heads", H);
  file.set_attribute("budget", report.budget.heads);
  file.set_attribute("mode", std::string(mode_name(report.budget.mode)));
  file.set_attribute("weights", weights_json(report.weights));
  file.set_attribute("selection", report.selection_json);
  file.write("composite", grid_tensor(report.composite.composite));
  file.write("total", grid_tensor(report.scores.total));
  file.write("direct", grid_tensor(report.scores.direct));
  file.write("lm", grid_tensor(report.scores.lm));
  Tensor mask = Tensor::zeros({L, H}, DType::i32);
  for (int64_t l = 0; l < L; ++l)
    for (int h : report.fa_heads[static_cast<size_t>(l)]) mask.data_as<int32_t>()[l * H + h] = 1;
  file.write("fa_mask", mask);
  if (report.scores.groups) file.write("all_but_one", grid_tensor(report.scores.all_but_one));
  file.close();
  out.commit();
}

std::string format_heads_table(const SelectionReport& report, int64_t top) {
  const int64_t L = report.config.num_layers, H = report.config.num_heads;
  const Grid& c = report.composite.composite;
  std::string text = fmt::format("head selection: composite score by layer (rows) and head (columns), * = full attention "
                                 "({} budget {})\n",
                                 mode_name(report.budget.mode), report.budget.heads);
  text += fmt::format("{:>6}", "layer");
  for (int64_t h = 0; h < H; ++h) text += fmt::format(" {:>8}", h);
  text += "\n";
  for (int64_t l = 0; l < L; ++l) {
    text += fmt::format("{:>6}", l);
    const auto& fa = report.fa_heads[static_cast<size_t>(l)];
    for (int64_t h = 0; h < H; ++h) {
      const bool keep = std::find(fa.begin(), fa.end(), static_cast<int>(h)) != fa.end();
      text += fmt::format(" {:>7.3f}{}", c[l][h], keep ? '*' : ' ');
    }
    text += "\n";
  }
  std::vector<std::pair<int64_t, int64_t>> order;
  for (int64_t l = 0; l < L; ++l)
    for (int64_t h = 0; h < H; ++h) order.emplace_back(l, h);
  std::stable_sort(order.begin(), order.end(), [&](const auto& x, const auto& y) { return c[x.first][x.second] > c[y.first][y.second]; });
  text += fmt::format("top heads: {:>5} {:>4} {:>10} {:>10} {:>10} {:>10}\n", "layer", "head", "composite", "total",
                      "direct", "lm");
  for (int64_t k = 0; k < std::min<int64_t>(top, L * H); ++k) {
    const auto [l, h] = order[static_cast<size_t>(k)];
    text += fmt::format("           {:>5} {:>4} {:>10.4f} {:>10.4g} {:>10.4g} {:>10.4g}\n", l, h, c[l][h],
                        report.scores.total[l][h], report.scores.direct[l][h], report.scores.lm[l][h]);
  }
  const Concentration k = concentration(report.scores.direct);
  text += fmt::format("concentration of the positive direct effect ({:.4g} in all): effective heads {:.2f} of {}; top-k share",
                      k.positive_total, k.effective_heads, L * H);
  for (const auto& [n, share] : k.top_share) text += fmt::format(" {}:{:.3f}", n, share);
  text += "\nper-layer share:";
  for (int64_t l = 0; l < L; ++l) text += fmt::format(" {}:{:.3f}", l, k.layer_share[static_cast<size_t>(l)]);
  text += "\n";
  if (report.scores.groups) {
    text += "group patching (total effect): whole layer";
    for (int64_t l = 0; l < L; ++l) text += fmt::format(" {}:{:.3f}", l, report.scores.layer_total[static_cast<size_t>(l)]);
    text += "\n  all heads of the layer but one (rows: layers, columns: the head left clean)\n";
    for (int64_t l = 0; l < L; ++l) {
      text += fmt::format("{:>6}", l);
      for (int64_t h = 0; h < H; ++h) text += fmt::format(" {:>8.3f}", report.scores.all_but_one[l][h]);
      text += "\n";
    }
  }
  return text;
}

}  // namespace hydra::heads
