#include "model/eval/niah_report.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "runtime/atomic_file.h"
#include "runtime/hdf5_file.h"
#include "runtime/sizes.h"

namespace hydra::niah {
namespace {

using ordered_json = nlohmann::ordered_json;

ordered_json number_or_null(double x) { return std::isfinite(x) ? ordered_json(x) : ordered_json(nullptr); }

ordered_json sample_json(const Report& r, const SampleResult& s) {
  return ordered_json{{"type", "sample"},
                      {"task", r.tasks.at(static_cast<size_t>(s.task))},
                      {"length", s.length},
                      {"depth", s.depth},
                      {"sample", s.index},
                      {"correct", s.correct},
                      {"recall", s.recall},
                      {"logprob", number_or_null(s.logprob)},
                      {"answer_start", s.answer_start},
                      {"answer_length", s.answer.size()},
                      {"needle_position", s.needle_position},
                      {"answer", s.answer},
                      {"predicted", s.predicted},
                      {"score", r.scoring},
                      {"seconds", s.seconds}};
}

ordered_json cell_json(const Report& r, const CellResult& c) {
  ordered_json j{{"type", "cell"},
                {"task", r.tasks.at(static_cast<size_t>(c.task))},
                {"length", c.length},
                {"depth", c.depth},
                {"samples", c.samples},
                {"correct", c.correct},
                {"accuracy", c.accuracy()},
                {"mean_recall", c.mean_recall},
                {"mean_logprob", number_or_null(c.mean_logprob)},
                {"score", r.scoring},
                {"seconds", c.seconds}};
  if (!c.sized.empty()) j["sized"] = c.sized;
  return j;
}

template <class T, class F>
Tensor column(const std::vector<T>& rows, DType dtype, F&& get) {
  Tensor t = Tensor::empty({static_cast<int64_t>(rows.size())}, dtype);
  for (size_t i = 0; i < rows.size(); ++i) {
    switch (dtype) {
      case DType::i32: t.data_as<int32_t>()[i] = static_cast<int32_t>(get(rows[i])); break;
      case DType::i64: t.data_as<int64_t>()[i] = static_cast<int64_t>(get(rows[i])); break;
      default: t.data_as<float>()[i] = static_cast<float>(get(rows[i])); break;
    }
  }
  return t;
}

}  // namespace

void Report::add_cell(const CellResult& cell, std::vector<SampleResult> cell_samples) {
  cells.push_back(cell);
  for (auto& s : cell_samples) samples.push_back(std::move(s));
}

void write_jsonl(const std::string& path, const Report& report) {
  AtomicFile out(path);
  {
    std::ofstream f(out.temp_path());
    size_t next = 0;
    for (const CellResult& c : report.cells) {
      for (int64_t i = 0; i < c.samples; ++i) f << sample_json(report, report.samples.at(next++)).dump() << '\n';
      f << cell_json(report, c).dump() << '\n';
    }
    f.flush();
    HYDRA_USER_CHECK(f.good(), "{}: writing the results failed (disk full?)", path);
  }
  out.commit();
}

void write_results_h5(const std::string& path, const Report& report) {
  AtomicFile out(path);
  H5File file = H5File::create(out.temp_path());
  file.set_attribute("format", std::string("hydrahead-niah-results"));
  file.set_attribute("format_version", int64_t{1});
  file.set_attribute("model", report.model);
  file.set_attribute("source", report.source);
  file.set_attribute("ranks", int64_t{report.ranks});
  file.set_attribute("seed", static_cast<int64_t>(report.seed));
  file.set_attribute("scoring", report.scoring);
  file.set_attribute("tasks", nlohmann::json(report.tasks).dump());
  file.set_attribute("cells_done", static_cast<int64_t>(report.cells.size()));
  file.set_attribute("cells_total", report.cells_total);
  const auto& s = report.samples;
  file.write("sample_task", column(s, DType::i32, [](const SampleResult& x) { return x.task; }));
  file.write("sample_length", column(s, DType::i64, [](const SampleResult& x) { return x.length; }));
  file.write("sample_depth", column(s, DType::i64, [](const SampleResult& x) { return x.depth; }));
  file.write("sample_index", column(s, DType::i64, [](const SampleResult& x) { return x.index; }));
  file.write("sample_answer_start", column(s, DType::i64, [](const SampleResult& x) { return x.answer_start; }));
  file.write("sample_needle_position", column(s, DType::i64, [](const SampleResult& x) { return x.needle_position; }));
  file.write("sample_correct", column(s, DType::i32, [](const SampleResult& x) { return x.correct ? 1 : 0; }));
  file.write("sample_recall", column(s, DType::f32, [](const SampleResult& x) { return x.recall; }));
  file.write("sample_logprob", column(s, DType::f32, [](const SampleResult& x) { return x.logprob; }));
  file.write("sample_seconds", column(s, DType::f32, [](const SampleResult& x) { return x.seconds; }));
  std::vector<int64_t> offset{0};
  std::vector<int32_t> answers, predicted;
  for (const SampleResult& x : s) {
    answers.insert(answers.end(), x.answer.begin(), x.answer.end());
    predicted.insert(predicted.end(), x.predicted.begin(), x.predicted.end());
    offset.push_back(static_cast<int64_t>(answers.size()));
  }
  file.write("answer_offset", TensorView(offset.data(), DType::i64, Device::host, {static_cast<int64_t>(offset.size())}));
  file.write("answer_tokens", TensorView(answers.data(), DType::i32, Device::host, {static_cast<int64_t>(answers.size())}));
  file.write("predicted_tokens",
             TensorView(predicted.data(), DType::i32, Device::host, {static_cast<int64_t>(predicted.size())}));
  const auto& c = report.cells;
  file.write("cell_task", column(c, DType::i32, [](const CellResult& x) { return x.task; }));
  file.write("cell_length", column(c, DType::i64, [](const CellResult& x) { return x.length; }));
  file.write("cell_depth", column(c, DType::i64, [](const CellResult& x) { return x.depth; }));
  file.write("cell_samples", column(c, DType::i64, [](const CellResult& x) { return x.samples; }));
  file.write("cell_correct", column(c, DType::i64, [](const CellResult& x) { return x.correct; }));
  file.write("cell_accuracy", column(c, DType::f32, [](const CellResult& x) { return x.accuracy(); }));
  file.write("cell_mean_recall", column(c, DType::f32, [](const CellResult& x) { return x.mean_recall; }));
  file.write("cell_mean_logprob", column(c, DType::f32, [](const CellResult& x) { return x.mean_logprob; }));
  file.write("cell_seconds", column(c, DType::f32, [](const CellResult& x) { return x.seconds; }));
  file.close();
  out.commit();
}

std::string format_ruler_table(const Report& report) {
  std::set<int64_t> lengths;
  for (const CellResult& c : report.cells) lengths.insert(c.length);
  if (lengths.empty()) return "";
  // [task][length] -> (Σ recall over samples, samples)
  std::vector<std::map<int64_t, std::pair<double, int64_t>>> sums(report.tasks.size());
  for (const CellResult& c : report.cells) {
    auto& e = sums[static_cast<size_t>(c.task)][c.length];
    e.first += c.mean_recall * static_cast<double>(c.samples);
    e.second += c.samples;
  }
  size_t width = 7;
  for (const std::string& t : report.tasks) width = std::max(width, t.size());
  std::string text = report.scoring == "generate"
                         ? "RULER score (generate: mean recall of the generated answers, RULER's string_match_all, %): "
                           "tasks (rows) by length (columns)\n"
                         : "Recall of the teacher-forced arg-maxes (teacher-forced: not RULER's score, which reads "
                           "generated text: --score generate), %: tasks (rows) by length (columns)\n";
  text += fmt::format("{:<{}}", "task", width);
  for (int64_t l : lengths) text += fmt::format(" {:>7}", format_size(l));
  text += fmt::format(" {:>7}\n", "avg");
  std::map<int64_t, std::pair<double, int64_t>> column;  // length -> (Σ task scores, tasks)
  double all = 0;
  int64_t rows = 0;
  const auto entry = [](double v) { return fmt::format(" {:>7.1f}", 100 * v); };
  for (size_t t = 0; t < report.tasks.size(); ++t) {
    if (sums[t].empty()) continue;
    text += fmt::format("{:<{}}", report.tasks[t], width);
    double row = 0;
    int64_t cols = 0;
    for (int64_t l : lengths) {
      const auto it = sums[t].find(l);
      if (it == sums[t].end() || it->second.second == 0) {
        text += fmt::format(" {:>7}", "-");
        continue;
      }
      const double score = it->second.first / static_cast<double>(it->second.second);
      text += entry(score);
      row += score;
      ++cols;
      column[l].first += score;
      ++column[l].second;
    }
    text += entry(cols ? row / static_cast<double>(cols) : 0.0) + "\n";
    all += cols ? row / static_cast<double>(cols) : 0.0;
    ++rows;
  }
  text += fmt::format("{:<{}}", "avg", width);
  for (int64_t l : lengths) {
    const auto [sum, n] = column[l];
    text += n ? entry(sum / static_cast<double>(n)) : fmt::format(" {:>7}", "-");
  }
  text += entry(rows ? all / static_cast<double>(rows) : 0.0) + "\n";
  return text;
}

std::string format_table(const Report& report) {
  std::string text;
  for (size_t t = 0; t < report.tasks.size(); ++t) {
    std::set<int64_t> lengths, depths;
    std::map<std::pair<int64_t, int64_t>, const CellResult*> at;  // (depth, length) -> cell
    for (const CellResult& c : report.cells) {
      if (c.task != static_cast<int>(t)) continue;
      lengths.insert(c.length);
      depths.insert(c.depth);
      at[{c.depth, c.length}] = &c;
    }
    if (at.empty()) continue;
    text += fmt::format("NIAH {}: accuracy ({}) by depth (rows) and length (columns)\n", report.tasks[t],
                        report.scoring == "generate" ? "generate: the greedy answer generated" : "teacher-forced: the greedy verdict");
    text += fmt::format("{:>7}", "depth");
    for (int64_t l : lengths) text += fmt::format(" {:>7}", format_size(l));
    text += fmt::format(" {:>7}\n", "mean");
    // Means weight every sample equally (cells may hold different sample counts in an eval set).
    std::map<int64_t, std::pair<int64_t, int64_t>> by_length;  // length -> (correct, samples)
    int64_t all_correct = 0, all_samples = 0;
    for (int64_t d : depths) {
      text += fmt::format("{:>6}%", d);
      int64_t correct = 0, samples = 0;
      for (int64_t l : lengths) {
        const auto it = at.find({d, l});
        if (it == at.end()) {
          text += fmt::format(" {:>7}", "-");
          continue;
        }
        text += fmt::format(" {:>7.3f}", it->second->accuracy());
        correct += it->second->correct;
        samples += it->second->samples;
        by_length[l].first += it->second->correct;
        by_length[l].second += it->second->samples;
      }
      text += fmt::format(" {:>7.3f}\n", samples ? static_cast<double>(correct) / samples : 0.0);
      all_correct += correct;
      all_samples += samples;
    }
    text += fmt::format("{:>7}", "mean");
    for (int64_t l : lengths) {
      const auto [correct, samples] = by_length[l];
      text += fmt::format(" {:>7.3f}", samples ? static_cast<double>(correct) / samples : 0.0);
    }
    text += fmt::format(" {:>7.3f}\n", all_samples ? static_cast<double>(all_correct) / all_samples : 0.0);
  }
  return text;
}

}  // namespace hydra::niah
