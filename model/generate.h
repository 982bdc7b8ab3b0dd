// Generation (hydra generate, DESIGN.md §1.6): prompts → new tokens, with a sequence-parallel prefill
// and a distributed cache (model/kv_cache.h). Collective over `comm`: every rank passes the same
// prompts and options and gets the same tokens.
//
// Per prompt of T tokens, the sequence-parallel prefill runs the longest prefix the zigzag layout
// admits that leaves the last prompt token out (prefill_length); the remaining prompt tokens (at
// least one, fewer than 2P + 1) go through decode steps, whose last gives the first new token. So
// any prompt length runs on any number of ranks, and every new token's logits come from a decode
// step, replicated on every rank. Prompts are prefilled one after another (each over all ranks,
// each into its own cache slot), then decoded together: every step feeds each unfinished sequence its
// next token (one row per sequence; sequences of different lengths simply sit at different
// positions), so a batch shares the reads of the weights. A sequence ends after max_new_tokens new
// tokens, on a stop token (kept as its last token), or on the token whose text completes a stop string
// (kept too: the text to the stop string is the caller's to cut).
//
// The decode steps run on model/decode_engine.h (the engine `hydra bench --op decode` times too),
// replayed as a CUDA graph by default wherever that is possible (one rank on the GPU:
// GenerateOptions::cuda_graph), which gives the same tokens as the eager steps.
// Tokens are chosen from fp32 logits by sample_token (model/sampling.h) on every rank, and rank 0's
// choice is broadcast each step, so the ranks can never disagree on what they feed next. A repetition
// penalty (SamplingParams::repetition_penalty) first rescales, in a copy of the row, the logits of the
// ids the sequence holds (its whole prompt and its new tokens so far); kept logits and log-probabilities
// are the model's own, before the penalty and the temperature.
#pragma once

#include <cstdint>
#include <vector>

#include "model/decode_engine.h"
#include "model/memory_plan.h"
#include "model/model.h"
#include "model/sampling.h"
#include "model/token_text.h"
#include "parallel/sequence_groups.h"

namespace hydra {

struct GenerateOptions {
  int64_t max_new_tokens = 1;
  SamplingParams sampling = {};
  std::vector<int32_t> stop_tokens = {};
  // Stop strings over the decoded text, across token boundaries (model/token_text.h); null: none.
  const StopStrings* stop_strings = nullptr;
  bool progress = false;      // rank 0 logs a line per layer of each prefill, with an ETA
  bool keep_logits = false;   // keep the logits each new token was chosen from (tests)
  int64_t top_logprobs = 0;   // > 0: each new token's log-probability and the K most likely alternatives (hydra generate --logprobs K)
  // Replay the decode step as a CUDA graph (model/decode_engine.h): automatic where one rank runs on
  // the GPU; on needs exactly that (the caller refuses other runs first).
  DecodeGraph cuda_graph = DecodeGraph::automatic;
  // Each prompt's number: its sampling stream and its name in messages (empty: its index in
  // `prompts`). hydra generate --sp passes the prompt's index in the whole prompt file, so a prompt
  // draws the same tokens whichever sequence group runs it, beside whichever other prompts.
  std::vector<int64_t> prompt_numbers = {};
};

struct GeneratedSequence {
  std::vector<int32_t> tokens;  // the new tokens (a stop token, when one ended the sequence, last)
  bool stopped = false;         // ended on a stop token or a stop string
  std::string stop_string;      // the stop string that ended it ("" otherwise); its last token is the last
  int64_t prefilled = 0;        // prompt tokens the sequence-parallel prefill took
  double prefill_s = 0;         // its wall time (every rank, a barrier on each side)
  double decode_s = 0;          // from the first decode step to the step that ended the sequence
  int64_t graph_steps = 0;      // its decode steps that replayed a CUDA graph
  std::vector<float> logits;    // [tokens.size(), V] with keep_logits
  // With top_logprobs = K: per new token, log p(token) and the K most likely ids with their log p
  // (descending; ties to the lower id), from the model's fp32 logits at its position (log-softmax in
  // fp64; before any temperature or repetition penalty).
  std::vector<double> logprobs;                               // [tokens.size()]
  std::vector<std::vector<std::pair<int32_t, double>>> top;  // [tokens.size()][K]
};

// Tokens of a prompt of `prompt_length` the sequence-parallel prefill takes on `world_size` ranks:
// the largest multiple of the layout's granularity below prompt_length (so at least the last token is
// left to a decode step) whose segments hold at least K−1 tokens when the model has GDN heads
// (the conv halo, DESIGN.md §3.1); 0 when none does.
int64_t prefill_length(const ModelConfig& config, int64_t prompt_length, int world_size);
// K/V rows per slot a rank needs for a prompt: its prefill rows plus its round-robin share of the
// tokens that go through decode steps (the prompt's rest and every new token but the last).
int64_t cache_rows_needed(const ModelConfig& config, int64_t prompt_length, int64_t max_new_tokens, int world_size);

// Per-rank plan for generating from prompts of `prompt_lengths` tokens with up to `max_new_tokens`
// each on `world` ranks: the longest prompt's prefill (estimate_prefill_memory; none when every prompt
// is too short for one and goes through decode steps alone), the cache (kv_cache_spec, every slot at
// the largest per-slot row count) and the decode engine's persistent buffers (decode_engine_buffers).
// `sampled`: the engine keeps the host copy of the logits.
MemoryEstimate estimate_generation_memory(const ModelConfig& config, const std::vector<int64_t>& prompt_lengths,
                                          int64_t max_new_tokens, int world, Device device, bool sampled);

std::vector<GeneratedSequence> generate(Communicator& comm, const Model& model,
                                        const std::vector<std::vector<int32_t>>& prompts,
                                        const GenerateOptions& options);

// ---- Sequence groups (hydra generate --sp) ----
// The world cut into groups of sp ranks (parallel/sequence_groups.h): prompt b runs on group
// b mod groups, keeping b as its number (its sampling stream: a prompt draws the same tokens
// whichever group runs it, beside whichever others), each group decoding its prompts as one batch.

// A group's share of the prompts and what it needs per rank: every rank plans every group, so all
// refuse together (check_memory_plan) before any work.
struct GenerationGroupPlan {
  std::vector<int64_t> prompts;  // the prompts' numbers: b ≡ group (mod groups), ascending
  int64_t tokens = 0;            // their prompt tokens
  MemoryEstimate estimate;       // estimate_generation_memory of the share
  double cache_bytes = 0;        // the cache at its largest (kv_cache_bytes: per token and per slot)
};
std::vector<GenerationGroupPlan> plan_generation_groups(const ModelConfig& config,
                                                        const std::vector<int64_t>& prompt_lengths,
                                                        int64_t max_new_tokens, int sp, int groups, Device device,
                                                        bool sampled);
// This rank's group's prompts generated over its ranks (collective over groups.sequence()); options'
// prompt_numbers are set from the prompts' numbers. Empty when the group has none.
std::vector<GeneratedSequence> generate_for_group(SequenceGroups& groups, const Model& model,
                                                  const std::vector<std::vector<int32_t>>& prompts,
                                                  GenerateOptions options);
// Every group's sequences (`mine`: this rank's group's, from generate_for_group) to every rank, in
// prompt order, `prompts` in all (collective over groups.world()). What travels: each sequence's
// tokens, prefill and decode times, stop flag and stop string (as its index in `stop_strings`, the
// strings generation was given) and, with `top_logprobs` K (at most the vocabulary `vocab`), its
// log-probabilities and K alternatives per token.
std::vector<GeneratedSequence> gather_generated(SequenceGroups& groups, const std::vector<GeneratedSequence>& mine,
                                                int64_t prompts, int64_t top_logprobs, int64_t vocab,
                                                const std::vector<std::string>& stop_strings);

}  // namespace hydra
