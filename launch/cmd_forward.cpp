// hydra forward: logits of a token sequence and its mean next-token NLL, sequence-parallel over the
// ranks, on the CPU (fp32) or the GPU (bf16 weights; logits written as float32 either way). The
// NLL comes from the chunked loss head the training uses (model/train/objective.h), so no [T, V]
// tensor exists unless --output asks for the logits.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>

#include <nlohmann/json.hpp>

#include "launch/cli.h"
#include "launch/model_source.h"
#include "model/memory_plan.h"
#include "model/nonfinite.h"
#include "model/prefill.h"
#include "model/train/objective.h"
#include "parallel/device_world.h"
#include "runtime/atomic_file.h"
#include "runtime/hdf5_file.h"
#include "runtime/log.h"
#include "runtime/sizes.h"
#include "runtime/token_file.h"

namespace hydra {
namespace {

struct ForwardOptions {
  ModelSource model;
  std::string input;
  std::string seq_len;
  uint64_t token_seed = 1;
  std::string output;
  std::string device = "auto";
  double nccl_timeout = 600;

  void bind(po::options_description& o) {
    model.bind(o);
    o.add_options()
        ("input", po::value(&input), "token file (.h5 with input_ids [T], int32/int64)")
        ("seq-len", po::value(&seq_len), "instead of --input: this many random tokens (accepts 4K, 1M)")
        ("token-seed", po::value(&token_seed)->default_value(1), "seed of the random tokens for --seq-len")
        ("output", po::value(&output), "logits file to write (.h5, dataset logits [T, vocab] float32); rank 0 writes")
        ("device", po::value(&device)->default_value("auto"), "cpu (fp32, the reference), cuda (bf16 weights, one GPU per rank) or auto (cuda when a GPU is present)")
        ("nccl-timeout", po::value(&nccl_timeout)->default_value(600), "seconds before a stuck NCCL operation ends the job");
  }
  void validate() const {
    model.validate();
    HYDRA_USER_CHECK(input.empty() != seq_len.empty(), "give exactly one of --input TOKENS.h5 or --seq-len N");
    if (!input.empty()) require_readable_file(input, "input");
    if (!seq_len.empty()) parse_size(seq_len, "--seq-len");
    if (!output.empty()) require_writable_destination(output, "output");
    if (!output.empty()) require_not_an_input(output, {input, model.model_path}, "--output");
  }
};

// The logits of this rank's rows, checked (the NLL reads every row with a target; the last position
// has none, so its logits are checked here, before they are written: every rank gets the count, the
// search is collective), then assembled by rank 0 in global order from every rank's segments (over
// MPI, host memory) and written once. `device_comm` runs the model's collectives.
void write_logits(Communicator& comm, Communicator& device_comm, const Model& model, const SequenceLayout& layout,
                  const Tensor& hidden, std::span<const int32_t> ids, const std::string& path) {
  const int64_t t_local = layout.local_length(), total = layout.total_length(), vocab = model.config().vocab_size;
  Tensor logits = Tensor::empty({t_local, vocab}, DType::f32, model.device());
  model.lm_head(logits, hidden);
  const Tensor host_logits = to(logits, Device::host, DType::f32);
  Tensor bad_rows = Tensor::zeros({1}, DType::f64);
  for (int64_t i = 0; i < t_local; ++i) {
    const float* row = host_logits.data_as<float>() + i * vocab;
    if (!std::all_of(row, row + vocab, [](float v) { return std::isfinite(v); })) bad_rows.data_as<double>()[0] += 1;
  }
  all_reduce_sum_host(comm, bad_rows);
  if (bad_rows.data_as<double>()[0] > 0) {
    fail_nonfinite(model, device_comm, ids,
                   fmt::format("forward: the logits at {} position(s) are", static_cast<int64_t>(bad_rows.data_as<double>()[0])));
  }
  if (comm.rank() != 0) {
    comm.send(host_logits, 0);
    return;
  }
  Tensor all = Tensor::empty({total, vocab}, DType::f32);
  layout.place_local_rows(all, host_logits);
  Tensor incoming = Tensor::empty({t_local, vocab}, DType::f32);
  for (int r = 1; r < comm.size(); ++r) {
    comm.recv(incoming, r);
    SequenceLayout::zigzag(total, comm.size(), r).place_local_rows(all, incoming);
  }
  AtomicFile out(path);
  H5File file = H5File::create(out.temp_path());
  file.write("logits", all);
  file.close();
  out.commit();
}

// Which targets the NLL counts, as the log says it: the input's loss_mask, its documents (a
// document's first token is not predicted from the one before it), both, or every one.
std::string counted_note(bool has_mask, size_t documents) {
  if (documents > 1) {
    return fmt::format(" ({}within its {} documents: no target across a document boundary)",
                       has_mask ? "the input's loss_mask, " : "", documents);
  }
  return has_mask ? " (the input's loss_mask)" : "";
}

}  // namespace

int run_forward(App& app, const std::vector<std::string>& args) {
  ForwardOptions opt;
  po::options_description desc("hydra forward");
  opt.bind(desc);
  if (!parse_command_line(app, "forward",
                          "(--model FILE.h5 | --preset NAME) (--input TOKENS.h5 | --seq-len N) [--output LOGITS.h5] "
                          "[--device cpu|cuda]",
                          desc, args)) {
    return 0;
  }
  opt.validate();
  Communicator& comm = app.world;
  // Cheap checks first: config, tokens against its vocabulary, the layout's length rule, the memory
  // plan; then the ranks agree on all of it before the first collective.
  ModelRun job = ModelRun::begin(app, opt.model, opt.device);  // config, device, the inputs' fingerprint
  const ModelConfig& config = job.config;
  std::vector<int32_t> ids;
  std::vector<uint8_t> counted;  // the input's loss_mask (empty: every target counts)
  std::vector<int64_t> starts;   // its packed documents (empty: one)
  bool has_mask = false;         // the input has a loss_mask (counted may also come from documents alone)
  if (!opt.input.empty()) {
    TokenData data = read_token_data(opt.input, config.vocab_size);
    has_mask = !data.loss_mask.empty();
    starts = document_starts_of(data);
    if (!starts.empty()) counted = counted_within_documents(data.loss_mask, static_cast<int64_t>(data.ids.size()), starts);
    else counted = std::move(data.loss_mask);
    ids = std::move(data.ids);
  }
  const int64_t total = opt.input.empty() ? parse_size(opt.seq_len, "--seq-len") : static_cast<int64_t>(ids.size());
  const SequenceLayout layout = group_layout(comm, total, starts);
  const int64_t t_local = layout.local_length(), vocab = config.vocab_size;
  const Device device = job.device;
  const MemoryEstimate estimate =
      estimate_forward_memory(config, total, t_local, comm.size(), comm.rank(), device, !opt.output.empty());
  const std::string what = fmt::format("forward of {} tokens on {} rank(s)", total, comm.size());
  check_memory_plan(estimate, device, what, app.mpi.local_size());
  if (device == Device::cuda) {
    MemoryEstimate host;
    host.add(MemoryPart::outputs, forward_host_bytes(config, total, t_local, comm.rank(), !opt.output.empty()));
    check_memory_plan(host, Device::host, what + " (its logits on the host)", app.mpi.local_size());
  }
  if (opt.input.empty()) ids = random_token_sequence(total, config.vocab_size, opt.token_seed);
  RunFingerprint& inputs = job.inputs;
  if (opt.input.empty()) {
    inputs.add("token count", std::to_string(total));
  } else {
    inputs.add_tokens("input tokens", ids);
    add_file_datasets(inputs, "input", opt.input);  // loss_mask and document_offsets too
  }
  ModelRun::Started ready = job.start(app, opt.model, opt.device, opt.nccl_timeout);
  DeviceWorld& world = ready.world;
  const Model& model = ready.model;
  const auto t1 = std::chrono::steady_clock::now();
  const TokenRows rows = layout.token_rows(ids, {.counted = counted, .answer = {}});
  ForwardContext context{.comm = *world.comm, .layout = layout};
  const Tensor hidden = model.forward(context, rows.ids);
  // Mean next-token NLL over the sequence: a summary that depends on every logit of every rank.
  ModelTensors none;
  const train::LossSums local = train::cross_entropy_head(model, hidden, rows.targets, 1.0, TensorView(), none);
  Tensor stats = Tensor::empty({2}, DType::f64);  // [Σ nll, count]
  stats.data_as<double>()[0] = local.loss;
  stats.data_as<double>()[1] = static_cast<double>(local.tokens);
  all_reduce_sum_host(comm, stats);
  check_device_progress(world);
  const auto t2 = std::chrono::steady_clock::now();
  // Every rank sees the same sums, so every rank takes the same branch (the search is collective).
  if (!std::isfinite(stats.data_as<double>()[0])) fail_nonfinite(model, *world.comm, ids, "forward: the next-token NLL is");

  if (!opt.output.empty()) write_logits(comm, *world.comm, model, layout, hidden, ids, opt.output);
  const double load_s = ready.load_s;
  const double run_s = std::chrono::duration<double>(t2 - t1).count();
  const double count = stats.data_as<double>()[1], mean_nll = count > 0 ? stats.data_as<double>()[0] / count : 0.0;
  if (comm.rank() == 0) {
    log::info("forward: {} tokens on {} rank(s) ({}), {} — load {:.2f} s, forward {:.2f} s ({:.0f} tokens/s), mean "
              "next-token NLL {}{}", total, comm.size(), device_name(world.device), config.summary(), load_s, run_s,
              total / run_s,
              count > 0 ? fmt::format("{:.4f} over {} targets{}", mean_nll, static_cast<int64_t>(count),
                                      counted_note(has_mask, starts.size()))
                        : fmt::format("undefined: no target counts{}", counted_note(has_mask, starts.size())),
              // ln V: what a model with random (untrained) weights scores, so a user can tell.
              count > 0 && std::abs(mean_nll - std::log(static_cast<double>(vocab))) < 0.1
                  ? fmt::format(" (≈ ln {} = {:.4f}: chance level, as random weights give)", vocab,
                                std::log(static_cast<double>(vocab)))
                  : "");
    const nlohmann::json summary = {{"command", "forward"},   {"model", opt.model.describe()},
                                    {"tokens", total},        {"ranks", comm.size()},
                                    {"device", device_flag_name(world.device)},
                                    {"load_s", load_s},       {"forward_s", run_s},
                                    {"tokens_per_s", total / run_s},
                                    {"mean_nll", count > 0 ? nlohmann::json(mean_nll) : nlohmann::json()},
                                    {"counted_targets", static_cast<int64_t>(count)},
                                    {"output", opt.output}};
    std::cout << summary.dump() << std::endl;
  }
  return 0;
}

}  // namespace hydra
