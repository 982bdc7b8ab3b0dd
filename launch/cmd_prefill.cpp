// hydra prefill: long-context prefill, sequence-parallel over the ranks (one GPU each), timed.
//
// Reports per-phase times (GEMM, FA, GDN, exposed communication, other; rank 0's), tokens/s,
// achieved TFLOP/s against the configured ceiling, and peak memory per rank; a progress line per
// layer on long runs; and one JSON line at the end for scripts (also appended to --json-out).
// Memory is estimated before anything is allocated and the run refused when it cannot fit.
// Only the last position's logits are formed (never [T, vocab]).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iostream>

#include <nlohmann/json.hpp>

#include "launch/cli.h"
#include "launch/model_source.h"
#include "model/cost.h"
#include "model/memory_plan.h"
#include "model/prefill.h"
#include "parallel/device_world.h"
#include "runtime/atomic_file.h"
#include "runtime/host_memory.h"
#include "runtime/log.h"
#include "runtime/sizes.h"
#include "runtime/token_file.h"
#if HYDRA_CUDA
#include "runtime/cuda_memory.h"
#endif

namespace hydra {
namespace {

struct PrefillOptions {
  ModelSource model;
  std::string seq_len;
  std::string input;
  uint64_t token_seed = 1;
  int repeat = 1;
  int warmup = 0;
  std::string device = "auto";
  double nccl_timeout = 600;
  double peak_tflops = 790;
  std::string progress = "auto";
  std::string json_out;

  void bind(po::options_description& o) {
    model.bind(o);
    o.add_options()
        ("seq-len", po::value(&seq_len)->required(), "tokens to prefill (accepts 128K, 512K, 1M); a multiple of 2P on P ranks")
        ("input", po::value(&input), "token file (.h5 input_ids) instead of random tokens; must hold --seq-len tokens")
        ("token-seed", po::value(&token_seed)->default_value(1), "seed of the random tokens")
        ("repeat", po::value(&repeat)->default_value(1), "timed prefills (the report gives the best and all times)")
        ("warmup", po::value(&warmup)->default_value(0), "untimed prefills before the timed ones")
        ("device", po::value(&device)->default_value("auto"), "cuda, cpu or auto (cuda when a GPU is present)")
        ("nccl-timeout", po::value(&nccl_timeout)->default_value(600), "seconds before a stuck NCCL operation ends the job")
        ("peak-tflops", po::value(&peak_tflops)->default_value(790),
         "the bf16 ceiling for 'fraction of peak' (790: cuBLAS 8192^3 on one H200; hydra bench --op gemm measures it)")
        ("progress", po::value(&progress)->default_value("auto"), "per-layer progress lines: on, off, auto (on from 64K tokens)")
        ("json-out", po::value(&json_out), "append the summary JSON line to this file (sweeps)");
  }
  void validate() const {
    model.validate();
    parse_size(seq_len, "--seq-len");
    if (!input.empty()) require_readable_file(input, "input");
    HYDRA_USER_CHECK(repeat >= 1 && warmup >= 0, "--repeat must be >= 1 and --warmup >= 0");
    HYDRA_USER_CHECK(progress == "on" || progress == "off" || progress == "auto", "--progress must be on, off or auto");
    HYDRA_USER_CHECK(peak_tflops > 0 && nccl_timeout > 0, "--peak-tflops and --nccl-timeout must be positive");
    if (!json_out.empty()) require_writable_destination(json_out, "JSON output");
    if (!json_out.empty()) require_not_an_input(json_out, {input, model.model_path}, "--json-out");
  }
};

double gib(double bytes) { return bytes / (1024.0 * 1024.0 * 1024.0); }

}  // namespace

int run_prefill(App& app, const std::vector<std::string>& args) {
  PrefillOptions opt;
  po::options_description desc("hydra prefill");
  opt.bind(desc);
  if (!parse_command_line(app, "prefill", "(--model FILE.h5 | --preset NAME) --seq-len N [--repeat R] [--device cuda]",
                          desc, args)) {
    return 0;
  }
  opt.validate();
  ModelRun job = ModelRun::begin(app, opt.model, opt.device);  // config, device, the inputs' fingerprint
  const ModelConfig& config = job.config;
  const int64_t total = parse_size(opt.seq_len, "--seq-len");
  std::vector<int32_t> ids;
  std::vector<int64_t> starts;  // the first --seq-len tokens' packed documents (empty: one)
  if (!opt.input.empty()) {
    TokenData data = read_token_data(opt.input, config.vocab_size);
    ids = std::move(data.ids);
    HYDRA_USER_CHECK(static_cast<int64_t>(ids.size()) >= total, "{}: holds {} tokens, --seq-len asks for {}", opt.input,
                     ids.size(), total);
    ids.resize(static_cast<size_t>(total));
    for (int64_t s : document_starts_of(data))
      if (s < total) starts.push_back(s);
  }
  const Device device = job.device;
  const SequenceLayout layout = group_layout(app.world, total, starts);
  const int64_t t_local = layout.local_length();

  // Memory plan, before any allocation: the GPU's free memory, or the host's on the CPU path.
  const MemoryEstimate estimate = estimate_prefill_memory(config, t_local, app.world.size(), device, starts.size() > 1);
  check_memory_plan(estimate, device, fmt::format("prefill of {} tokens on {} rank(s)", total, app.world.size()),
                    app.mpi.local_size());
  RunFingerprint& inputs = job.inputs;
  if (ids.empty()) {
    inputs.add("token count", std::to_string(total));
  } else {
    inputs.add_tokens("input tokens", ids);
    add_file_datasets(inputs, "input", opt.input);  // loss_mask and document_offsets too
  }
  log::info("prefill: {} tokens, {} rank(s) on {}, {}; estimated {} per rank", total, app.world.size(),
            device == Device::cuda ? "GPUs" : "CPUs", config.summary(), estimate.describe());
  // Weights: a preset draws them directly on the device; a checkpoint is read on the host.
  ModelRun::Started ready = job.start(app, opt.model, opt.device, opt.nccl_timeout);
  DeviceWorld& world = ready.world;
  const Model& model = ready.model;
  Communicator& comm = *world.comm;
  const auto t_load = std::chrono::steady_clock::now();
  if (ids.empty()) ids = random_token_sequence(total, config.vocab_size, opt.token_seed);
  check_device_progress(world);
  comm.barrier();
  const double load_s = ready.load_s + std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();
  log::info("model ready in {:.1f} s", load_s);

  const FlopCount flops = prefill_flops(config, total);
#if HYDRA_CUDA
  if (device == Device::cuda) cuda_reset_peak();
#endif
  const PrefillResult result =
      timed_prefill(comm, layout, model, ids,
                    PrefillRun{.warmup = opt.warmup, .repeat = opt.repeat,
                               .progress = opt.progress == "on" || (opt.progress == "auto" && total >= 65536),
                               .check_progress = [&] { check_device_progress(world); }});
  const std::vector<double>& times = result.seconds;
  const auto& phases = result.phases;
  double peak_gib = host_peak_memory_gib();  // CPU path: this process's peak resident memory
#if HYDRA_CUDA
  if (device == Device::cuda) {
    Tensor peak = Tensor::empty({1}, DType::f32, Device::cuda);
    fill(peak, static_cast<float>(gib(static_cast<double>(cuda_memory_stats().peak))));
    Tensor all = Tensor::empty({comm.size()}, DType::f32, Device::cuda);
    comm.all_gather(peak, all);
    Tensor h = to(all, Device::host, DType::f32);
    peak_gib = *std::max_element(h.data_as<float>(), h.data_as<float>() + comm.size());
  }
#endif
  const double best = result.best();
  const double tflops = flops.total() / best / 1e12;
  if (comm.rank() == 0) {
    std::string phase_text;
    nlohmann::json phase_json;
    for (size_t i = 0; i < phases.size(); ++i) {
      phase_text += fmt::format("{}{} {:.3f} s", i ? ", " : "", phase_name(static_cast<Phase>(i)), phases[i]);
      phase_json[phase_name(static_cast<Phase>(i))] = phases[i];
    }
    // The fraction of the bf16 ceiling means something on GPUs only; the CPU path reports its rate.
    const std::string rate = device == Device::cuda
                                 ? fmt::format("{:.1f} TFLOP/s in all = {:.1f} per rank ({:.1f}% of {} TFLOP/s)", tflops,
                                               tflops / comm.size(), 100.0 * tflops / comm.size() / opt.peak_tflops,
                                               opt.peak_tflops)
                                 : fmt::format("{:.3f} TFLOP/s in all on CPUs", tflops);
    log::info("prefill {} tokens on {} rank(s): best {:.3f} s, {:.0f} tokens/s, {}; phases (rank 0, last run): {}; peak "
              "memory {:.2f} GiB per rank{} (estimate {})", total, comm.size(), best, total / best, rate, phase_text,
              peak_gib, device == Device::cuda ? "" : " (resident)", estimate.describe());
    const nlohmann::json summary = {
        {"command", "prefill"},       {"model", opt.model.describe()},     {"arch", arch_name(config.arch)},
        {"ranks", comm.size()},       {"device", device == Device::cuda ? "cuda" : "cpu"},
        {"seq_len", total},           {"seconds", best},                   {"seconds_all", times},
        {"load_seconds", load_s},     {"tokens_per_s", total / best},      {"tflops", tflops},
        {"tflops_per_rank", tflops / comm.size()},
        {"fraction_of_peak", device == Device::cuda ? nlohmann::json(tflops / comm.size() / opt.peak_tflops) : nlohmann::json()},
        {"peak_tflops", opt.peak_tflops}, {"flops", {{"gemm", flops.gemm}, {"attention", flops.attention}, {"gdn", flops.gdn}}},
        {"phases_rank0", phase_json}, {"peak_memory_gib", peak_gib},      {"estimate_gib", gib(estimate.total())},
        {"last_token", result.last_token}, {"last_logit", result.last_logit}};
    std::cout << summary.dump() << std::endl;
    if (!opt.json_out.empty()) {
      std::ofstream out(opt.json_out, std::ios::app);
      out << summary.dump() << "\n";
      HYDRA_USER_CHECK(out.good(), "{}: cannot append the summary", opt.json_out);
    }
  }
  return 0;
}

}  // namespace hydra
