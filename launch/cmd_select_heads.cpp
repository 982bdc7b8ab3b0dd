// hydra select-heads: interpretability-driven choice of the heads that keep full attention when a
// Qwen3 teacher becomes a HydraHead student (DESIGN.md §1.4). Scores every (layer, head) by activation
// patching (total effect), path patching of the direct path (direct effect) and mean ablation on
// plain text (lm), combines them, applies the budget, and writes the head-set file that
// `hydra convert --fa-heads file:PATH` reads plus an HDF5 copy (model/selection/head_report.h). The
// definitions and how the work is spread over the MPI ranks are in model/selection/head_selection.h; the
// calibration prompts and their corruption in model/selection/head_calibration.h.
// Every input check (budget, weights, calibration set or generator settings, text file) runs before
// the weights are read. Rank 0 prints a progress line per layer, the table and a one-line JSON summary.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <set>

#include <nlohmann/json.hpp>

#include "launch/cli.h"
#include "launch/model_source.h"
#include "model/eval/niah_set.h"
#include "model/selection/head_report.h"
#include "model/selection/head_selection.h"
#include "model/sequence_length.h"
#include "parallel/device_world.h"
#include "parallel/sequence_groups.h"
#include "runtime/atomic_file.h"
#include "runtime/log.h"
#include "runtime/sizes.h"
#include "runtime/token_file.h"

namespace hydra {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct SelectHeadsOptions {
  ModelSource model;
  int64_t budget = 0;
  bool per_layer = false;
  std::string weights = "1,1,0.5";
  std::string calib;
  std::string calib_task = "single";
  std::string calib_length = "1K";
  int64_t calib_samples = 8;
  uint64_t seed = 0;
  std::string lm_text;
  std::string lm_length = "512";
  int64_t lm_samples = 2;
  std::string out, out_h5;
  std::string device = "auto";
  double nccl_timeout = 600;
  bool group_patching = false;
  int sp = 1;
  std::set<std::string> generator_flags;  // given on the command line; they conflict with --calib

  void bind(po::options_description& o) {
    const auto mark = [this](const char* flag) {
      return [this, flag](const auto&) { generator_flags.insert(flag); };
    };
    model.bind(o, ModelSource::OwnSeed::yes);  // a Qwen3 teacher whose heads are scored
    o.add_options()
        ("budget", po::value(&budget)->required(), "K: heads that keep full attention, over the whole model (default) or per layer")
        ("per-layer", po::bool_switch(&per_layer), "the budget is K heads in every layer (uniform), not K in total")
        ("weights", po::value(&weights)->default_value(weights), "composite weights TOTAL,DIRECT,LM (each >= 0, not all 0)")
        ("calib", po::value(&calib), "retrieval prompts from a NIAH eval set (.h5, model/eval/niah_set.h) instead of the generator")
        ("calib-task", po::value(&calib_task)->notifier(mark("calib-task")), "generated prompts: single, multikey or multivalue (default single)")
        ("calib-length", po::value(&calib_length)->notifier(mark("calib-length")), "generated prompts: tokens per prompt (default 1K)")
        ("calib-samples", po::value(&calib_samples)->notifier(mark("calib-samples")), "generated prompts: how many; needle depths spread over 0..100% (default 8)")
        ("seed", po::value(&seed)->default_value(0), "seed of the generated prompts, their corruption and the random plain text")
        ("lm-text", po::value(&lm_text), "plain text for the lm score (.h5 input_ids), cut into --lm-samples windows (default: random tokens)")
        ("lm-length", po::value(&lm_length)->default_value(lm_length), "tokens per plain-text sequence")
        ("lm-samples", po::value(&lm_samples)->default_value(lm_samples), "plain-text sequences (0: no lm score; needs an lm weight of 0)")
        ("out", po::value(&out)->required(), "head-set file (.json) for hydra convert --fa-heads file:PATH, written by rank 0")
        ("out-h5", po::value(&out_h5), "HDF5 copy of the scores (default: --out with .json replaced by .h5)")
        ("sp", po::value(&sp)->default_value(1), "ranks per sequence (sequence parallel): world / sp groups score different heads side by side (default 1: every rank alone, the fastest for prompts that fit one rank; 0: all ranks on every sequence); prompt and text lengths need 2·sp segments")
        ("device", po::value(&device)->default_value("auto"), "cuda, cpu or auto (cuda when a GPU is present): one GPU per rank")
        ("group-patching", po::bool_switch(&group_patching), "also patch groups of heads: every head of a layer, and every "
                                                             "head of a layer but one ((L + L*H) * prompts more forwards)")
        ("nccl-timeout", po::value(&nccl_timeout)->default_value(600), "seconds before a stuck NCCL operation ends the job");
  }

  heads::ScoreWeights score_weights() const {
    std::vector<double> w;
    std::string part;
    for (size_t i = 0; i <= weights.size(); ++i) {
      if (i == weights.size() || weights[i] == ',') {
        size_t used = 0;
        double v = 0;
        try {
          v = std::stod(part, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        HYDRA_USER_CHECK(used > 0 && used == part.size() && std::isfinite(v) && v >= 0,
                         "--weights '{}': '{}' is not a non-negative number", weights, part);
        w.push_back(v);
        part.clear();
      } else if (weights[i] != ' ') {
        part += weights[i];
      }
    }
    HYDRA_USER_CHECK(w.size() == 3, "--weights '{}': give three numbers TOTAL,DIRECT,LM", weights);
    HYDRA_USER_CHECK(w[0] + w[1] + w[2] > 0, "--weights '{}': at least one weight must be positive", weights);
    return heads::ScoreWeights{w[0], w[1], w[2]};
  }

  // Flag-level checks (nothing is read); fills in the default --out-h5.
  void validate() {
    model.validate();
    HYDRA_USER_CHECK(budget >= 1, "--budget must be at least 1 (got {})", budget);
    const heads::ScoreWeights w = score_weights();
    if (!calib.empty()) {
      require_readable_file(calib, "NIAH eval set");
      for (const std::string& flag : generator_flags) {
        HYDRA_USER_FAIL("--{} configures generated prompts; it cannot be combined with --calib", flag);
      }
    } else {
      HYDRA_USER_CHECK(calib_samples >= 1, "--calib-samples must be at least 1 (got {})", calib_samples);
      const niah::Task t = niah::parse_task(calib_task);
      // The corrupted twins change the queried needles' values (model/selection/head_calibration.h): NIAH's tasks.
      HYDRA_USER_CHECK(t == niah::Task::single || t == niah::Task::multikey || t == niah::Task::multivalue,
                       "--calib-task {}: calibration prompts are NIAH's single, multikey or multivalue", calib_task);
      parse_size(calib_length, "--calib-length");
    }
    HYDRA_USER_CHECK(parse_size(lm_length, "--lm-length") >= 2, "--lm-length must be at least 2 tokens");
    HYDRA_USER_CHECK(lm_samples >= 0, "--lm-samples must not be negative (got {})", lm_samples);
    HYDRA_USER_CHECK(lm_samples > 0 || w.lm == 0,
                     "--lm-samples 0 measures no lm score; set its weight to 0 (--weights {},{},0)", w.total, w.direct);
    if (!lm_text.empty()) {
      HYDRA_USER_CHECK(lm_samples > 0, "--lm-text needs --lm-samples of at least 1");
      require_readable_file(lm_text, "plain text");
    }
    if (out_h5.empty()) {
      const std::string ext = ".json";
      const bool json = out.size() > ext.size() && out.compare(out.size() - ext.size(), ext.size(), ext) == 0;
      out_h5 = (json ? out.substr(0, out.size() - ext.size()) : out) + ".h5";
    }
    HYDRA_USER_CHECK(out_h5 != out, "--out-h5 must differ from --out ({})", out);
    require_writable_destination(out, "head-set file");
    require_writable_destination(out_h5, "HDF5 head scores");
    for (const std::string* o : {&out, &out_h5}) require_not_an_input(*o, {calib, lm_text, model.model_path}, "--out");
  }
};

// The calibration prompts (the built-in task's, or an eval set's) and the plain text (a token file's
// windows, or random text), with what the selection records about them.
struct CalibrationInputs {
  std::vector<heads::CalibrationPrompt> prompts;
  nlohmann::ordered_json calibration;
  std::vector<std::vector<int32_t>> text;
  int64_t lm_length = 0;
};

CalibrationInputs calibration_inputs(const SelectHeadsOptions& opt, const ModelConfig& config) {
  CalibrationInputs in;
  if (opt.calib.empty()) {
    niah::TaskParams params;
    params.task = niah::parse_task(opt.calib_task);
    const int64_t length = parse_size(opt.calib_length, "--calib-length");
    in.prompts = heads::generated_prompts(params, config.vocab_size, opt.seed, length, opt.calib_samples);
    in.calibration = {{"source", "builtin"}, {"task", opt.calib_task}, {"length", length}, {"prompts", in.prompts.size()},
                      {"seed", opt.seed}};
  } else {
    const niah::EvalSet set = niah::read_eval_set(opt.calib, config.vocab_size);
    in.prompts = heads::eval_set_prompts(set, opt.calib);
    in.calibration = {{"source", opt.calib}, {"task", set.task}, {"prompts", in.prompts.size()}};
  }
  in.lm_length = parse_size(opt.lm_length, "--lm-length");
  if (!opt.lm_text.empty()) {
    in.text = heads::text_windows(read_token_file(opt.lm_text, config.vocab_size), in.lm_length, opt.lm_samples, opt.lm_text);
  } else {
    in.text = heads::random_text(config.vocab_size, opt.seed, in.lm_length, opt.lm_samples);
  }
  return in;
}

// heads.json's "selection": the run's inputs and the scores' baselines (concentration added by the caller).
nlohmann::ordered_json selection_record(const SelectHeadsOptions& opt, const heads::SelectionReport& report,
                                        const CalibrationInputs& calib) {
  const heads::HeadScores& s = report.scores;
  const heads::ScoreWeights& weights = report.weights;
  return {
      {"tool", "hydra select-heads"},
      {"model", report.model},
      {"budget", report.budget.heads},
      {"mode", opt.per_layer ? "per_layer" : "global"},
      {"weights", {{"total", weights.total}, {"direct", weights.direct}, {"lm", weights.lm}}},
      {"calibration", calib.calibration},
      {"lm_text", {{"source", opt.lm_text.empty() ? std::string("random") : opt.lm_text}, {"sequences", calib.text.size()},
                   {"length", calib.lm_length}}},
      {"logprob_clean", s.logprob_clean},
      {"logprob_corrupt", s.logprob_corrupt},
      {"total_denominator", s.total_denominator},
      {"total_normalized", s.total_normalized},
      {"logit_diff_clean", s.logit_diff_clean},
      {"logit_diff_corrupt", s.logit_diff_corrupt},
      {"lm_nll_clean", s.lm_nll_clean},
      {"scales", {{"total", report.composite.scale_total}, {"direct", report.composite.scale_direct},
                  {"lm", report.composite.scale_lm}}}};
}

}  // namespace

int run_select_heads(App& app, const std::vector<std::string>& args) {
  SelectHeadsOptions opt;
  po::options_description desc("hydra select-heads");
  opt.bind(desc);
  if (!parse_command_line(app, "select-heads",
                          "(--model TEACHER.h5 | --preset NAME) --budget K [--per-layer] [--weights T,D,LM] "
                          "[--calib SET.h5 | --calib-length N --calib-samples N] [--lm-text TOKENS.h5] [--sp N] [--group-patching] --out heads.json",
                          desc, args)) {
    return 0;
  }
  opt.validate();
  ModelRun job = ModelRun::begin(app, opt.model, opt.device);  // config, device, the inputs' fingerprint
  const ModelConfig& config = job.config;
  HYDRA_USER_CHECK(config.arch == Arch::qwen3,
                   "{}: is a {} model; select-heads scores the heads of a Qwen3 teacher (hydra import / hydra init "
                   "--preset qwen3-*)",
                   opt.model.describe(), arch_name(config.arch));
  const heads::Budget budget{opt.budget, opt.per_layer ? heads::BudgetMode::per_layer : heads::BudgetMode::global};
  budget.validate(config.num_layers, config.num_heads);
  const heads::ScoreWeights weights = opt.score_weights();

  // Calibration inputs, identical on every rank, checked before the weights are read.
  const CalibrationInputs calib = calibration_inputs(opt, config);
  const std::vector<heads::CalibrationPrompt>& prompts = calib.prompts;
  const std::vector<std::vector<int32_t>>& text = calib.text;
  const int64_t lm_length = calib.lm_length;

  // A sequence group of sp ranks must split every prompt and text sequence (2·sp segments).
  const int sp = SequenceGroups::resolve_sp(opt.sp, app.world.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    check_sequence_length(config, prompts[i].length(), sp, fmt::format("calibration prompt {}: ", i));
  }
  if (!text.empty()) check_sequence_length(config, lm_length, sp);

  RunFingerprint& inputs = job.inputs;
  std::vector<int32_t> prompt_ids, text_ids;
  for (const heads::CalibrationPrompt& p : prompts) {
    prompt_ids.insert(prompt_ids.end(), p.clean.begin(), p.clean.end());
    prompt_ids.insert(prompt_ids.end(), p.corrupted.begin(), p.corrupted.end());
  }
  for (const std::vector<int32_t>& t : text) text_ids.insert(text_ids.end(), t.begin(), t.end());
  inputs.add_tokens("calibration prompts", prompt_ids);
  inputs.add_tokens("plain text", text_ids);
  if (!opt.calib.empty()) add_file_datasets(inputs, "calibration set", opt.calib);
  if (!opt.lm_text.empty()) add_file_datasets(inputs, "plain text", opt.lm_text);
  ModelRun::Started ready = job.start(app, opt.model, opt.device, opt.nccl_timeout);
  DeviceWorld& world = ready.world;
  const Model& model = ready.model;
  Communicator& comm = *world.comm;
  SequenceGroups groups(comm, sp);

  const double load_s = ready.load_s;
  const int64_t jobs = config.num_layers * config.num_heads;
  log::info("select-heads: {} — {} heads, {} retrieval prompts, {} plain-text sequences of {} tokens, on {} rank(s); "
            "weights loaded in {:.2f} s",
            config.summary(), jobs, prompts.size(), text.size(), lm_length, comm.size(), load_s);

  heads::ScoringOptions scoring;
  scoring.group_patching = opt.group_patching;
  scoring.on_layer_done = [&](const heads::ScoringProgress& p) {
    const double left = p.jobs_done > 0 ? p.seconds / static_cast<double>(p.jobs_done) * static_cast<double>(p.jobs - p.jobs_done) : 0;
    log::info("select-heads: layer {}/{} scored ({}/{} of rank 0's heads, {:.1f} s, about {:.0f} s left)", p.layer + 1,
              config.num_layers, p.jobs_done, p.jobs, p.seconds, left);
  };
  const auto t1 = Clock::now();
  heads::SelectionReport report;
  report.model = opt.model.describe();
  report.config = config;
  report.budget = budget;
  report.weights = weights;
  report.scores = heads::score_heads(model, groups, prompts, text, scoring);
  const double score_s = seconds_since(t1);
  report.composite = heads::composite_scores(report.scores, weights);
  report.fa_heads = heads::choose_fa_heads(report.composite.composite, budget);
  const heads::HeadScores& s = report.scores;
  if (!s.total_normalized && comm.rank() == 0) {
    // The mean drop may be negative (corruption raised log p): say which way it went.
    log::warn("corrupting the needle {} log p(answer) by {:.3g} nats on average (a drop under {} counts as none): the "
              "model does not retrieve on these prompts, so 'total' is the raw mean drop in nats, not a fraction",
              s.total_denominator < 0 ? "raises" : "lowers", std::abs(s.total_denominator), heads::kMinLogprobGap);
  }
  int64_t kept = 0;
  for (const auto& l : report.fa_heads) kept += static_cast<int64_t>(l.size());
  nlohmann::ordered_json selection = selection_record(opt, report, calib);
  selection.update(heads::concentration_json(s));
  report.selection_json = selection.dump();
  if (comm.rank() == 0) {
    AtomicCommitGroup outputs;  // heads.json and heads.h5 appear together or not at all
    heads::write_heads_json(opt.out, report);
    heads::write_heads_h5(opt.out_h5, report);
    outputs.commit();
    std::cout << heads::format_heads_table(report);
    const nlohmann::ordered_json summary = {
        {"command", "select-heads"}, {"model", report.model},          {"ranks", comm.size()}, {"sp", sp},
        {"layers", config.num_layers}, {"heads", config.num_heads},   {"budget", budget.heads},
        {"mode", opt.per_layer ? "per_layer" : "global"},             {"fa_heads", kept},
        {"prompts", s.prompts},      {"lm_sequences", s.lm_sequences}, {"logprob_clean", s.logprob_clean},
        {"logprob_corrupt", s.logprob_corrupt},                        {"total_normalized", s.total_normalized},
        {"forwards", s.forwards},    {"load_s", load_s},               {"score_s", score_s},
        {"out", opt.out},            {"out_h5", opt.out_h5}};
    std::cout << summary.dump() << std::endl;
  }
  return 0;
}

}  // namespace hydra
