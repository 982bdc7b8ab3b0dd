#include "model/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <span>

#include "model/decode_engine.h"
#include "model/kv_cache.h"
#include "model/params.h"
#include "model/sequence_length.h"
#include "parallel/gdn_scan.h"
#include "runtime/log.h"

namespace hydra {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Rank 0's tokens to every rank (staged through the communicator's device).
void broadcast_tokens(Communicator& comm, std::vector<int32_t>& tokens) {
  if (comm.size() == 1 || tokens.empty()) return;
  Tensor host = Tensor::empty({static_cast<int64_t>(tokens.size())}, DType::i32);
  std::copy(tokens.begin(), tokens.end(), host.data_as<int32_t>());
  if (comm.device() == Device::host) {
    comm.broadcast(host, 0);
  } else {
    Tensor staged = to_device(host, comm.device());
    comm.broadcast(staged, 0);
    copy_into(host, staged);
  }
  std::copy_n(host.data_as<int32_t>(), tokens.size(), tokens.begin());
}

// The sequence-parallel prefill of slot `slot`: its first `length` tokens over every rank.
void prefill_slot(Communicator& comm, const Model& model, KvCache& cache, int64_t slot, std::span<const int32_t> prompt,
                  int64_t length, int64_t prompts, bool progress) {
  const SequenceLayout layout = group_layout(comm, length);
  const Tensor ids = layout.token_rows(prompt.first(static_cast<size_t>(length))).ids;
  const auto t0 = Clock::now();
  ForwardContext context{.comm = comm, .layout = layout, .cache = &cache};
  const int64_t layers = model.config().num_layers;
  if (progress) {
    context.after_layer = [&](int64_t layer) {
      const double s = seconds_since(t0);
      log::info("prefill of prompt {}/{} ({} tokens): layer {}/{}, {:.1f} s, ETA {:.1f} s", slot + 1, prompts, length,
                layer + 1, layers, s, s / static_cast<double>(layer + 1) * static_cast<double>(layers - layer - 1));
    };
  }
  cache.begin_prefill(slot, layout);
  model.forward_residual(context, ids);  // what matters is what the layers stored
  cache.end_prefill(comm);
}

// log p(token) and the k most likely ids of one row of logits (finite), log-softmax in fp64.
void record_logprobs(std::span<const float> row, int32_t token, int64_t k, GeneratedSequence& seq) {
  const float peak = *std::max_element(row.begin(), row.end());
  double sum = 0;
  for (float x : row) sum += std::exp(static_cast<double>(x) - peak);
  const double log_norm = static_cast<double>(peak) + std::log(sum);
  seq.logprobs.push_back(static_cast<double>(row[static_cast<size_t>(token)]) - log_norm);
  std::vector<int32_t> ids(row.size());
  std::iota(ids.begin(), ids.end(), 0);
  const size_t kk = std::min(static_cast<size_t>(k), row.size());
  std::partial_sort(ids.begin(), ids.begin() + static_cast<long>(kk), ids.end(), [&](int32_t a, int32_t b) {
    return row[static_cast<size_t>(a)] > row[static_cast<size_t>(b)] || (row[static_cast<size_t>(a)] == row[static_cast<size_t>(b)] && a < b);
  });
  std::vector<std::pair<int32_t, double>> top;
  for (size_t i = 0; i < kk; ++i) top.emplace_back(ids[i], static_cast<double>(row[static_cast<size_t>(ids[i])]) - log_norm);
  seq.top.push_back(std::move(top));
}

// Prompt b's number: its sampling stream and its name in messages (GenerateOptions::prompt_numbers).
int64_t prompt_number(const GenerateOptions& options, int64_t b) {
  return options.prompt_numbers.empty() ? b : options.prompt_numbers[static_cast<size_t>(b)];
}

// Every prompt's prefill (the tokens prefill_length takes) into its slot, one after another, each over
// every rank between barriers; out[b] receives its prefilled count and time.
void prefill_prompts(Communicator& comm, const Model& model, KvCache& cache,
                     const std::vector<std::vector<int32_t>>& prompts, const GenerateOptions& options,
                     std::vector<GeneratedSequence>& out) {
  const int64_t n = static_cast<int64_t>(prompts.size());
  for (int64_t b = 0; b < n; ++b) {
    const auto& prompt = prompts[static_cast<size_t>(b)];
    GeneratedSequence& seq = out[static_cast<size_t>(b)];
    seq.prefilled = prefill_length(model.config(), static_cast<int64_t>(prompt.size()), comm.size());
    if (seq.prefilled == 0) continue;
    comm.barrier();
    const auto t0 = Clock::now();
    prefill_slot(comm, model, cache, b, prompt, seq.prefilled, n, options.progress);
    comm.barrier();
    seq.prefill_s = seconds_since(t0);
    if (options.progress || seq.prefill_s > 1.0) {
      log::info("prefill of prompt {} ({}/{} here): {} of {} tokens in {:.3f} s", prompt_number(options, b), b + 1, n,
                seq.prefilled, prompt.size(), seq.prefill_s);
    }
  }
}

// The rows of the next decode step: every unfinished sequence b (rows) with its next input token (ids:
// the prompt's next token, then its own last one), and the indices into rows of those whose input is the
// prompt's last token or a new token, which choose the next one (choosing).
void gather_step_rows(const std::vector<std::vector<int32_t>>& prompts, const KvCache& cache,
                      const std::vector<GeneratedSequence>& out, const std::vector<bool>& done,
                      std::vector<int64_t>& rows, std::vector<int32_t>& ids, std::vector<int64_t>& choosing) {
  rows.clear();
  ids.clear();
  choosing.clear();
  for (int64_t b = 0; b < static_cast<int64_t>(prompts.size()); ++b) {
    if (done[static_cast<size_t>(b)]) continue;
    const auto& prompt = prompts[static_cast<size_t>(b)];
    const int64_t pos = cache.tokens(b), len = static_cast<int64_t>(prompt.size());
    // Rows whose input is the prompt's last token or a new token choose the next one.
    if (pos + 1 >= len) choosing.push_back(static_cast<int64_t>(rows.size()));
    rows.push_back(b);
    ids.push_back(pos < len ? prompt[static_cast<size_t>(pos)]
                            : out[static_cast<size_t>(b)].tokens[static_cast<size_t>(pos - len)]);
  }
}

// The next token of sequence `seq` (prompt number `number`) from its row of logits [V]: sampled with a
// draw fixed by the prompt's number and the token's index, after the repetition penalty over `seen`'s
// ids when given (the penalized row in `penalized`); the row's log-probabilities and logits kept in
// `seq` when the options ask.
int32_t sample_from_row(std::span<const float> row, int64_t number, const GenerateOptions& options,
                        const SeenTokens* seen, std::vector<float>& penalized, GeneratedSequence& seq) {
  const uint64_t draw = (static_cast<uint64_t>(number) << 32) | seq.tokens.size();
  int32_t token = 0;
  if (seen) {
    penalized.assign(row.begin(), row.end());
    apply_repetition_penalty(penalized, seen->ids(), options.sampling.repetition_penalty);
    token = sample_token(penalized, options.sampling, draw);
  } else {
    token = sample_token(row, options.sampling, draw);
  }
  // The model's own log-probabilities and logits (before temperature and penalty).
  if (options.top_logprobs > 0) record_logprobs(row, token, options.top_logprobs, seq);
  if (options.keep_logits) seq.logits.insert(seq.logits.end(), row.begin(), row.end());
  return token;
}

}  // namespace

int64_t prefill_length(const ModelConfig& config, int64_t prompt_length, int world_size) {
  const int64_t granularity = SequenceLayout::granularity(world_size);
  const int64_t length = std::max<int64_t>(prompt_length - 1, 0) / granularity * granularity;
  // The longest multiple of the granularity that leaves a token to decode, if it runs (model/sequence_length.h).
  return length > 0 && sequence_length_fits(config, length, world_size) ? length : 0;
}

int64_t cache_rows_needed(const ModelConfig& config, int64_t prompt_length, int64_t max_new_tokens, int world_size) {
  const int64_t prefill = prefill_length(config, prompt_length, world_size);
  const int64_t decoded = prompt_length - prefill + max_new_tokens - 1;  // tokens fed to decode steps
  return prefill / world_size + DecodeDealing::most_rows(decoded, world_size);
}

MemoryEstimate estimate_generation_memory(const ModelConfig& c, const std::vector<int64_t>& prompt_lengths,
                                          int64_t max_new_tokens, int world, Device device, bool sampled) {
  const PlanTypes ty = plan_types(device);
  int64_t longest_prefill = 0, capacity = 1;
  for (const int64_t len : prompt_lengths) {
    longest_prefill = std::max(longest_prefill, prefill_length(c, len, world));
    capacity = std::max(capacity, cache_rows_needed(c, len, max_new_tokens, world));
  }
  const int64_t slots = static_cast<int64_t>(prompt_lengths.size());
  MemoryEstimate m;
  if (longest_prefill > 0) {
    m = estimate_prefill_memory(c, longest_prefill / world, world, device);
  } else {  // every prompt goes through decode steps alone: the model, and no prefill
    m.weights = runtime_tensor_bytes(c, device, ty.dtype, ty.acc);
    m.init_extra = static_cast<double>(parameter_count(c)) * (device == Device::cuda ? 2.0 : 4.0);
  }
  double cache = 0;
  for (const KvCacheLayerSpec& s : kv_cache_spec(c, slots, capacity, ty.dtype, DType::f32)) {
    for (const BufferSpec* b : {&s.k, &s.v, &s.state, &s.conv_tail}) cache += b->exists() ? b->bytes() : 0.0;
  }
  m.add(MemoryPart::cache, cache + decode_engine_buffers(c, slots, sampled).bytes(device));
  return m;
}

std::vector<GeneratedSequence> generate(Communicator& comm, const Model& model,
                                        const std::vector<std::vector<int32_t>>& prompts,
                                        const GenerateOptions& options) {
  const ModelConfig& config = model.config();
  const int64_t n = static_cast<int64_t>(prompts.size()), vocab = config.vocab_size;
  HYDRA_ASSERT(n >= 1 && options.max_new_tokens >= 1, "generate: {} prompts, {} new tokens", n, options.max_new_tokens);
  int64_t capacity = 1;
  for (const auto& p : prompts) {
    HYDRA_ASSERT(!p.empty(), "generate: an empty prompt");
    capacity = std::max(capacity, cache_rows_needed(config, static_cast<int64_t>(p.size()), options.max_new_tokens,
                                                    comm.size()));
  }
  HYDRA_ASSERT(options.prompt_numbers.empty() || static_cast<int64_t>(options.prompt_numbers.size()) == n,
               "generate: {} prompt numbers for {} prompts", options.prompt_numbers.size(), n);
  const auto number = [&](int64_t b) { return prompt_number(options, b); };
  KvCache cache(model, n, capacity, comm.size(), comm.rank());
  std::vector<GeneratedSequence> out(static_cast<size_t>(n));

  prefill_prompts(comm, model, cache, prompts, options, out);  // 1. prompt by prompt, each over every rank

  // 2. Decode: every unfinished sequence feeds its next token each step.
  // B ids to the host, not B·V logits, unless the logits themselves are wanted.
  const double penalty = options.sampling.repetition_penalty;
  const bool greedy_ids = options.sampling.greedy() && penalty == 1.0 && !options.keep_logits && options.top_logprobs == 0;
  // With a repetition penalty: each sequence's distinct ids so far (prompt, then every new token).
  std::vector<SeenTokens> seen;
  if (penalty != 1.0) {
    for (const auto& prompt : prompts) seen.emplace_back(prompt);
  }
  std::vector<float> penalized;  // [V]: the row a token is chosen from, when a penalty changes it
  DecodeEngine engine(comm, model, cache,
                      {.host_logits = !greedy_ids,
                       .cuda_graph = decode_graph_wanted(options.cuda_graph, model.device(), comm.size())});
  const auto t_decode = Clock::now();
  std::vector<bool> done(static_cast<size_t>(n), false);
  double next_report = 30.0;  // a progress line every 30 s of decoding (rank 0)
  int64_t generated = 0;
  std::vector<int64_t> rows, choosing;
  std::vector<int32_t> ids, chosen;
  // Stop strings: each sequence's text tail, starting with its prompt's last tokens (model/token_text.h).
  std::vector<StopStrings::State> stop_states;
  if (options.stop_strings) {
    for (const auto& prompt : prompts) stop_states.push_back(options.stop_strings->start(prompt));
  }
  while (true) {
    if (seconds_since(t_decode) > next_report) {
      log::info("decode: {} of {} new tokens after {:.0f} s ({:.1f} tokens/s)", generated, n * options.max_new_tokens,
                seconds_since(t_decode), static_cast<double>(generated) / seconds_since(t_decode));
      next_report += 30.0;
    }
    gather_step_rows(prompts, cache, out, done, rows, ids, choosing);
    if (rows.empty()) break;
    engine.step(rows, ids,
                choosing.empty() ? StepResult::none : (greedy_ids ? StepResult::argmax : StepResult::logits));
    if (engine.graph_launched()) {
      for (const int64_t b : rows) ++out[static_cast<size_t>(b)].graph_steps;
    }
    if (choosing.empty()) continue;
    const auto nonfinite = [&](int64_t b) {
      HYDRA_USER_FAIL("generate: the logits of prompt {} at position {} are not finite (bad weights?)", number(b),
                      cache.tokens(b) - 1);
    };
    chosen.clear();
    if (greedy_ids) {
      for (const int64_t i : choosing) {
        chosen.push_back(engine.argmax()[static_cast<size_t>(i)]);
        if (chosen.back() < 0) nonfinite(rows[static_cast<size_t>(i)]);
      }
    } else {
      for (const int64_t i : choosing) {
        const int64_t b = rows[static_cast<size_t>(i)];
        const std::span<const float> row = engine.logits().subspan(static_cast<size_t>(i * vocab), static_cast<size_t>(vocab));
        if (!std::all_of(row.begin(), row.end(), [](float v) { return std::isfinite(v); })) nonfinite(b);
        chosen.push_back(sample_from_row(row, number(b), options, penalty != 1.0 ? &seen[static_cast<size_t>(b)] : nullptr,
                                         penalized, out[static_cast<size_t>(b)]));
      }
    }
    broadcast_tokens(comm, chosen);
    for (size_t c = 0; c < choosing.size(); ++c) {
      const int64_t b = rows[static_cast<size_t>(choosing[c])];
      GeneratedSequence& seq = out[static_cast<size_t>(b)];
      seq.tokens.push_back(chosen[c]);
      if (!seen.empty()) seen[static_cast<size_t>(b)].add(chosen[c]);
      ++generated;
      seq.stopped = std::find(options.stop_tokens.begin(), options.stop_tokens.end(), chosen[c]) != options.stop_tokens.end();
      if (options.stop_strings && !seq.stopped) {  // the same tokens on every rank: the same verdict
        if (const auto hit = options.stop_strings->add(stop_states[static_cast<size_t>(b)], chosen[c])) {
          seq.stopped = true;
          seq.stop_string = *hit;
        }
      }
      if (seq.stopped || static_cast<int64_t>(seq.tokens.size()) == options.max_new_tokens) {
        done[static_cast<size_t>(b)] = true;
        seq.decode_s = seconds_since(t_decode);
      }
    }
  }
  return out;
}

std::vector<GenerationGroupPlan> plan_generation_groups(const ModelConfig& config,
                                                        const std::vector<int64_t>& prompt_lengths,
                                                        int64_t max_new_tokens, int sp, int groups, Device device,
                                                        bool sampled) {
  const KvCacheBytes per = kv_cache_bytes(config, storage_dtype(device), DType::f32);
  std::vector<GenerationGroupPlan> plans(static_cast<size_t>(groups));
  for (int g = 0; g < groups; ++g) {
    GenerationGroupPlan& plan = plans[static_cast<size_t>(g)];
    std::vector<int64_t> lengths;
    int64_t capacity = 1;
    for (int64_t b = g; b < static_cast<int64_t>(prompt_lengths.size()); b += groups) {
      const int64_t len = prompt_lengths[static_cast<size_t>(b)];
      capacity = std::max(capacity, cache_rows_needed(config, len, max_new_tokens, sp));
      plan.prompts.push_back(b);
      plan.tokens += len;
      lengths.push_back(len);
    }
    if (lengths.empty()) continue;  // more groups than prompts
    plan.cache_bytes = static_cast<double>(lengths.size()) *
                       (static_cast<double>(capacity) * per.per_token + per.per_slot);
    plan.estimate = estimate_generation_memory(config, lengths, max_new_tokens, sp, device, sampled);
  }
  return plans;
}

std::vector<GeneratedSequence> generate_for_group(SequenceGroups& groups, const Model& model,
                                                  const std::vector<std::vector<int32_t>>& prompts,
                                                  GenerateOptions options) {
  std::vector<std::vector<int32_t>> mine;
  options.prompt_numbers.clear();
  for (int64_t b = groups.replica(); b < static_cast<int64_t>(prompts.size()); b += groups.replicas()) {
    mine.push_back(prompts[static_cast<size_t>(b)]);
    options.prompt_numbers.push_back(b);
  }
  if (mine.empty()) return {};
  return generate(groups.sequence(), model, mine, options);
}

namespace {

// A group's sequences as doubles: per sequence [n, tokens (n), prefilled, prefill_s, decode_s, stopped,
// the stop string's index in `stop_strings` + 1 (0: none)], then per token [log p, K × (id, log p)] when
// log-probabilities were asked for.
std::vector<double> pack_sequences(const std::vector<GeneratedSequence>& sequences,
                                   const std::vector<std::string>& stop_strings) {
  std::vector<double> packed;
  for (const GeneratedSequence& seq : sequences) {
    packed.push_back(static_cast<double>(seq.tokens.size()));
    packed.insert(packed.end(), seq.tokens.begin(), seq.tokens.end());
    const auto which = std::find(stop_strings.begin(), stop_strings.end(), seq.stop_string);
    HYDRA_ASSERT(seq.stop_string.empty() || which != stop_strings.end(), "stop string '{}' is not one asked for",
                 seq.stop_string);
    packed.insert(packed.end(), {static_cast<double>(seq.prefilled), seq.prefill_s, seq.decode_s, seq.stopped ? 1.0 : 0.0,
                                 seq.stop_string.empty() ? 0.0 : static_cast<double>(which - stop_strings.begin() + 1)});
    for (size_t j = 0; j < seq.logprobs.size(); ++j) {
      packed.push_back(seq.logprobs[j]);
      for (const auto& [id, lp] : seq.top[j]) packed.insert(packed.end(), {static_cast<double>(id), lp});
    }
  }
  return packed;
}

// One sequence of group `g`'s packed values from `at` on (advanced past it): prompt `b`'s.
GeneratedSequence unpack_sequence(const std::vector<double>& v, size_t& at, int g, int64_t b, size_t k,
                                  const std::vector<std::string>& stop_strings) {
  GeneratedSequence seq;
  HYDRA_ASSERT(at < v.size(), "group {}'s gathered sequences end before prompt {}", g, b);
  const size_t n = static_cast<size_t>(v[at++]);
  HYDRA_ASSERT(at + n + 5 <= v.size(), "group {}'s gathered sequence {} is cut short", g, b);
  for (size_t j = 0; j < n; ++j) seq.tokens.push_back(static_cast<int32_t>(v[at + j]));
  at += n;
  seq.prefilled = static_cast<int64_t>(v[at]);
  seq.prefill_s = v[at + 1];
  seq.decode_s = v[at + 2];
  seq.stopped = v[at + 3] != 0;
  if (v[at + 4] > 0) seq.stop_string = stop_strings.at(static_cast<size_t>(v[at + 4]) - 1);
  at += 5;
  for (size_t j = 0; k > 0 && j < n; ++j) {
    HYDRA_ASSERT(at + 1 + 2 * k <= v.size(), "group {}'s gathered log-probabilities of prompt {} are cut short", g, b);
    seq.logprobs.push_back(v[at++]);
    seq.top.emplace_back();
    for (size_t i = 0; i < k; ++i, at += 2) seq.top.back().emplace_back(static_cast<int32_t>(v[at]), v[at + 1]);
  }
  return seq;
}

}  // namespace

std::vector<GeneratedSequence> gather_generated(SequenceGroups& groups, const std::vector<GeneratedSequence>& mine,
                                                int64_t prompts, int64_t top_logprobs, int64_t vocab,
                                                const std::vector<std::string>& stop_strings) {
  const std::vector<std::vector<double>> gathered = groups.gather(pack_sequences(mine, stop_strings));
  const size_t k = static_cast<size_t>(std::min(top_logprobs, vocab));
  std::vector<GeneratedSequence> result(static_cast<size_t>(prompts));
  for (int g = 0; g < groups.replicas(); ++g) {
    const std::vector<double>& v = gathered[static_cast<size_t>(g)];
    size_t at = 0;
    for (int64_t b = g; b < prompts; b += groups.replicas()) result[static_cast<size_t>(b)] = unpack_sequence(v, at, g, b, k, stop_strings);
    HYDRA_ASSERT(at == v.size(), "group {} sent {} values, {} read", g, v.size(), at);
  }
  return result;
}

}  // namespace hydra
