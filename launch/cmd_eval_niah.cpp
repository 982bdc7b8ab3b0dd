// hydra eval-niah: needle-in-a-haystack accuracy by depth × length, sequence-parallel over the
// MPI ranks. Every rank generates (or reads) the same samples; each sample is one prefill over the
// zigzag layout and is scored by teacher forcing (model/eval/niah.h says why that is the greedy
// verdict); beyond the forward, the ranks exchange only two small all-reduces of the answer rows'
// verdicts per sample. Tasks come from the built-in token-space generator
// (--task/--lengths/--depths/--samples/--seed) or from an HDF5 eval set (--dataset, model/eval/niah_set.h).
// Outputs (model/eval/niah_report.h): JSON lines (--out), an HDF5 copy (--out-h5, default: --out with
// .jsonl/.json replaced by .h5, or .h5 appended), the accuracy table on stdout, a progress line per
// cell on stderr, and a final one-line JSON summary on stdout.
// Every input check (tasks, depths, lengths against the task and the rank count, the set's ids)
// runs before the weights are read.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <set>

#include <nlohmann/json.hpp>

#include "launch/cli.h"
#include "launch/model_source.h"
#include "model/cost.h"
#include "model/eval/niah_report.h"
#include "model/eval/niah.h"
#include "model/eval/niah_set.h"
#include "model/nonfinite.h"
#include "parallel/device_world.h"
#include "runtime/atomic_file.h"
#include "runtime/log.h"
#include "runtime/sizes.h"
#if HYDRA_CUDA
#include "runtime/cuda_memory.h"
#endif

namespace hydra {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct EvalNiahOptions {
  ModelSource model;
  std::string tasks = "single";
  std::string lengths;
  std::string depths = "0,10,20,30,40,50,60,70,80,90,100";
  int64_t samples = 4;
  uint64_t seed = 0;
  std::string value_length = "2..4";
  int64_t key_length = 2;
  int64_t distractors = 3;
  int64_t values = 3;
  std::string dataset;
  std::string out, out_h5;
  std::string device = "auto";
  double nccl_timeout = 600;
  std::set<std::string> given;  // generator flags given on the command line (they conflict with --dataset)

  void bind(po::options_description& o) {
    // --model/--preset as every command has them (ModelSource); the preset's weight seed is
    // --weight-seed here because --seed is the task seed.
    const auto mark = [this](const char* flag) {
      return [this, flag](const auto&) { given.insert(flag); };
    };
    model.bind(o, "weight-seed");
    o.add_options()
        ("task", po::value(&tasks)->notifier(mark("task")), "single, multikey or multivalue, or a comma list (default single)")
        ("lengths", po::value(&lengths)->notifier(mark("lengths")), "sample lengths in tokens, e.g. 4K,16K,128K,512K (required without --dataset)")
        ("depths", po::value(&depths)->notifier(mark("depths")), "needle depths in percent (default 0,10,...,100)")
        ("samples", po::value(&samples)->notifier(mark("samples")), "samples per cell (default 4)")
        ("seed", po::value(&seed)->notifier(mark("seed")), "task seed: samples are a function of (seed, task, length, depth, index) (default 0)")
        ("value-length", po::value(&value_length)->notifier(mark("value-length")), "value length in tokens: N or MIN..MAX (default 2..4)")
        ("key-length", po::value(&key_length)->notifier(mark("key-length")), "key length in tokens (default 2)")
        ("distractors", po::value(&distractors)->notifier(mark("distractors")), "multikey: needles with other keys (default 3)")
        ("values", po::value(&values)->notifier(mark("values")), "multivalue: values of the queried key (default 3)")
        ("dataset", po::value(&dataset), "instead of the generator: an HDF5 NIAH eval set (cluster/niah/build_niah_set.py)")
        ("out", po::value(&out)->required(), "results as JSON lines (per sample and per cell), written by rank 0")
        ("out-h5", po::value(&out_h5), "HDF5 copy of the results (default: --out with .jsonl replaced by .h5)")
        ("device", po::value(&device)->default_value("auto"), "cuda, cpu or auto (cuda when a GPU is present): one GPU per rank")
        ("nccl-timeout", po::value(&nccl_timeout)->default_value(600), "seconds before a stuck NCCL operation ends the job");
    ModelSource::bind_allow_nonfinite(o, &model.allow_nonfinite);
  }

  // Flag-level checks (nothing is read); fills in the default --out-h5.
  void validate() {
    model.validate();
    if (!dataset.empty()) {
      require_readable_file(dataset, "NIAH eval set");
      for (const std::string& flag : given) {
        HYDRA_USER_FAIL("--{} configures the built-in generator; it cannot be combined with --dataset", flag);
      }
    } else {
      HYDRA_USER_CHECK(!lengths.empty(), "give --lengths (e.g. 4K,16K) or --dataset FILE.h5");
      HYDRA_USER_CHECK(samples >= 1, "--samples must be at least 1 (got {})", samples);
      for (int64_t d : depth_list()) HYDRA_USER_CHECK(d >= 0 && d <= 100, "--depths: {} is outside 0..100 (percent)", d);
      for (int64_t l : length_list()) HYDRA_USER_CHECK(l >= 1, "--lengths: {} is not a length", l);
      task_params();  // parses --task and --value-length
    }
    if (out_h5.empty()) out_h5 = default_h5_path(out);
    require_writable_destination(out, "results");
    require_writable_destination(out_h5, "HDF5 results");
    HYDRA_USER_CHECK(out_h5 != out, "--out-h5 must differ from --out ({})", out);
  }

  std::vector<int64_t> length_list() const { return parse_size_list(lengths, "--lengths"); }
  std::vector<int64_t> depth_list() const { return parse_int_list(depths, "--depths"); }
  std::vector<niah::TaskParams> task_params() const {
    std::vector<niah::TaskParams> out_params;
    int64_t vmin = 0, vmax = 0;
    const size_t dots = value_length.find("..");
    const std::string lo = dots == std::string::npos ? value_length : value_length.substr(0, dots);
    const std::string hi = dots == std::string::npos ? value_length : value_length.substr(dots + 2);
    const std::vector<int64_t> a = parse_int_list(lo, "--value-length"), b = parse_int_list(hi, "--value-length");
    HYDRA_USER_CHECK(a.size() == 1 && b.size() == 1, "--value-length: '{}' is not N or MIN..MAX", value_length);
    vmin = a[0];
    vmax = b[0];
    for (const std::string& name : split_list(tasks)) {
      niah::TaskParams p;
      p.task = niah::parse_task(name);
      p.key_length = key_length;
      p.value_length_min = vmin;
      p.value_length_max = vmax;
      p.distractors = distractors;
      p.values = values;
      out_params.push_back(p);
    }
    return out_params;
  }

  static std::vector<std::string> split_list(const std::string& text) {
    std::vector<std::string> parts{""};
    for (char c : text) {
      if (c == ',') {
        parts.emplace_back();
      } else if (c != ' ') {
        parts.back() += c;
      }
    }
    for (const auto& p : parts) HYDRA_USER_CHECK(!p.empty(), "--task: empty entry in '{}'", text);
    return parts;
  }

  static std::string default_h5_path(const std::string& path) {
    for (const char* ext : {".jsonl", ".json"}) {
      const std::string e(ext);
      if (path.size() > e.size() && path.compare(path.size() - e.size(), e.size(), e) == 0) {
        return path.substr(0, path.size() - e.size()) + ".h5";
      }
    }
    return path + ".h5";
  }
};

// One cell of work: its labels and how to get sample i (generated on demand, or from the set).
struct CellPlan {
  int task = 0;
  int64_t length = 0, depth = 0, samples = 0;
  std::function<niah::Sample(int64_t)> sample;
};

// The layout must admit every length for this rank count (same rule and message as hydra forward),
// and a HydraHead model's segments must hold the conv halo. `where` prefixes the message (a set's sample).
void check_length_for_ranks(int64_t length, const ModelConfig& config, int ranks, const std::string& where = "") {
  SequenceLayout layout;
  try {
    layout = SequenceLayout::zigzag(length, ranks, 0);
  } catch (const UserError& e) {
    HYDRA_USER_FAIL("{}{}", where, e.what());
  }
  if (ranks > 1 && config.is_hydra()) {
    HYDRA_USER_CHECK(layout.segment_length() >= config.conv_kernel - 1,
                     "{}length {} on {} ranks gives segments of {} token(s), shorter than the conv halo ({} rows); use a "
                     "longer sequence or fewer ranks",
                     where, length, ranks, layout.segment_length(), config.conv_kernel - 1);
  }
}

}  // namespace

int run_eval_niah(App& app, const std::vector<std::string>& args) {
  EvalNiahOptions opt;
  po::options_description desc("hydra eval-niah");
  opt.bind(desc);
  if (!parse_command_line(app, "eval-niah",
                          "(--model FILE.h5 | --preset NAME) (--lengths 4K,16K,... [--task single|multikey|multivalue] "
                          "[--depths 0,10,...,100] [--samples N] [--seed S] | --dataset SET.h5) --out RESULTS.jsonl",
                          desc, args)) {
    return 0;
  }
  opt.validate();
  const ModelConfig config = opt.model.config();
  const int64_t vocab = config.vocab_size;
  const int ranks = app.world.size();
  // GPU: bf16 weights; CPU: the fp32 reference path.
  const Device device = resolve_device(opt.device, app.mpi);
  const DType dtype = device == Device::cuda ? DType::bf16 : DType::f32;

  // Plan every cell and check every input before the weights are read.
  niah::Report report;
  report.model = opt.model.describe();
  report.ranks = ranks;
  RunFingerprint inputs;
  add_model_fields(inputs, config, device, dtype);
  int64_t longest = 0;
  std::vector<CellPlan> plan;
  if (opt.dataset.empty()) {
    report.source = "builtin";
    report.seed = opt.seed;
    const std::vector<niah::TaskParams> params = opt.task_params();
    const std::vector<int64_t> lengths = opt.length_list(), depths = opt.depth_list();
    for (const niah::TaskParams& p : params) {
      p.validate(vocab);
      for (int64_t length : lengths) {
        HYDRA_USER_CHECK(length >= p.min_length(),
                         "--lengths: {} is too short for NIAH task {}: its needles, query and answer need up to {} tokens",
                         length, niah::task_name(p.task), p.min_length());
      }
    }
    for (int64_t length : lengths) {
      check_length_for_ranks(length, config, ranks);
      longest = std::max(longest, length);
    }
    for (size_t t = 0; t < params.size(); ++t) {
      report.tasks.push_back(niah::task_name(params[t].task));
      for (int64_t length : lengths) {
        for (int64_t depth : depths) {
          const niah::TaskParams p = params[t];
          const uint64_t seed = opt.seed;
          plan.push_back(CellPlan{static_cast<int>(t), length, depth, opt.samples, [p, vocab, seed, length, depth](int64_t i) {
                                    return niah::generate_sample(p, vocab, seed, length, depth, i);
                                  }});
        }
      }
    }
  } else {
    auto set = std::make_shared<niah::EvalSet>(niah::read_eval_set(opt.dataset, vocab));
    report.source = opt.dataset;
    report.tasks.push_back(set->task);
    std::vector<int32_t> all_ids;
    for (const niah::Sample& s : set->samples) all_ids.insert(all_ids.end(), s.ids.begin(), s.ids.end());
    inputs.add("eval set task", set->task);
    inputs.add("eval set samples", std::to_string(set->samples.size()));
    inputs.add_tokens("eval set tokens", all_ids);
    std::map<std::pair<int64_t, int64_t>, size_t> cell_of;  // (length, depth) -> plan index
    auto members = std::make_shared<std::vector<std::vector<size_t>>>();
    for (size_t i = 0; i < set->samples.size(); ++i) {
      const niah::Sample& s = set->samples[i];
      check_length_for_ranks(static_cast<int64_t>(s.ids.size()), config, ranks,
                             fmt::format("{}: sample {}: ", opt.dataset, i));
      longest = std::max(longest, static_cast<int64_t>(s.ids.size()));
      const auto [it, fresh] = cell_of.try_emplace({s.length, s.depth}, plan.size());
      if (fresh) {
        plan.push_back(CellPlan{0, s.length, s.depth, 0, {}});
        members->emplace_back();
      }
      (*members)[it->second].push_back(i);
      ++plan[it->second].samples;
    }
    for (size_t c = 0; c < plan.size(); ++c) {
      plan[c].sample = [set, members, c](int64_t i) { return set->samples[(*members)[c][static_cast<size_t>(i)]]; };
    }
  }
  report.cells_total = static_cast<int64_t>(plan.size());
  int64_t total_samples = 0;
  for (const CellPlan& c : plan) total_samples += c.samples;
#if HYDRA_CUDA
  if (device == Device::cuda) cuda_set_device(app.mpi.local_rank());  // the free memory of this rank's GPU
#endif
  check_memory_plan(estimate_prefill_memory(config, longest / ranks, ranks, device), device,
                    fmt::format("eval-niah at {} tokens on {} rank(s)", longest, ranks), app.mpi.local_size());
  agree_on_run(app, inputs);
  DeviceWorld world = make_device_world(opt.device, app.mpi, app.world, opt.nccl_timeout);
  Communicator& comm = *world.comm;

  const auto t0 = Clock::now();
  const Model model = opt.model.build(device, dtype);
  const double load_s = seconds_since(t0);
  log::info("eval-niah: {} — {} cells, {} samples on {} rank(s), weights loaded in {:.2f} s", config.summary(),
            plan.size(), total_samples, comm.size(), load_s);

  const auto t1 = Clock::now();
  int64_t correct_total = 0;
  double logprob_total = 0;
  for (size_t c = 0; c < plan.size(); ++c) {
    const CellPlan& cell = plan[c];
    const auto cell_start = Clock::now();
    niah::CellResult result{.task = cell.task, .length = cell.length, .depth = cell.depth, .samples = cell.samples};
    std::vector<niah::SampleResult> rows;
    for (int64_t i = 0; i < cell.samples; ++i) {
      const niah::Sample sample = cell.sample(i);
      const auto sample_start = Clock::now();
      // The ranks hold their own copy of every sample (generated, or read from the set): check that
      // the copies agree before the sample's collectives, as for the command itself.
      const std::string which = fmt::format("sample {} of cell {} (task {}, length {}, depth {}%)", i, c + 1,
                                            report.tasks[static_cast<size_t>(cell.task)], cell.length, cell.depth);
      RunFingerprint sample_fields;
      sample_fields.add_tokens("sample tokens", sample.ids);
      sample_fields.add("answer span", fmt::format("{} + {}", sample.answer_start, sample.answer_length));
      agree_across_ranks(comm, sample_fields, which);
      const niah::AnswerScore score = niah::evaluate_sample(model, comm, sample);
      if (!std::isfinite(score.logprob)) {  // all-reduced: every rank takes this branch together
        fail_nonfinite(model, comm, sample.ids, fmt::format("eval-niah: the answer's log-probability in {} is", which));
      }
      const std::span<const int32_t> answer = sample.answer();
      rows.push_back(niah::SampleResult{.task = cell.task,
                                        .length = sample.length,
                                        .depth = sample.depth,
                                        .index = sample.index,
                                        .answer_start = sample.answer_start,
                                        .needle_position = sample.needle_position,
                                        .correct = score.correct,
                                        .logprob = score.logprob,
                                        .seconds = seconds_since(sample_start),
                                        .answer = std::vector<int32_t>(answer.begin(), answer.end()),
                                        .predicted = score.predicted});
      result.correct += score.correct ? 1 : 0;
      result.mean_logprob += score.logprob / static_cast<double>(cell.samples);
    }
    result.seconds = seconds_since(cell_start);
    correct_total += result.correct;
    logprob_total += result.mean_logprob * static_cast<double>(cell.samples);
    report.add_cell(result, std::move(rows));
    log::info("niah {} length {} depth {}%: accuracy {:.3f} ({}/{}), mean logprob {:.3f}, {:.2f} s [cell {}/{}]",
              report.tasks[static_cast<size_t>(cell.task)], format_size(cell.length), cell.depth, result.accuracy(),
              result.correct, result.samples, result.mean_logprob, result.seconds, c + 1, plan.size());
    if (comm.rank() == 0) {  // rewritten after every cell: a run that dies keeps its finished cells
      AtomicCommitGroup outputs;  // the JSON lines and the HDF5 copy change together or not at all
      niah::write_jsonl(opt.out, report);
      niah::write_results_h5(opt.out_h5, report);
      outputs.commit();
    }
  }
  const double run_s = seconds_since(t1);
  if (comm.rank() == 0) {
    std::cout << niah::format_table(report);
    const double accuracy = total_samples ? static_cast<double>(correct_total) / total_samples : 0.0;
    const double mean_logprob = total_samples ? logprob_total / total_samples : 0.0;
    const nlohmann::ordered_json summary = {
        {"command", "eval-niah"}, {"model", report.model},      {"source", report.source},
        {"tasks", report.tasks},  {"ranks", comm.size()},       {"cells", plan.size()},
        {"samples", total_samples}, {"accuracy", accuracy},
        {"mean_logprob", std::isfinite(mean_logprob) ? nlohmann::ordered_json(mean_logprob) : nlohmann::ordered_json(nullptr)},
        {"load_s", load_s},       {"eval_s", run_s},            {"out", opt.out},
        {"out_h5", opt.out_h5}};
    std::cout << summary.dump() << std::endl;
  }
  return 0;
}

}  // namespace hydra
