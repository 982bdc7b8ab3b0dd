// hydra plan: what fits where. For a preset or a checkpoint's config and a world of 1..N GPUs of M
// bytes each, the per-rank memory of a training step and of a prefill by part (weights, optimizer,
// and the pass's peak as activations, workspaces and GDN maps: MemoryPart), and the longest
// sequence that fits each — from the memory plans `hydra train` and `hydra prefill` enforce
// (model/memory_plan.h: estimate_training_memory with the same arguments cmd_train passes, at the
// minimum kept activations; estimate_prefill_memory as cmd_prefill calls it for one document), and
// the same rule (a plan fits below 95% of the memory). Nothing is allocated; one process.
#include <functional>
#include <iostream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "launch/cli.h"
#include "model/memory_plan.h"
#include "model/model.h"
#include "model/params.h"
#include "model/sequence_length.h"
#include "model/train/training_plan.h"
#include "parallel/layout.h"
#include "runtime/sizes.h"

namespace hydra {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr int64_t kSearchCap = int64_t{1} << 27;  // 128M tokens: the longest length looked for

struct PlanOptions {
  std::string preset, model, gpu_memory = "80G", zero = "auto";
  int gpus = 8, sp = 0, ranks_per_gpu = 1;
  int64_t batch_seqs = 1;
  bool json = false;
};

// The shortest length a run takes: the first multiple of `granule` that `allowed` admits (the conv
// halo may ask for more than the layout's granule), or past the search's cap when none up to it does.
int64_t shortest_allowed(int64_t granule, const std::function<bool(int64_t)>& allowed) {
  int64_t len = granule;
  while (len <= kSearchCap && !allowed(len)) len += granule;
  return len;
}

// The longest length k·granule from `shortest` up to the search's cap whose plan fits `usable` bytes,
// or 0 (not even `shortest` fits). The plans run the passes, so only lengths a run takes are planned.
int64_t longest_fitting(int64_t shortest, int64_t granule, double usable,
                        const std::function<MemoryEstimate(int64_t)>& plan) {
  if (shortest > kSearchCap || !fits_in(plan(shortest), usable)) return 0;
  int64_t lo = shortest / granule, hi = kSearchCap / granule;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (fits_in(plan(mid * granule), usable)) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo * granule;
}

// A longest length for the table: "none", or "≥128M" where the search stopped at its cap.
std::string length_text(int64_t len, int64_t granule) {
  if (len == 0) return "none";
  return (len + granule > kSearchCap ? "≥" : "") + format_size(len);
}

// One plan by part, in GiB: weights (the model; a training plan's `weights` less its optimizer),
// the optimizer (gradients, this rank's masters and moments, the bucket), and the pass's peak split
// into activations, workspaces and GDN maps (they sum to `peak_gib`); the build's parameter set
// beside them, since the total takes the larger of the peak and the build.
nlohmann::json parts(const MemoryEstimate& m, int64_t seq_len) {
  const bool build = m.init_extra > m.activations;
  return {{"seq_len", seq_len},
          {"weights_gib", (m.weights - m.optimizer) / kGiB},
          {"optimizer_gib", m.optimizer / kGiB},
          {"activations_gib", m.part(MemoryPart::activations) / kGiB},
          {"workspaces_gib", m.part(MemoryPart::workspaces) / kGiB},
          {"gdn_maps_gib", m.part(MemoryPart::gdn_maps) / kGiB},
          {"peak_gib", m.activations / kGiB},
          {"build_gib", m.init_extra / kGiB},
          {"total_gib", m.total() / kGiB},
          {"peak_at", build ? "building the model" : m.peak_at}};
}

nlohmann::json plan_rows(const ModelConfig& config, const std::vector<int>& worlds, double gpu_bytes, int sp_flag,
                         const std::string& zero, int64_t batch_seqs) {
  nlohmann::json rows = nlohmann::json::array();
  for (const int w : worlds) {
    const int sp = sp_flag == 0 ? w : sp_flag;  // the worlds are multiples of --sp (run_plan)
    const int shards = zero == "0" || (zero == "auto" && w == 1) ? 1 : w;
    // hydra train: batch_seqs windows of seq_len over sp ranks, packed as documents.
    const auto train = [&](int64_t seq_len) {
      return estimate_training_memory(config, batch_seqs * seq_len / sp, sp, nullptr, Device::cuda, false, {}, true,
                                      DType::f32, shards);
    };
    // hydra prefill: one document of seq_len tokens over every rank.
    const auto prefill = [&](int64_t seq_len) { return estimate_prefill_memory(config, seq_len / w, w, Device::cuda, false); };
    // The lengths the commands take (model/sequence_length.h): train's window over sp ranks, prefill's
    // sequence over every rank.
    const int64_t train_shortest = shortest_allowed(SequenceLayout::granularity(sp),
                                                    [&](int64_t len) { return sequence_length_fits(config, len, sp); });
    const int64_t prefill_shortest = shortest_allowed(SequenceLayout::granularity(w),
                                                      [&](int64_t len) { return sequence_length_fits(config, len, w); });
    const int64_t train_len = longest_fitting(train_shortest, SequenceLayout::granularity(sp), gpu_bytes, train);
    const int64_t prefill_len = longest_fitting(prefill_shortest, SequenceLayout::granularity(w), gpu_bytes, prefill);
    const int64_t train_shown = std::max<int64_t>(train_len, train_shortest);
    const int64_t prefill_shown = std::max<int64_t>(prefill_len, prefill_shortest);
    rows.push_back({{"gpus", w}, {"sp", sp}, {"replicas", w / sp}, {"zero", shards > 1 ? 1 : 0},
                    {"train_longest", train_len}, {"prefill_longest", prefill_len},
                    {"train_text", length_text(train_len, SequenceLayout::granularity(sp))},
                    {"prefill_text", length_text(prefill_len, SequenceLayout::granularity(w))},
                    {"train", parts(train(train_shown), train_shown)}, {"prefill", parts(prefill(prefill_shown), prefill_shown)}});
  }
  return rows;
}

}  // namespace

int run_plan(App& app, const std::vector<std::string>& args) {
  PlanOptions opt;
  po::options_description desc("hydra plan");
  desc.add_options()
      ("preset", po::value(&opt.preset), "model shape: a preset name (hydra init --help lists them)")
      ("model", po::value(&opt.model), "model shape: a checkpoint's config (instead of --preset)")
      ("gpus", po::value(&opt.gpus)->default_value(8), "the largest world: rows for 1, 2, 4, … GPUs up to this many (at most 64); with --sp S only the multiples of S")
      ("gpu-memory", po::value(&opt.gpu_memory)->default_value("80G"), "memory of one GPU (80G for an H100, 141G for an H200)")
      ("sp", po::value(&opt.sp)->default_value(0), "ranks per sequence in training (0: all ranks, as hydra train); rows only for worlds it divides, refused when it divides none")
      ("zero", po::value(&opt.zero)->default_value("auto"), "optimizer state over the ranks: 1, 0 or auto (1 on more than one rank), as hydra train")
      ("batch-seqs", po::value(&opt.batch_seqs)->default_value(1), "windows per micro-batch, as hydra train")
      ("ranks-per-gpu", po::value(&opt.ranks_per_gpu)->default_value(1), "ranks sharing each GPU (HYDRA_SHARE_GPUS=1, a testing mode): each holds a whole copy, so a rank's plan must fit 1/K of the GPU; rows then count ranks")
      ("json", po::bool_switch(&opt.json), "print the rows as JSON instead of a table");
  if (!parse_command_line(app, "plan", "--preset NAME | --model FILE.h5 [--gpus N] [--gpu-memory 141G] [--sp S] [--zero 0|1|auto] [--ranks-per-gpu K] [--json]",
                          desc, args)) {
    return 0;
  }
  HYDRA_USER_CHECK(opt.preset.empty() != opt.model.empty(), "give one of --preset and --model");
  HYDRA_USER_CHECK(opt.gpus >= 1 && opt.gpus <= 64, "--gpus {} must be in 1..64", opt.gpus);
  HYDRA_USER_CHECK(opt.sp >= 0, "--sp {} must be 0 (all ranks) or a rank count", opt.sp);
  HYDRA_USER_CHECK(opt.zero == "0" || opt.zero == "1" || opt.zero == "auto", "--zero must be 0, 1 or auto");
  HYDRA_USER_CHECK(opt.batch_seqs >= 1, "--batch-seqs must be at least 1");
  HYDRA_USER_CHECK(opt.ranks_per_gpu >= 1 && opt.ranks_per_gpu <= 64, "--ranks-per-gpu {} must be in 1..64", opt.ranks_per_gpu);
  const double card_bytes = static_cast<double>(parse_size(opt.gpu_memory, "--gpu-memory"));
  HYDRA_USER_CHECK(card_bytes > 0, "--gpu-memory {} must be above 0 (80G for an H100)", opt.gpu_memory);
  // Ranks sharing a GPU each hold what one rank holds alone: each plan fits its share of the card.
  const double gpu_bytes = card_bytes / opt.ranks_per_gpu;
  // The worlds: 1, 2, 4, … up to --gpus, and --gpus; with --sp S those that S ranks per sequence
  // divide (a training run needs a multiple of --sp ranks), said below the table.
  std::vector<int> all_worlds, worlds;
  for (int w = 1; w < opt.gpus; w *= 2) all_worlds.push_back(w);
  all_worlds.push_back(opt.gpus);
  std::string skipped;
  for (const int w : all_worlds) {
    if (opt.sp == 0 || w % opt.sp == 0) {
      worlds.push_back(w);
    } else {
      skipped += fmt::format("{}{}", skipped.empty() ? "" : ", ", w);
    }
  }
  const char* unit = opt.ranks_per_gpu > 1 ? "ranks" : "GPUs";  // rows count ranks when they share GPUs
  HYDRA_USER_CHECK(!worlds.empty(), "--sp {}: none of the worlds of --gpus {} ({} {}) is a multiple of {} ranks per "
                   "sequence; give --gpus a multiple of {}", opt.sp, opt.gpus, skipped, unit, opt.sp, opt.sp);
  const ModelConfig config = opt.preset.empty() ? read_model_config(opt.model) : preset_config(opt.preset);
  agree_on_run(app, {});
  if (app.world.rank() != 0) return 0;
  const nlohmann::json rows = plan_rows(config, worlds, gpu_bytes, opt.sp, opt.zero, opt.batch_seqs);
  if (opt.json) {
    std::cout << nlohmann::json{{"model", opt.preset.empty() ? opt.model : opt.preset},
                                {"parameters", parameter_count(config)}, {"gpu_memory_gib", card_bytes / kGiB},
                                {"ranks_per_gpu", opt.ranks_per_gpu}, {"memory_per_rank_gib", gpu_bytes / kGiB},
                                {"sp", opt.sp}, {"rows", rows}}.dump(1) << "\n";
    return 0;
  }
  std::cout << fmt::format("{}: {} parameters, GPUs of {:.0f} GiB (a plan fits below 95%); per rank, GiB\n",
                           opt.preset.empty() ? opt.model : opt.preset, parameter_count(config), card_bytes / kGiB);
  if (opt.ranks_per_gpu > 1) {
    std::cout << fmt::format("{} ranks share each GPU (HYDRA_SHARE_GPUS=1): each holds a whole copy of what one rank holds, "
                             "so every plan below fits {:.1f} GiB; rows count ranks, not GPUs\n",
                             opt.ranks_per_gpu, gpu_bytes / kGiB);
  }
  std::cout << "                 |                           train                            |"
               "                      prefill\n";
  std::cout << (opt.ranks_per_gpu > 1 ? " ranks" : "  GPUs") << "  sp  ZeRO |   longest weights optim activ  work   GDN build  total |"
               "   longest weights activ  work   GDN build  total\n";
  const auto gib = [](const nlohmann::json& part, const char* key) { return part[key].get<double>(); };
  for (const nlohmann::json& r : rows) {
    const nlohmann::json &t = r["train"], &p = r["prefill"];
    std::cout << fmt::format("  {:>4} {:>3} {:>5} | {:>9} {:>7.1f} {:>5.1f} {:>5.1f} {:>5.1f} {:>5.1f} {:>5.1f} {:>6.1f} |"
                             " {:>9} {:>7.1f} {:>5.1f} {:>5.1f} {:>5.1f} {:>5.1f} {:>6.1f}\n",
                             r["gpus"].get<int>(), r["sp"].get<int>(), r["zero"].get<int>(),
                             r["train_text"].get<std::string>(), gib(t, "weights_gib"), gib(t, "optimizer_gib"),
                             gib(t, "activations_gib"), gib(t, "workspaces_gib"), gib(t, "gdn_maps_gib"),
                             gib(t, "build_gib"), gib(t, "total_gib"), r["prefill_text"].get<std::string>(),
                             gib(p, "weights_gib"), gib(p, "activations_gib"), gib(p, "workspaces_gib"),
                             gib(p, "gdn_maps_gib"), gib(p, "build_gib"), gib(p, "total_gib"));
  }
  std::cout << "  (at the longest length that fits; 'none': not even the shortest, shown at the shortest. optim:\n"
               "  gradients, this rank's masters and moments, the bucket; activ + work + GDN: the pass's peak by\n"
               "  part (activations, workspaces, GDN maps); build: the parameter set while the model is built;\n"
               "  total = weights + optim + the larger of the peak and the build)\n";
  if (!skipped.empty()) {
    std::cout << fmt::format("  (no rows for {} {}: --sp {} needs a multiple of {} ranks)\n", skipped, unit, opt.sp, opt.sp);
  }
  return 0;
}

}  // namespace hydra
