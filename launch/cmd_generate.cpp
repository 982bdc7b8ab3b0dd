// hydra generate: new tokens for one prompt or a batch (model/generate.h): a sequence-parallel
// prefill of each prompt over the ranks, a distributed cache (model/kv_cache.h) and batched decode
// steps, greedy or seeded sampling, optionally after a repetition penalty. With --sp N the world is cut into sequence groups of N ranks
// (parallel/sequence_groups.h): prompt b runs on group b mod groups, each group decoding its
// prompts as one batch; each prompt keeps its own sampling stream (its index in the file), and one
// gather brings every group's tokens to rank 0. Where a group is one rank on the GPU, each decode
// step is replayed as a CUDA graph unless --cuda-graph off (the same tokens either way). Writes one JSON line per prompt, in file order
// (with --logprobs K: each new token's log-probability and its K most likely alternatives), and
// a summary line (rank 0, atomically). Inputs are checked before any work: token ids against the model's vocabulary, prompt
// offsets that partition the ids into non-empty prompts, stop ids, the sampling flags, the memory plan.
// Stops: --stop-token ids; --stop strings, matched on the text of the new tokens across token
// boundaries (model/token_text.h, with the tokenizer.json of --tokenizer or beside --model); and, when
// the tokenizer is known, its eos (default_stop_ids) unless --no-default-stop.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "launch/cli.h"
#include "launch/model_source.h"
#include "model/generate.h"
#include "model/kv_cache.h"
#include "model/memory_plan.h"
#include "parallel/device_world.h"
#include "parallel/sequence_groups.h"
#include "runtime/atomic_file.h"
#include "runtime/hdf5_file.h"
#include "runtime/host_memory.h"
#include "runtime/log.h"
#include "runtime/token_file.h"
#if HYDRA_CUDA
#include "runtime/cuda_memory.h"
#endif

namespace hydra {
namespace {

struct GenerateCliOptions {
  ModelSource model;
  std::string prompt;
  int64_t max_new_tokens = 0;
  double temperature = 0.0;
  int64_t top_k = 0;
  double top_p = 1.0;
  uint64_t seed = 0;
  std::string stop_tokens;
  std::vector<std::string> stop_strings;
  std::string tokenizer;
  bool no_default_stop = false;
  std::string out;
  std::string device = "auto";
  std::string progress = "auto";
  double nccl_timeout = 600;
  std::string cuda_graph = "auto";
  int sp = 0;
  int64_t logprobs = 0;
  double repetition_penalty = 1.0;

  void bind(po::options_description& o) {
    model.bind(o, ModelSource::OwnSeed::yes);
    o.add_options()
        ("prompt", po::value(&prompt)->required(), "prompt file (.h5): input_ids [T]; optional prompt_offsets int64 [N+1] "
         "split it into N prompts, decoded as a batch (a file with document_offsets and no prompt_offsets is refused)")
        ("max-new-tokens", po::value(&max_new_tokens)->required(), "new tokens per prompt (fewer if a stop token comes)")
        ("temperature", po::value(&temperature)->default_value(0.0), "0: greedy (arg-max); > 0: sample at this temperature")
        ("top-k", po::value(&top_k)->default_value(0), "sample among the k most likely tokens (0: all; needs --temperature > 0)")
        ("top-p", po::value(&top_p)->default_value(1.0), "then among the smallest set holding probability p (1: all; needs --temperature > 0)")
        ("seed", po::value(&seed)->default_value(0), "sampling seed (the same tokens on every rank and every run; the "
         "weights' seed is --weight-seed)")
        ("stop-token", po::value(&stop_tokens), "comma-separated ids that end a prompt's generation (kept as its last token)")
        ("stop", po::value(&stop_strings)->composing(), "a stop string (repeatable): generation ends at the token whose text completes it, across token boundaries, as transformers' stop_strings (the token is kept; the line names the string); needs the tokenizer")
        ("tokenizer", po::value(&tokenizer), "the model's tokenizer.json, or its folder, for --stop and the default stop (default: the --model file's folder, when it holds a tokenizer.json)")
        ("no-default-stop", po::bool_switch(&no_default_stop), "do not stop at the tokenizer's eos (generation_config.json's eos_token_id, else tokenizer_config.json's eos_token, else <|endoftext|>, </s> or <eos>), which is the default stop whenever the tokenizer is known")
        ("out", po::value(&out)->required(), "output JSON lines: one per prompt, then a summary (rank 0, atomic)")
        ("device", po::value(&device)->default_value("auto"), "cuda (bf16, one GPU per rank), cpu (fp32) or auto")
        ("progress", po::value(&progress)->default_value("auto"), "per-layer prefill progress: on, off, auto (from 64K tokens)")
        ("nccl-timeout", po::value(&nccl_timeout)->default_value(600), "seconds before a stuck NCCL operation ends the job")
        ("repetition-penalty", po::value(&repetition_penalty)->default_value(1.0), "F > 0: before greedy or sampling, the logit of every id already in the prompt or generated is divided by F if positive, multiplied by F if negative (CTRL's rule, as transformers applies it; 1: off)")
        ("logprobs", po::value(&logprobs)->default_value(0), "K > 0: write each new token's log-probability and the K most likely alternatives with theirs (the model's, before --temperature and --repetition-penalty; max 100)")
        ("sp", po::value(&sp)->default_value(0), "ranks per prompt (sequence parallel): world / sp groups generate for different prompts side by side, prompt b on group b mod groups (0: all ranks on every prompt)")
        ("cuda-graph", po::value(&cuda_graph)->default_value("auto")->implicit_value("on"), "on, off or auto: replay each decode step as a CUDA graph, the same tokens as off (on needs the GPU; auto: on with one rank per prompt on the GPU, one rank or --sp 1; over several ranks a prompt's graph is cut at each layer's all-gather; the flag alone: on)");
  }
  void validate() const {
    model.validate();
    require_readable_file(prompt, "prompt");
    require_writable_destination(out, "output");
    HYDRA_USER_CHECK(max_new_tokens >= 1, "--max-new-tokens must be at least 1 (got {})", max_new_tokens);
    HYDRA_USER_CHECK(temperature >= 0.0 && std::isfinite(temperature), "--temperature must be >= 0 (got {})", temperature);
    HYDRA_USER_CHECK(top_k >= 0, "--top-k must be >= 0 (got {})", top_k);
    HYDRA_USER_CHECK(top_p > 0.0 && top_p <= 1.0, "--top-p must be in (0, 1] (got {})", top_p);
    HYDRA_USER_CHECK(logprobs >= 0 && logprobs <= 100, "--logprobs must be in 0..100 (got {})", logprobs);
    HYDRA_USER_CHECK(repetition_penalty > 0.0 && std::isfinite(repetition_penalty),
                     "--repetition-penalty must be a finite number > 0 (got {}; 1 is off)", repetition_penalty);
    // Greedy decoding takes the arg-max: a filter of the sampled set would do nothing.
    HYDRA_USER_CHECK(temperature > 0.0 || (top_k == 0 && top_p == 1.0),
                     "--top-k and --top-p filter sampling: give --temperature > 0 with them (temperature 0 is greedy)");
    // Every path names a distinct file: the output replaces its destination.
    require_not_an_input(out, {prompt, model.model_path}, "--out");
    HYDRA_USER_CHECK(progress == "on" || progress == "off" || progress == "auto", "--progress must be on, off or auto");
    HYDRA_USER_CHECK(nccl_timeout > 0, "--nccl-timeout must be positive");
    for (const std::string& s : stop_strings) HYDRA_USER_CHECK(!s.empty(), "--stop: an empty stop string would stop at once");
    HYDRA_USER_CHECK(stop_strings.empty() || !tokenizer_path().empty(), "--stop matches text: give --tokenizer "
                     "(tokenizer.json or its folder; none beside --model {})", model.model_path.empty() ? model.describe() : model.model_path);
    parse_decode_graph(cuda_graph);
  }
  // The tokenizer.json: --tokenizer (the file or its folder), else the one beside --model; "" if none.
  std::string tokenizer_path() const {
    namespace fs = std::filesystem;
    if (!tokenizer.empty()) {
      const fs::path p = fs::is_directory(tokenizer) ? fs::path(tokenizer) / "tokenizer.json" : fs::path(tokenizer);
      require_readable_file(p.string(), "tokenizer");
      return p.string();
    }
    if (model.model_path.empty()) return "";
    const fs::path beside = fs::absolute(model.model_path).parent_path() / "tokenizer.json";
    return fs::exists(beside) ? beside.string() : "";
  }
};

// --stop-token "ID,ID,...", each in [0, vocab).
std::vector<int32_t> parse_stop_tokens(const std::string& text, int64_t vocab) {
  std::vector<int32_t> ids;
  if (text.empty()) return ids;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    size_t used = 0;
    int64_t id = -1;
    try {
      id = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    HYDRA_USER_CHECK(used == item.size() && !item.empty(), "--stop-token: '{}' is not a token id", item);
    HYDRA_USER_CHECK(id >= 0 && id < vocab, "--stop-token: id {} is outside the model's vocabulary [0, {})", id, vocab);
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

// What ends a prompt's generation besides --max-new-tokens: the --stop-token ids, then the
// tokenizer's eos unless --no-default-stop (default_ids, when the tokenizer is known), and the
// tokenizer's texts for --stop strings.
struct Stops {
  std::vector<int32_t> ids;          // --stop-token's, then default_ids
  std::vector<int32_t> default_ids;  // the tokenizer's eos ids within the vocabulary, not already given
  std::string tokenizer;             // its tokenizer.json ("" when unknown)
  std::optional<TokenTexts> texts;   // read when the tokenizer is known
};

Stops read_stops(const GenerateCliOptions& opt, int64_t vocab) {
  Stops stops;
  stops.ids = parse_stop_tokens(opt.stop_tokens, vocab);
  stops.tokenizer = opt.tokenizer_path();
  if (stops.tokenizer.empty()) return stops;
  // The ids alone for the default stop; the decoder too for stop strings (one hydra does not read is
  // then named, and only then).
  stops.texts = TokenTexts::from_file(stops.tokenizer, opt.stop_strings.empty() ? TokenTexts::Decode::no : TokenTexts::Decode::yes);
  HYDRA_USER_CHECK(stops.texts->size() <= vocab || opt.stop_strings.empty(), "{}: the tokenizer has {} ids, the "
                   "model's vocabulary {} (another model's tokenizer?)", stops.tokenizer, stops.texts->size(), vocab);
  if (!opt.no_default_stop) {
    for (const int32_t id : default_stop_ids(stops.tokenizer, *stops.texts)) {
      if (id < vocab && std::find(stops.ids.begin(), stops.ids.end(), id) == stops.ids.end()) stops.default_ids.push_back(id);
    }
  }
  stops.ids.insert(stops.ids.end(), stops.default_ids.begin(), stops.default_ids.end());
  return stops;
}

// The prompts of a prompt file: input_ids whole, or split by prompt_offsets [N+1] (0 = o_0 < o_1 <
// … < o_N = T: every prompt non-empty, the ids partitioned).
std::vector<std::vector<int32_t>> read_prompts(const std::string& path, int64_t vocab) {
  const std::vector<int32_t> ids = read_token_file(path, vocab);
  const int64_t t = static_cast<int64_t>(ids.size());
  std::vector<int64_t> offsets = {0, t};
  H5File file = H5File::open_read(path);
  // A packed token file's documents are not prompts unless the file says so: one long prompt of
  // them all would be a silent misreading.
  HYDRA_USER_CHECK(file.has_dataset("prompt_offsets") || !file.has_dataset("document_offsets"),
                   "{}: has document_offsets but no prompt_offsets; generate splits prompts only by prompt_offsets "
                   "(write the documents' offsets as prompt_offsets to decode each as a prompt)", path);
  if (file.has_dataset("prompt_offsets")) {
    offsets = file.read_integer_vector("prompt_offsets");
    HYDRA_USER_CHECK(offsets.size() >= 2, "{}: prompt_offsets needs N + 1 >= 2 entries (has {})", path, offsets.size());
    HYDRA_USER_CHECK(offsets.front() == 0 && offsets.back() == t,
                     "{}: prompt_offsets must start at 0 and end at the {} ids of input_ids (has {} .. {})", path, t,
                     offsets.front(), offsets.back());
    for (size_t i = 0; i + 1 < offsets.size(); ++i) {
      HYDRA_USER_CHECK(offsets[i] < offsets[i + 1], "{}: prompt {} is empty or reversed (prompt_offsets[{}] = {}, [{}] = {})",
                       path, i, i, offsets[i], i + 1, offsets[i + 1]);
    }
  }
  std::vector<std::vector<int32_t>> prompts;
  for (size_t i = 0; i + 1 < offsets.size(); ++i) prompts.emplace_back(ids.begin() + offsets[i], ids.begin() + offsets[i + 1]);
  return prompts;
}

// The longest sequence a prompt and its new tokens may make: the runtime's largest tensor dimension
// (runtime/tensor.h), so the sizes below cannot overflow and the memory plan refuses what does not fit.
constexpr int64_t kMaxSequence = kMaxElements;

// The prompts' lengths, their sum and the longest prefill on `sp` ranks (prefill_length), each prompt
// checked to fit with its new tokens in kMaxSequence positions (so the cache sizes cannot overflow; the
// memory plan then refuses what does not fit).
struct PromptSizes {
  std::vector<int64_t> lengths;
  int64_t longest_prefill = 0, total_tokens = 0;
};

PromptSizes prompt_sizes(const std::vector<std::vector<int32_t>>& prompts, const ModelConfig& config,
                         int64_t max_new_tokens, int sp) {
  PromptSizes sizes;
  for (const auto& prompt : prompts) {
    const int64_t len = static_cast<int64_t>(prompt.size());
    HYDRA_USER_CHECK(max_new_tokens <= kMaxSequence - len,
                     "--max-new-tokens {}: a prompt of {} tokens and its new tokens would exceed {} positions",
                     max_new_tokens, len, kMaxSequence);
    sizes.longest_prefill = std::max(sizes.longest_prefill, prefill_length(config, len, sp));
    sizes.total_tokens += len;
    sizes.lengths.push_back(len);
  }
  return sizes;
}

// One JSON line per prompt, in file order (with log-probabilities: each new token's and its K most
// likely alternatives'), and the totals the summary reports.
struct SequenceLines {
  std::string text;
  int64_t generated = 0;  // new tokens in all
  double decode_s = 0;    // the longest decode
};

SequenceLines sequence_lines(const std::vector<GeneratedSequence>& result,
                             const std::vector<std::vector<int32_t>>& prompts, bool logprobs) {
  SequenceLines out;
  for (size_t b = 0; b < result.size(); ++b) {
    const GeneratedSequence& seq = result[b];
    out.generated += static_cast<int64_t>(seq.tokens.size());
    out.decode_s = std::max(out.decode_s, seq.decode_s);
    nlohmann::json line = {
        {"prompt_index", b},
        {"tokens", seq.tokens},
        {"prompt_tokens", prompts[b].size()},
        {"prefill_tokens", seq.prefilled},
        {"prefill_s", seq.prefill_s},
        {"decode_s", seq.decode_s},
        {"decode_tokens_per_s", seq.decode_s > 0 ? static_cast<double>(seq.tokens.size()) / seq.decode_s : 0.0},
        {"stopped", seq.stopped}};
    if (!seq.stop_string.empty()) line["stop_string"] = seq.stop_string;
    if (logprobs) {  // per new token: log p, and [id, log p] of the K most likely
      line["logprobs"] = seq.logprobs;
      nlohmann::json top = nlohmann::json::array();
      for (const auto& alternatives : seq.top) {
        nlohmann::json step = nlohmann::json::array();
        for (const auto& [id, lp] : alternatives) step.push_back({id, lp});
        top.push_back(std::move(step));
      }
      line["top_logprobs"] = std::move(top);
    }
    out.text += line.dump() + "\n";
  }
  return out;
}

// Every group's memory plan checked on every rank, so all refuse together; the largest cache per rank.
double check_group_plans(App& app, const std::vector<GenerationGroupPlan>& plans, Device device, int sp) {
  const int groups = static_cast<int>(plans.size());
  double cache_rank_bytes = 0;
  for (int g = 0; g < groups; ++g) {
    const GenerationGroupPlan& plan = plans[static_cast<size_t>(g)];
    if (plan.prompts.empty()) continue;  // more groups than prompts
    cache_rank_bytes = std::max(cache_rank_bytes, plan.cache_bytes);
    check_memory_plan(plan.estimate, device,
                      fmt::format("generation for {} prompt(s) of {} tokens in all on {} rank(s){}", plan.prompts.size(),
                                  plan.tokens, sp, groups > 1 ? fmt::format(" (sequence group {})", g) : ""),
                      app.mpi.local_size(), "use more ranks (on more nodes), fewer or shorter prompts, or fewer --max-new-tokens");
  }
  return cache_rank_bytes;
}

[[maybe_unused]] double gib(double bytes) { return bytes / (1024.0 * 1024.0 * 1024.0); }

}  // namespace

int run_generate(App& app, const std::vector<std::string>& args) {
  GenerateCliOptions opt;
  po::options_description desc("hydra generate");
  opt.bind(desc);
  if (!parse_command_line(app, "generate",
                          "(--model M.h5 | --preset NAME [--weight-seed W]) --prompt P.h5 --max-new-tokens N [--temperature 0] "
                          "[--top-k K] [--top-p P] [--seed S] [--repetition-penalty F] [--stop-token ID,...] [--stop TEXT ...] [--tokenizer DIR] "
                          "[--no-default-stop] [--logprobs K] [--sp N] --out OUT.jsonl [--device cpu|cuda] [--cuda-graph on|off|auto]",
                          desc, args)) {
    return 0;
  }
  opt.validate();
  Communicator& comm = app.world;
  ModelRun run = ModelRun::begin(app, opt.model, opt.device);
  const ModelConfig& config = run.config;
  const Device device = run.device;
  const std::vector<std::vector<int32_t>> prompts = read_prompts(opt.prompt, config.vocab_size);
  const Stops stops = read_stops(opt, config.vocab_size);
  const std::vector<int32_t>& stop = stops.ids;
  const StopStrings stop_strings(opt.stop_strings, stops.texts ? &*stops.texts : nullptr);
  const int ranks = comm.size();
  const int p = SequenceGroups::resolve_sp(opt.sp, ranks);  // ranks per prompt
  const int groups_count = ranks / p;
  const DecodeGraph graph_mode = parse_decode_graph(opt.cuda_graph);
  HYDRA_USER_CHECK(graph_mode != DecodeGraph::on || decode_graph_possible(device),
                   "--cuda-graph on needs the GPU (this run: {}; auto, the default, replays the step on one rank per "
                   "prompt on the GPU)", device_name(device));
  const bool graph = decode_graph_wanted(graph_mode, device, p);
  // Memory plan (model/generate.h) of every group (its prompts: b mod groups): the longest
  // prefill, the cache and the decode engine's buffers. Every rank checks every group, so all refuse together.
  const PromptSizes sizes = prompt_sizes(prompts, config, opt.max_new_tokens, p);
  const std::vector<int64_t>& lengths = sizes.lengths;
  const int64_t longest_prefill = sizes.longest_prefill, total_tokens = sizes.total_tokens;
  const int64_t slots = static_cast<int64_t>(prompts.size());
  const KvCacheBytes cache_bytes = kv_cache_bytes(config, run.dtype, DType::f32);
  // The decode engine keeps the logits on the host whenever tokens are not the device's arg-max
  // (model/generate.cpp): sampling, a repetition penalty, log-probabilities.
  const bool host_logits = opt.temperature > 0 || opt.repetition_penalty != 1.0 || opt.logprobs > 0;
  const std::vector<GenerationGroupPlan> plans =
      plan_generation_groups(config, lengths, opt.max_new_tokens, p, groups_count, device, host_logits);
  const double cache_rank_bytes = check_group_plans(app, plans, device, p);  // the largest over the groups
  const MemoryEstimate& estimate = plans[static_cast<size_t>(comm.rank() / p)].estimate;  // this rank's group's
  std::vector<int32_t> all_ids;
  for (const auto& prompt : prompts) all_ids.insert(all_ids.end(), prompt.begin(), prompt.end());
  run.inputs.add_tokens("prompt tokens", all_ids);
  run.inputs.add("prompt count", std::to_string(slots));
  add_file_datasets(run.inputs, "prompt file", opt.prompt);  // prompt_offsets too: sizes of every collective
  if (stops.texts) run.inputs.add("tokenizer texts", stops.texts->fingerprint());  // the same stop decisions on every rank
  run.inputs.add("stop ids", fmt::format("{}", fmt::join(stop, ",")));
  ModelRun::Started started = run.start(app, opt.model, opt.device, opt.nccl_timeout);
  DeviceWorld& world = started.world;
  const Model& model = started.model;
  SequenceGroups groups(*world.comm, p);
  log::info("generate: {} prompt(s), {} tokens in all, up to {} new each, {} rank(s) ({} group(s) of {}) on {}, {}; "
            "cache {:.1f} KiB per token + {:.1f} MiB per sequence, {} per rank planned; decode steps {}", slots, total_tokens,
            opt.max_new_tokens, ranks, groups.replicas(), p, device_name(world.device), config.summary(), cache_bytes.per_token / 1024.0,
            cache_bytes.per_slot / 1048576.0, estimate.describe(), graph ? "replayed as a CUDA graph" : "launched eagerly");
  const double load_s = started.load_s;
  if (!stops.default_ids.empty()) {
    log::info("generate: stopping at the tokenizer's eos {} ({}; --no-default-stop: none)", fmt::join(stops.default_ids, ","),
              stops.tokenizer);
  }
#if HYDRA_CUDA
  if (device == Device::cuda) cuda_reset_peak();
#endif
  const GenerateOptions options{
      .max_new_tokens = opt.max_new_tokens,
      .sampling = {.temperature = opt.temperature, .top_k = opt.top_k, .top_p = opt.top_p, .seed = opt.seed,
                   .repetition_penalty = opt.repetition_penalty},
      .stop_tokens = stop,
      .stop_strings = stop_strings.empty() ? nullptr : &stop_strings,
      .progress = opt.progress == "on" || (opt.progress == "auto" && longest_prefill >= 65536),
      .top_logprobs = opt.logprobs,
      .cuda_graph = graph ? DecodeGraph::on : DecodeGraph::off};
  const auto t0 = std::chrono::steady_clock::now();
  // This group's prompts (b ≡ group mod groups), then every group's sequences to every rank.
  const std::vector<GeneratedSequence> local = generate_for_group(groups, model, prompts, options);
  check_device_progress(world);
  const std::vector<GeneratedSequence> result =
      gather_generated(groups, local, slots, opt.logprobs, config.vocab_size, opt.stop_strings);
  const double total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  double peak_gib = host_peak_memory_gib();
#if HYDRA_CUDA
  if (device == Device::cuda) peak_gib = gib(static_cast<double>(cuda_memory_stats().peak));
#endif
  if (comm.rank() != 0) return 0;
  const SequenceLines lines = sequence_lines(result, prompts, opt.logprobs > 0);
  const int64_t generated = lines.generated;
  const double decode_s = lines.decode_s;
  const nlohmann::json summary = {
      {"summary", true},
      {"command", "generate"},
      {"model", opt.model.describe()},
      {"arch", arch_name(config.arch)},
      {"ranks", ranks},
      {"sp", p},
      {"device", device_flag_name(world.device)},
      {"prompts", slots},
      {"prompt_tokens", total_tokens},
      {"new_tokens", generated},
      {"temperature", opt.temperature},
      {"repetition_penalty", opt.repetition_penalty},
      {"cache_bytes_per_token", cache_bytes.per_token},
      {"cache_bytes_per_sequence", cache_bytes.per_slot},
      {"cache_bytes_per_rank", cache_rank_bytes},
      {"load_s", load_s},
      {"total_s", total_s},
      {"decode_s", decode_s},
      {"decode_tokens_per_s", decode_s > 0 ? static_cast<double>(generated) / decode_s : 0.0},
      {"cuda_graph", graph},
      {"peak_memory_gib", peak_gib}};
  write_text_atomically(opt.out, lines.text + summary.dump() + "\n");
  log::info("generate: {} new tokens for {} prompt(s) in {:.2f} s (decode {:.2f} s, {:.1f} tokens/s); peak memory "
            "{:.2f} GiB; wrote {}", generated, slots, total_s, decode_s,
            decode_s > 0 ? static_cast<double>(generated) / decode_s : 0.0, peak_gib, opt.out);
  std::cout << summary.dump() << std::endl;
  return 0;
}

}  // namespace hydra
