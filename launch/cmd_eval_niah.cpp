// hydra eval-niah: needle-in-a-haystack accuracy by depth × length, sequence-parallel over the
// MPI ranks. The world is cut into sequence groups of --sp ranks (parallel/sequence_groups.h; 0:
// one group of all ranks); each group takes whole samples in a fixed assignment (model/eval/niah_run.h)
// and each sample is one prefill over its group's zigzag layout, scored by teacher forcing
// (model/eval/niah.h says why that is the greedy verdict) or, with --score generate, by greedy
// decoding of the answer with the cache (model/generate.h; its decode steps replayed as a CUDA graph
// where a group is one rank on the GPU, unless --cuda-graph off); beyond the forward, a group's ranks
// exchange only two small all-reduces of the answer rows' verdicts per sample, and one gather per
// round of samples brings the groups' results to rank 0, which writes them in plan order. Tasks
// come from the built-in token-space generator (--task/--lengths/--depths/--samples/--seed) or from
// an HDF5 eval set (--dataset, model/eval/niah_set.h).
// Outputs (model/eval/niah_report.h): JSON lines (--out), an HDF5 copy (--out-h5, default: --out with
// .jsonl/.json replaced by .h5, or .h5 appended), the accuracy table on stdout, a progress line per
// cell on stderr, and a final one-line JSON summary on stdout.
// Every input check (tasks, depths, lengths against the task and the rank count, the set's ids)
// runs before the weights are read.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <memory>
#include <set>

#include <nlohmann/json.hpp>

#include "launch/cli.h"
#include "launch/model_source.h"
#include "model/memory_plan.h"
#include "model/eval/niah_run.h"
#include "model/eval/ruler.h"
#include "parallel/device_world.h"
#include "parallel/sequence_groups.h"
#include "runtime/atomic_file.h"
#include "runtime/log.h"
#include "runtime/sizes.h"

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
  niah::TaskParams ruler;  // the RULER families' knobs (model/eval/ruler.h), RULER's defaults
  std::string dataset;
  std::string out, out_h5;
  std::string device = "auto";
  double nccl_timeout = 600;
  int sp = 0;
  std::string score = "auto";
  std::string suite;
  std::string cuda_graph = "auto";
  std::set<std::string> given;  // generator flags given on the command line (they conflict with --dataset)

  void bind(po::options_description& o) {
    // --model/--preset/--weight-seed as every command has them (ModelSource); --seed is the task seed.
    const auto mark = [this](const char* flag) {
      return [this, flag](const auto&) { given.insert(flag); };
    };
    model.bind(o, ModelSource::OwnSeed::yes);
    // --allow-nonfinite comes with the model's flags (ModelSource::bind).
    o.add_options()
        ("task", po::value(&tasks)->notifier(mark("task")), "NIAH single, multikey, multivalue; RULER multiquery, vartrack, cwe (common words), fwe (frequent words); or a comma list (default single)")
        ("suite", po::value(&suite), "ruler: RULER's seven families (single, multikey, multivalue, multiquery, vartrack, cwe, fwe) at every --lengths, the knobs not given sized to each length as RULER sizes them (each change logged and kept in the cell's JSON line), scored by generation unless --score says otherwise, and one table of RULER's score")
        ("lengths", po::value(&lengths)->notifier(mark("lengths")), "sample lengths in tokens, e.g. 4K,16K,128K,512K (required without --dataset)")
        ("depths", po::value(&depths)->notifier(mark("depths")), "needle depths in percent (default 0,10,...,100)")
        ("samples", po::value(&samples)->notifier(mark("samples")), "samples per cell (default 4)")
        ("seed", po::value(&seed)->notifier(mark("seed")), "task seed: samples are a function of (seed, task, length, depth, index) (default 0)")
        ("value-length", po::value(&value_length)->notifier(mark("value-length")), "value length in tokens: N or MIN..MAX (default 2..4)")
        ("key-length", po::value(&key_length)->notifier(mark("key-length")), "key length in tokens (default 2)")
        ("distractors", po::value(&distractors)->notifier(mark("distractors")), "multikey: needles with other keys (default 3)")
        ("values", po::value(&values)->notifier(mark("values")), "multivalue: values of the queried key (default 3)")
        ("queries", po::value(&ruler.queries)->notifier(mark("queries")), "multiquery: keys asked in one query, all values answered (default 4)")
        ("chains", po::value(&ruler.chains)->notifier(mark("chains")), "vartrack: chains of assignments VAR x = v, VAR y = x, ... (default 1)")
        ("hops", po::value(&ruler.hops)->notifier(mark("hops")), "vartrack: assignments after the first in each chain (default 4)")
        ("common-words", po::value(&ruler.common_words)->notifier(mark("common-words")), "cwe: the common words to answer (default 10)")
        ("common-freq", po::value(&ruler.common_freq)->notifier(mark("common-freq")), "cwe: occurrences of each common word (default 30)")
        ("uncommon-freq", po::value(&ruler.uncommon_freq)->notifier(mark("uncommon-freq")), "cwe: occurrences of each other word, as many as fit (default 3)")
        ("zipf-alpha", po::value(&ruler.zipf_alpha)->notifier(mark("zipf-alpha")), "fwe: exponent of the Zipf law of the words (default 2.0)")
        ("fwe-words", po::value(&ruler.fwe_words)->notifier(mark("fwe-words")), "fwe: distinct words (default 0: a quarter of the occurrences)")
        ("top-words", po::value(&ruler.top_words)->notifier(mark("top-words")), "fwe: the most frequent words to answer (default 3)")
        ("dataset", po::value(&dataset), "instead of the generator: an HDF5 NIAH eval set (cluster/niah/build_niah_set.py)")
        ("out", po::value(&out)->required(), "results as JSON lines (per sample and per cell), written by rank 0")
        ("out-h5", po::value(&out_h5), "HDF5 copy of the results (default: --out with .jsonl replaced by .h5)")
        ("score", po::value(&score)->default_value(score), "teacher-forced (one prefill per sample: the greedy verdict, model/eval/niah.h), generate (greedy decoding of the answer with the cache, as hydra generate does: RULER's metric reads generated text) or auto (generate for --suite and for RULER's multiquery, vartrack, cwe and fwe, or a set of theirs; teacher-forced otherwise)")
        ("cuda-graph", po::value(&cuda_graph)->default_value(cuda_graph)->implicit_value("on"), "--score generate: on, off or auto: replay each decode step as a CUDA graph, the same tokens as off (on needs the GPU; auto: on with --sp 1 on the GPU; over several ranks a sample's graph is cut at each layer's all-gather)")
        ("sp", po::value(&sp)->default_value(0), "ranks per sample (sequence parallel): world / sp groups score different samples side by side (0: all ranks on every sample); each length needs 2·sp segments")
        ("device", po::value(&device)->default_value("auto"), "cuda, cpu or auto (cuda when a GPU is present): one GPU per rank")
        ("nccl-timeout", po::value(&nccl_timeout)->default_value(600), "seconds before a stuck NCCL operation ends the job");
  }

  // Flag-level checks (nothing is read); fills in the default --out-h5.
  void validate() {
    model.validate();
    HYDRA_USER_CHECK(suite.empty() || suite == "ruler", "--suite: '{}' is not a suite (ruler)", suite);
    HYDRA_USER_CHECK(suite.empty() || !given.count("task"), "--suite ruler runs RULER's seven families; it cannot be "
                     "combined with --task (give the families you want as --task instead)");
    HYDRA_USER_CHECK(suite.empty() || dataset.empty(), "--suite ruler generates its samples; it cannot be combined with --dataset");
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
    if (score != "auto") niah::parse_scoring(score);
    parse_decode_graph(cuda_graph);
    if (out_h5.empty()) out_h5 = default_h5_path(out);
    require_writable_destination(out, "results");
    require_writable_destination(out_h5, "HDF5 results");
    HYDRA_USER_CHECK(out_h5 != out, "--out-h5 must differ from --out ({})", out);
    require_not_an_input(out, {dataset, model.model_path}, "--out");
    require_not_an_input(out_h5, {dataset, model.model_path}, "--out-h5");
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
    std::vector<niah::Task> list;
    if (suite.empty()) {
      for (const std::string& name : split_list(tasks)) list.push_back(niah::parse_task(name));
    } else {
      list = niah::ruler_suite_tasks();
    }
    for (const niah::Task task : list) {
      niah::TaskParams p = ruler;
      p.task = task;
      p.key_length = key_length;
      p.value_length_min = vmin;
      p.value_length_max = vmax;
      p.distractors = distractors;
      p.values = values;
      out_params.push_back(p);
    }
    return out_params;
  }

  // The knobs given on the command line, by flag: --suite keeps them as given.
  std::set<std::string> fixed_knobs() const {
    std::set<std::string> out;
    for (const std::string& flag : given) out.insert("--" + flag);
    return out;
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

}  // namespace

int run_eval_niah(App& app, const std::vector<std::string>& args) {
  EvalNiahOptions opt;
  po::options_description desc("hydra eval-niah");
  opt.bind(desc);
  if (!parse_command_line(app, "eval-niah",
                          "(--model FILE.h5 | --preset NAME) (--lengths 4K,16K,... [--suite ruler | --task single|multikey|multivalue|multiquery|vartrack|cwe|fwe[,...]] "
                          "[--depths 0,10,...,100] [--samples N] [--seed S] | --dataset SET.h5) [--score auto|teacher-forced|generate [--cuda-graph on|off|auto]] [--sp N] --out RESULTS.jsonl",
                          desc, args)) {
    return 0;
  }
  opt.validate();
  ModelRun job = ModelRun::begin(app, opt.model, opt.device);  // config, device, the inputs' fingerprint
  const ModelConfig& config = job.config;
  const int ranks = app.world.size();
  const int sp = SequenceGroups::resolve_sp(opt.sp, ranks);  // ranks per sample
  // GPU: bf16 weights; CPU: the fp32 reference path.
  const Device device = job.device;

  // Plan every cell and check every input before the weights are read.
  niah::Report report;
  report.model = opt.model.describe();
  report.ranks = ranks;
  RunFingerprint& inputs = job.inputs;
  niah::EvalPlan plan;
  if (opt.dataset.empty()) {
    report.source = "builtin";
    report.seed = opt.seed;
    const std::set<std::string> fixed = opt.fixed_knobs();
    plan = niah::plan_generated(opt.task_params(), opt.length_list(), opt.depth_list(), opt.samples, opt.seed, config, sp,
                                opt.suite.empty() ? nullptr : &fixed);
    if (app.world.rank() == 0) {
      for (const std::string& line : plan.sizing) log::info("eval-niah --suite ruler: {} (sized to the length as RULER does)", line);
    }
  } else {
    const auto set = std::make_shared<const niah::EvalSet>(niah::read_eval_set(opt.dataset, config.vocab_size));
    report.source = opt.dataset;
    std::vector<int32_t> all_ids;
    for (const niah::Sample& s : set->samples) all_ids.insert(all_ids.end(), s.ids.begin(), s.ids.end());
    inputs.add("eval set task", set->task);
    inputs.add("eval set samples", std::to_string(set->samples.size()));
    inputs.add_tokens("eval set tokens", all_ids);
    add_file_datasets(inputs, "eval set", opt.dataset);  // answers and positions too
    plan = niah::plan_eval_set(set, opt.dataset, config, sp);
  }
  const int64_t longest = plan.longest, total_samples = plan.total_samples();
  // auto: RULER's metric reads generated text, so its families (and the suite) are generated.
  bool ruler_family = !opt.suite.empty();
  for (const std::string& t : plan.tasks) {  // a set's task attribute names its family too
    for (const niah::Task k : niah::ruler_suite_tasks()) ruler_family = ruler_family || (t == niah::task_name(k) && niah::is_ruler_family(k));
  }
  const niah::Scoring scoring =
      opt.score == "auto" ? (ruler_family ? niah::Scoring::generate : niah::Scoring::teacher_forced) : niah::parse_scoring(opt.score);
  const DecodeGraph graph = parse_decode_graph(opt.cuda_graph);
  HYDRA_USER_CHECK(graph != DecodeGraph::on || (scoring == niah::Scoring::generate && decode_graph_possible(device)),
                   "--cuda-graph on needs --score generate on the GPU (this run: {} on {})", niah::scoring_name(scoring),
                   device_name(device));
  // Generation: the prompt's prefill, the cache and the decode engine (the answer is at most a few
  // dozen tokens; the longest sample bounds the cache).
  check_memory_plan(niah::eval_memory_estimate(plan, config, scoring, sp, device), device,
                    fmt::format("eval-niah at {} tokens on {} rank(s) per sample", longest, sp), app.mpi.local_size());
  ModelRun::Started ready = job.start(app, opt.model, opt.device, opt.nccl_timeout);
  DeviceWorld& world = ready.world;
  const Model& model = ready.model;
  Communicator& comm = *world.comm;
  SequenceGroups groups(comm, sp);

  const double load_s = ready.load_s;
  log::info("eval-niah: {} — {} cells, {} samples on {} rank(s) ({} group(s) of {}), weights loaded in {:.2f} s",
            config.summary(), plan.cells.size(), total_samples, comm.size(), groups.replicas(), sp, load_s);

  const auto t1 = Clock::now();
  const niah::EvalTotals totals = niah::run_plan(model, groups, plan, report, [&](const niah::Report& so_far) {
    if (comm.rank() != 0) return;  // rewritten after every cell: a run that dies keeps its finished cells
    AtomicCommitGroup outputs;     // the JSON lines and the HDF5 copy change together or not at all
    niah::write_jsonl(opt.out, so_far);
    niah::write_results_h5(opt.out_h5, so_far);
    outputs.commit();
  }, scoring, graph);
  const double run_s = seconds_since(t1);
  if (comm.rank() == 0) {
    if (opt.suite.empty()) {
      std::cout << niah::format_table(report);
    } else {  // the suite's one table; the accuracy by depth is in the JSON lines
      std::cout << "(the accuracy of every cell, by depth, is in " << opt.out << ")\n";
    }
    std::cout << niah::format_ruler_table(report);
    const double accuracy = totals.accuracy(), mean_logprob = totals.mean_logprob();
    const nlohmann::ordered_json summary = {
        {"command", "eval-niah"}, {"model", report.model},      {"source", report.source},
        {"tasks", report.tasks},  {"ranks", comm.size()},       {"sp", sp}, {"cells", plan.cells.size()},
        {"samples", total_samples}, {"score", report.scoring}, {"accuracy", accuracy}, {"mean_recall", totals.mean_recall()},
        {"mean_logprob", std::isfinite(mean_logprob) ? nlohmann::ordered_json(mean_logprob) : nlohmann::ordered_json(nullptr)},
        {"load_s", load_s},       {"eval_s", run_s},            {"out", opt.out},
        {"out_h5", opt.out_h5}};
    std::cout << summary.dump() << std::endl;
  }
  return 0;
}

}  // namespace hydra
