// hydra forward: logits of a token sequence, sequence-parallel over the MPI ranks (CPU path).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>

#include <nlohmann/json.hpp>

#include "launch/cli.h"
#include "launch/model_source.h"
#include "model/cost.h"
#include "model/nonfinite.h"
#include "runtime/atomic_file.h"
#include "runtime/hdf5_file.h"
#include "runtime/log.h"
#include "runtime/random.h"
#include "runtime/sizes.h"
#include "runtime/token_file.h"
#include "kernels/softmax/softmax.h"

namespace hydra {
namespace {

struct ForwardOptions {
  ModelSource model;
  std::string input;
  std::string seq_len;
  uint64_t token_seed = 1;
  std::string output;

  void bind(po::options_description& o) {
    model.bind(o);
    o.add_options()
        ("input", po::value(&input), "token file (.h5 with input_ids [T], int32/int64)")
        ("seq-len", po::value(&seq_len), "instead of --input: this many random tokens (accepts 4K, 1M)")
        ("token-seed", po::value(&token_seed)->default_value(1), "seed of the random tokens for --seq-len")
        ("output", po::value(&output), "logits file to write (.h5, dataset logits [T, vocab] float32); rank 0 writes");
  }
  void validate() const {
    model.validate();
    HYDRA_USER_CHECK(input.empty() != seq_len.empty(), "give exactly one of --input TOKENS.h5 or --seq-len N");
    if (!input.empty()) require_readable_file(input, "input");
    if (!seq_len.empty()) parse_size(seq_len, "--seq-len");
    if (!output.empty()) require_writable_destination(output, "output");
  }
};

std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint64_t seed) {
  const RandomStream rng{seed, hash_name("tokens")};
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ids[i] = static_cast<int32_t>(rng.bits(static_cast<uint64_t>(i)) % vocab);
  return ids;
}

}  // namespace

int run_forward(App& app, const std::vector<std::string>& args) {
  ForwardOptions opt;
  po::options_description desc("hydra forward");
  opt.bind(desc);
  if (!parse_command_line(app, "forward",
                          "(--model FILE.h5 | --preset NAME) (--input TOKENS.h5 | --seq-len N) [--output LOGITS.h5]",
                          desc, args)) {
    return 0;
  }
  opt.validate();
  Communicator& comm = app.world;
  // Cheap checks first: config, tokens against its vocabulary, the layout's length rule, the memory
  // plan; then the ranks agree on all of it before the first collective.
  const ModelConfig config = opt.model.config();
  std::vector<int32_t> ids;
  if (!opt.input.empty()) ids = read_token_file(opt.input, config.vocab_size);
  const int64_t total = opt.input.empty() ? parse_size(opt.seq_len, "--seq-len") : static_cast<int64_t>(ids.size());
  const SequenceLayout layout = SequenceLayout::zigzag(total, comm.size(), comm.rank());
  const int64_t t_local = layout.local_length(), vocab = config.vocab_size;
  MemoryEstimate estimate = estimate_prefill_memory(config, t_local, comm.size(), Device::host);
  // Beyond the prefill: every rank's logits [T_loc, V] and the token ids, and on rank 0 with --output
  // the assembled [T, V] and one incoming block.
  const double logits_bytes = static_cast<double>(t_local) * static_cast<double>(vocab) * 4.0;
  estimate.activations += logits_bytes + static_cast<double>(total) * 4.0 +
                          (!opt.output.empty() && comm.rank() == 0
                               ? logits_bytes + static_cast<double>(total) * static_cast<double>(vocab) * 4.0
                               : 0.0);
  check_memory_plan(estimate, Device::host, fmt::format("forward of {} tokens on {} rank(s)", total, comm.size()),
                    app.mpi.local_size());
  if (opt.input.empty()) ids = random_tokens(total, config.vocab_size, opt.token_seed);
  RunFingerprint inputs;
  add_model_fields(inputs, config, Device::host, DType::f32);
  if (opt.input.empty()) {
    inputs.add("token count", std::to_string(total));
  } else {
    inputs.add_tokens("input tokens", ids);
  }
  agree_on_run(app, inputs);

  const auto t0 = std::chrono::steady_clock::now();
  const Model model = opt.model.build(Device::host, DType::f32);
  const auto t1 = std::chrono::steady_clock::now();
  Tensor local_ids = Tensor::empty({t_local}, DType::i32);
  std::vector<int32_t> targets(static_cast<size_t>(t_local), -1);  // next token of each local row, −1 at the end
  for (const Segment& s : layout.local_segments()) {
    for (int64_t i = 0; i < s.length; ++i) {
      local_ids.data_as<int32_t>()[s.local_offset + i] = ids[static_cast<size_t>(s.start + i)];
      if (s.start + i + 1 < total) targets[s.local_offset + i] = ids[static_cast<size_t>(s.start + i + 1)];
    }
  }
  ForwardContext context{comm, layout};
  const Tensor hidden = model.forward(context, local_ids);
  Tensor logits = Tensor::empty({t_local, vocab}, DType::f32);
  model.lm_head(logits, hidden);
  const auto t2 = std::chrono::steady_clock::now();

  // Mean next-token NLL over the sequence: a summary that depends on every logit of every rank.
  Tensor nll = Tensor::empty({1}, DType::f32);
  Tensor stats = Tensor::zeros({3}, DType::f32);  // [Σ nll, count, rows with a non-finite logit]
  for (int64_t i = 0; i < t_local; ++i) {
    const float* row = logits.data_as<float>() + i * vocab;
    if (!std::all_of(row, row + vocab, [](float v) { return std::isfinite(v); })) stats.data_as<float>()[2] += 1.0f;
    if (targets[i] < 0) continue;
    Tensor target = Tensor::empty({1}, DType::i32);
    target.data_as<int32_t>()[0] = targets[i];
    ops::cross_entropy(nll, logits.view().narrow(0, i, 1), target);
    stats.data_as<float>()[0] += nll.data_as<float>()[0];
    stats.data_as<float>()[1] += 1.0f;
  }
  comm.all_reduce_sum(stats);
  // Every rank sees the same sums, so every rank takes the same branch (the search is collective).
  if (stats.data_as<float>()[2] > 0 || !std::isfinite(stats.data_as<float>()[0])) {
    fail_nonfinite(model, comm, ids, fmt::format("forward: the logits at {} position(s) are",
                                                 static_cast<int64_t>(stats.data_as<float>()[2])));
  }

  if (!opt.output.empty()) {
    // Rank 0 assembles the logits in global order from every rank's segments and writes once.
    if (comm.rank() == 0) {
      Tensor all = Tensor::empty({total, vocab}, DType::f32);
      Tensor incoming = Tensor::empty({t_local, vocab}, DType::f32);
      for (int r = 0; r < comm.size(); ++r) {
        const TensorView src = r == 0 ? logits.view() : incoming.view();
        if (r != 0) comm.recv(incoming, r);
        for (const Segment& s : layout.segments_of(r)) {
          copy_into(all.view().narrow(0, s.start, s.length), src.narrow(0, s.local_offset, s.length));
        }
      }
      AtomicFile out(opt.output);
      H5File file = H5File::create(out.temp_path());
      file.write("logits", all);
      file.close();
      out.commit();
    } else {
      comm.send(logits, 0);
    }
  }
  const double load_s = std::chrono::duration<double>(t1 - t0).count();
  const double run_s = std::chrono::duration<double>(t2 - t1).count();
  const double mean_nll = stats.data_as<float>()[1] > 0 ? stats.data_as<float>()[0] / stats.data_as<float>()[1] : 0.0;
  if (comm.rank() == 0) {
    log::info("forward: {} tokens on {} rank(s), {} — load {:.2f} s, forward {:.2f} s ({:.0f} tokens/s), mean next-token NLL {:.4f}",
              total, comm.size(), config.summary(), load_s, run_s, total / run_s, mean_nll);
    const nlohmann::json summary = {{"command", "forward"},   {"model", opt.model.describe()},
                                    {"tokens", total},        {"ranks", comm.size()},
                                    {"load_s", load_s},       {"forward_s", run_s},
                                    {"tokens_per_s", total / run_s}, {"mean_nll", mean_nll},
                                    {"output", opt.output}};
    std::cout << summary.dump() << std::endl;
  }
  return 0;
}

}  // namespace hydra
