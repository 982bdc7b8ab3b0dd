// hydra generate as a user runs it: greedy tokens of a batch of prompts equal the arg-max
// of `hydra forward`'s logits over prompt + generated tokens (another code path: the full forward,
// no cache); 2 ranks under mpirun give the same tokens as 1, greedy and sampled; the JSON lines hold
// what the issue asks; bad input is one error line before any work and leaves no output.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "runtime/hdf5_file.h"
#include "runtime/token_file.h"
#include "tests/common/test_util.h"

namespace hydra::test {
namespace {

std::vector<nlohmann::json> json_lines(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  }
  return out;
}

void write_prompts(const std::string& path, const std::vector<int32_t>& ids, const std::vector<int64_t>& offsets) {
  H5File file = H5File::create(path);
  Tensor t = Tensor::empty({static_cast<int64_t>(ids.size())}, DType::i32);
  std::copy(ids.begin(), ids.end(), t.data_as<int32_t>());
  file.write("input_ids", t);
  if (!offsets.empty()) {
    Tensor o = Tensor::empty({static_cast<int64_t>(offsets.size())}, DType::i64);
    std::copy(offsets.begin(), offsets.end(), o.data_as<int64_t>());
    file.write("prompt_offsets", o);
  }
  file.close();
}

std::vector<int32_t> ids_of(int64_t n, uint64_t salt) { return strided_ids(n, 256, 37, static_cast<int64_t>(salt) * 11 + 3); }

std::vector<std::vector<int32_t>> tokens_of(const std::vector<nlohmann::json>& lines) {
  std::vector<std::vector<int32_t>> out;
  for (const auto& j : lines) {
    if (!j.contains("summary")) out.push_back(j.at("tokens").get<std::vector<int32_t>>());
  }
  return out;
}

// The set-up the generate tests share: a hydrahead-tiny model (weights from weight_seed) and one
// prompt file of `prompts` in the test's folder, and the generate command line over them, which
// each test extends with its flags. A failed init throws (the test fails with hydra's output).
struct GenerateSetup {
  std::string hydra;
  std::string model;
  std::vector<std::vector<int32_t>> prompts;
  std::string args;  // " generate --model M --prompt P --max-new-tokens N --device cpu"
};

GenerateSetup set_up(const TempDir& dir, int weight_seed, std::vector<std::vector<int32_t>> prompts, int max_new_tokens) {
  GenerateSetup s{hydra_binary(), dir.file("m.h5"), std::move(prompts), ""};
  const CommandResult init = run_command(s.hydra + " init --preset hydrahead-tiny --weight-seed " +
                                         std::to_string(weight_seed) + " --out " + s.model);
  if (init.exit_code != 0) throw std::runtime_error("hydra init failed: " + init.output);
  std::vector<int32_t> all;
  std::vector<int64_t> offsets = {0};
  for (const auto& p : s.prompts) {
    all.insert(all.end(), p.begin(), p.end());
    offsets.push_back(static_cast<int64_t>(all.size()));
  }
  write_prompts(dir.file("p.h5"), all, offsets);
  s.args = " generate --model " + s.model + " --prompt " + dir.file("p.h5") + " --max-new-tokens " +
           std::to_string(max_new_tokens) + " --device cpu";
  return s;
}

// hydra forward's logits over a prompt and the tokens generated after it, all but the last (the
// full forward without a cache: another code path than generate's decode steps). row(i) is the
// row generated token i was chosen from. A failed forward throws (the test fails with its output).
struct ForwardRows {
  Tensor logits;       // [T, vocab] f32
  int64_t first = 0;   // the prompt's last position: the row of the first new token
  int64_t vocab() const { return logits.size(1); }
  const float* row(size_t i) const { return logits.data_as<float>() + (first + static_cast<int64_t>(i)) * vocab(); }
};

ForwardRows forward_rows(const TempDir& dir, const GenerateSetup& s, size_t prompt, const std::vector<int32_t>& tokens) {
  if (tokens.empty()) throw std::runtime_error("forward_rows: no generated tokens");
  std::vector<int32_t> seq = s.prompts[prompt];
  seq.insert(seq.end(), tokens.begin(), tokens.end() - 1);
  write_token_file(dir.file("seq.h5"), seq);
  std::filesystem::remove(dir.file("logits.h5"));  // no stale rows from the previous prompt
  const CommandResult f = run_command(s.hydra + " forward --model " + s.model + " --input " + dir.file("seq.h5") +
                                      " --output " + dir.file("logits.h5"));
  if (f.exit_code != 0) throw std::runtime_error("hydra forward failed: " + f.output);
  return {H5File::open_read(dir.file("logits.h5")).read("logits"), static_cast<int64_t>(s.prompts[prompt].size()) - 1};
}

TEST(GenerateCli, GreedyEqualsForwardArgmaxAndRanksAgree) {
  const TempDir dir;
  // Two prompts of 23 and 6 tokens.
  const GenerateSetup s = set_up(dir, 4, {ids_of(23, 1), ids_of(6, 2)}, 5);
  const std::string& h = s.hydra;
  const std::string& args = s.args;
  const std::string out = " --out ";
  const CommandResult one = run_command(h + args + out + dir.file("one.jsonl"));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const auto lines = json_lines(dir.file("one.jsonl"));
  ASSERT_EQ(lines.size(), 3u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(lines[i].at("prompt_index").get<int>(), i);
    for (const char* key : {"prefill_s", "decode_tokens_per_s"}) EXPECT_TRUE(lines[i].contains(key)) << key;
  }
  EXPECT_TRUE(lines[2].at("summary").get<bool>());
  EXPECT_FALSE(lines[2].at("cuda_graph").get<bool>()) << "the CPU decodes eagerly (--cuda-graph auto)";
  // hydrahead-tiny: 2 layers, FA sets {1} and {2, 3} (one KV head each), d = 64, fp32 on the CPU.
  EXPECT_EQ(lines[2].at("cache_bytes_per_token").get<double>(), 2.0 * (2 * 1 * 64 * 4));
  const auto generated = tokens_of(lines);
  ASSERT_EQ(generated.size(), 2u);
  // hydra forward over prompt + all new tokens but the last: its arg-max at the prompt's last
  // position and after is the greedy sequence.
  for (size_t p = 0; p < 2; ++p) {
    ASSERT_EQ(generated[p].size(), 5u);
    const ForwardRows f = forward_rows(dir, s, p, generated[p]);
    for (size_t i = 0; i < generated[p].size(); ++i) {
      const float* row = f.row(i);
      EXPECT_EQ(generated[p][i], std::max_element(row, row + f.vocab()) - row) << "prompt " << p << " token " << i;
    }
  }
  // Two ranks: the same tokens, greedy and sampled.
  const CommandResult two = run_command(mpirun(2) + " " + h + args + out + dir.file("two.jsonl"));
  ASSERT_EQ(two.exit_code, 0) << two.output;
  EXPECT_EQ(tokens_of(json_lines(dir.file("two.jsonl"))), generated);
  EXPECT_EQ(json_lines(dir.file("two.jsonl")).back().at("ranks").get<int>(), 2);
  const std::string sampled = " --temperature 0.8 --top-k 30 --top-p 0.9 --seed 7 --out ";
  const CommandResult s1 = run_command(h + args + sampled + dir.file("s1.jsonl"));
  ASSERT_EQ(s1.exit_code, 0) << s1.output;
  const CommandResult s2 = run_command(mpirun(2) + " " + h + args + sampled + dir.file("s2.jsonl"));
  ASSERT_EQ(s2.exit_code, 0) << s2.output;
  EXPECT_EQ(tokens_of(json_lines(dir.file("s1.jsonl"))), tokens_of(json_lines(dir.file("s2.jsonl"))));
  // A stop token ends the first prompt's generation at its first occurrence (kept as the last token).
  const int32_t stop = generated[0][1];
  const CommandResult st = run_command(h + args + " --stop-token 255," + std::to_string(stop) + out + dir.file("stop.jsonl"));
  ASSERT_EQ(st.exit_code, 0) << st.output;
  const auto stopped = json_lines(dir.file("stop.jsonl"));
  // Either stop id ends it: the sequence runs to the first token that is 255 or `stop` (which occurs).
  const auto first = std::find_if(generated[0].begin(), generated[0].end(), [&](int32_t t) { return t == 255 || t == stop; });
  ASSERT_NE(first, generated[0].end());
  const auto want = std::vector<int32_t>(generated[0].begin(), first + 1);
  EXPECT_EQ(stopped[0].at("tokens").get<std::vector<int32_t>>(), want);
  EXPECT_TRUE(stopped[0].at("stopped").get<bool>());
}

// --sp 2 on 4 ranks: prompts 0, 2, 4 on one group and 1, 3 on the other, each decoded as a batch
// there; the file's order and the tokens are those of --sp 4, greedy and sampled (each prompt
// keeps its own sampling stream), and of one rank.
TEST(GenerateCli, SequenceGroupsGiveTheWholeWorldsTokens) {
  const TempDir dir;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 5; ++i) prompts.push_back(ids_of(17 + 5 * i, 10 + i));
  const GenerateSetup s = set_up(dir, 4, prompts, 4);
  const std::string& h = s.hydra;
  const std::string& args = s.args;
  for (const std::string& mode : {std::string(""), std::string(" --temperature 0.9 --top-k 40 --seed 3")}) {
    const CommandResult one = run_command(h + args + mode + " --out " + dir.file("one.jsonl"));
    ASSERT_EQ(one.exit_code, 0) << one.output;
    const CommandResult whole = run_command(mpirun(4) + " " + h + args + mode + " --sp 4 --out " + dir.file("sp4.jsonl"));
    ASSERT_EQ(whole.exit_code, 0) << whole.output;
    const CommandResult halves = run_command(mpirun(4) + " " + h + args + mode + " --sp 2 --out " + dir.file("sp2.jsonl"));
    ASSERT_EQ(halves.exit_code, 0) << halves.output;
    const auto lines = json_lines(dir.file("sp2.jsonl"));
    ASSERT_EQ(lines.size(), 6u);
    for (int i = 0; i < 5; ++i) {
      EXPECT_EQ(lines[i].at("prompt_index").get<int>(), i);
      EXPECT_EQ(lines[i].at("prompt_tokens").get<int64_t>(), 17 + 5 * i);
      EXPECT_EQ(lines[i].at("tokens").size(), 4u);
    }
    EXPECT_EQ(lines.back().at("sp").get<int>(), 2);
    EXPECT_EQ(lines.back().at("ranks").get<int>(), 4);
    EXPECT_EQ(lines.back().at("new_tokens").get<int>(), 20);
    EXPECT_EQ(tokens_of(lines), tokens_of(json_lines(dir.file("sp4.jsonl")))) << mode;
    EXPECT_EQ(tokens_of(lines), tokens_of(json_lines(dir.file("one.jsonl")))) << mode;
  }
  const CommandResult bad = run_command(mpirun(4) + " " + h + args + " --sp 3 --out " + dir.file("bad.jsonl"));
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("--sp 3 must divide the number of ranks (4)"), std::string::npos) << bad.output;
}

// --logprobs K: each new token's log-probability is the log-softmax of hydra forward's logits at
// its position (prompt + the tokens before it), the top K are the K largest of that row in order,
// greedy's token is the first of them; --sp 2 on 4 ranks writes the same numbers.
TEST(GenerateCli, LogprobsAreTheForwardsLogSoftmax) {
  const TempDir dir;
  const GenerateSetup s = set_up(dir, 5, {ids_of(19, 3), ids_of(9, 4)}, 4);
  const std::string& h = s.hydra;
  const std::string args = s.args + " --logprobs 3";
  const CommandResult one = run_command(h + args + " --out " + dir.file("one.jsonl"));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const auto lines = json_lines(dir.file("one.jsonl"));
  ASSERT_EQ(lines.size(), 3u);
  for (size_t p = 0; p < 2; ++p) {
    const auto tokens = lines[p].at("tokens").get<std::vector<int32_t>>();
    const auto lps = lines[p].at("logprobs").get<std::vector<double>>();
    const auto top = lines[p].at("top_logprobs");
    ASSERT_EQ(lps.size(), tokens.size());
    ASSERT_EQ(top.size(), tokens.size());
    ASSERT_EQ(tokens.size(), 4u);
    const ForwardRows f = forward_rows(dir, s, p, tokens);
    const int64_t vocab = f.vocab();
    for (size_t i = 0; i < tokens.size(); ++i) {
      const float* row = f.row(i);
      const float peak = *std::max_element(row, row + vocab);
      double sum = 0;
      for (int64_t v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(row[v]) - peak);
      const double log_norm = peak + std::log(sum);
      // fp32 forward (prefill) against fp32 decode steps: agreement to ~1e-5 in log-probability.
      EXPECT_NEAR(lps[i], row[tokens[i]] - log_norm, 1e-4) << "prompt " << p << " token " << i;
      ASSERT_EQ(top[i].size(), 3u);
      EXPECT_EQ(top[i][0][0].get<int32_t>(), tokens[i]) << "greedy takes the most likely";
      EXPECT_DOUBLE_EQ(top[i][0][1].get<double>(), lps[i]);
      std::vector<int32_t> order(static_cast<size_t>(vocab));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int32_t x, int32_t y) { return row[x] > row[y]; });
      for (size_t k = 0; k < 3; ++k) {
        EXPECT_EQ(top[i][k][0].get<int32_t>(), order[k]) << "prompt " << p << " token " << i << " rank " << k;
        EXPECT_NEAR(top[i][k][1].get<double>(), row[order[k]] - log_norm, 1e-4);
        if (k > 0) {
          EXPECT_LE(top[i][k][1].get<double>(), top[i][k - 1][1].get<double>());
        }
      }
    }
  }
  const CommandResult groups = run_command(mpirun(4) + " " + h + args + " --sp 2 --out " + dir.file("sp2.jsonl"));
  ASSERT_EQ(groups.exit_code, 0) << groups.output;
  const auto grouped = json_lines(dir.file("sp2.jsonl"));
  for (size_t p = 0; p < 2; ++p) {
    EXPECT_EQ(grouped[p].at("tokens"), lines[p].at("tokens"));
    const auto x = lines[p].at("logprobs").get<std::vector<double>>(), y = grouped[p].at("logprobs").get<std::vector<double>>();
    ASSERT_EQ(x.size(), y.size());
    for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(x[i], y[i], 1e-4);
  }
  const CommandResult bad = run_command(h + s.args + " --logprobs 101 --out " + dir.file("bad.jsonl"));
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.output.find("--logprobs must be in 0..100"), std::string::npos) << bad.output;
}

// --repetition-penalty F: greedy without it repeats a token (prompt 0 here; checked); with a large F
// every seen logit ends below the unseen ones (positive ones divided towards 0, negative ones pushed
// down), so the new tokens are all distinct and none is in the prompt; each is the arg-max of hydra
// forward's logits at its position after the penalty over the prompt and the tokens before it
// (computed here from the rule); 2 ranks, and --sp 2 on 4 ranks, give the same tokens, also sampled.
TEST(GenerateCli, RepetitionPenaltyStopsRepeats) {
  const TempDir dir;
  const GenerateSetup s = set_up(dir, 4, {ids_of(13, 1), ids_of(7, 2)}, 12);
  const std::string& h = s.hydra;
  const std::string& args = s.args;
  const CommandResult plain = run_command(h + args + " --out " + dir.file("plain.jsonl"));
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  const auto free_run = tokens_of(json_lines(dir.file("plain.jsonl")));
  ASSERT_EQ(free_run.size(), 2u);
  const auto repeats = [&](size_t p, const std::vector<int32_t>& tokens) {
    std::vector<int32_t> seen = s.prompts[p];
    for (const int32_t t : tokens) {
      if (std::find(seen.begin(), seen.end(), t) != seen.end()) return true;
      seen.push_back(t);
    }
    return false;
  };
  ASSERT_TRUE(repeats(0, free_run[0])) << "this model's greedy continuation of prompt 0 should repeat a token";
  const double penalty = 1000.0;
  const std::string with = " --repetition-penalty 1000";
  const CommandResult one = run_command(h + args + with + " --out " + dir.file("one.jsonl"));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const auto lines = json_lines(dir.file("one.jsonl"));
  EXPECT_EQ(lines.back().at("repetition_penalty").get<double>(), penalty);
  const auto penalized = tokens_of(lines);
  ASSERT_EQ(penalized.size(), 2u);
  for (size_t p = 0; p < 2; ++p) {
    ASSERT_EQ(penalized[p].size(), 12u);
    EXPECT_FALSE(repeats(p, penalized[p])) << "prompt " << p << ": a token repeats despite the penalty";
    const ForwardRows f = forward_rows(dir, s, p, penalized[p]);
    const int64_t vocab = f.vocab();
    // The tokens seen before new token i: the prompt's, then each new token once it is chosen.
    std::vector<bool> seen(static_cast<size_t>(vocab), false);
    for (const int32_t t : s.prompts[p]) seen[static_cast<size_t>(t)] = true;
    for (size_t i = 0; i < penalized[p].size(); ++i) {
      std::vector<float> row(f.row(i), f.row(i) + vocab);
      for (int64_t v = 0; v < vocab; ++v) {
        float& x = row[static_cast<size_t>(v)];
        if (seen[static_cast<size_t>(v)]) x = x < 0 ? x * static_cast<float>(penalty) : x / static_cast<float>(penalty);
      }
      EXPECT_EQ(penalized[p][i], std::max_element(row.begin(), row.end()) - row.begin()) << "prompt " << p << " token " << i;
      seen[static_cast<size_t>(penalized[p][i])] = true;
    }
  }
  EXPECT_NE(penalized[0], free_run[0]);
  const CommandResult two = run_command(mpirun(2) + " " + h + args + with + " --out " + dir.file("two.jsonl"));
  ASSERT_EQ(two.exit_code, 0) << two.output;
  EXPECT_EQ(tokens_of(json_lines(dir.file("two.jsonl"))), penalized);
  const CommandResult groups = run_command(mpirun(4) + " " + h + args + with + " --sp 2 --out " + dir.file("sp2.jsonl"));
  ASSERT_EQ(groups.exit_code, 0) << groups.output;
  EXPECT_EQ(tokens_of(json_lines(dir.file("sp2.jsonl"))), penalized);
  const std::string sampled = " --repetition-penalty 1.5 --temperature 0.9 --top-k 40 --seed 2 --out ";
  const CommandResult s1 = run_command(h + args + sampled + dir.file("s1.jsonl"));
  ASSERT_EQ(s1.exit_code, 0) << s1.output;
  const CommandResult s4 = run_command(mpirun(4) + " " + h + args + " --sp 2" + sampled + dir.file("s4.jsonl"));
  ASSERT_EQ(s4.exit_code, 0) << s4.output;
  EXPECT_EQ(tokens_of(json_lines(dir.file("s1.jsonl"))), tokens_of(json_lines(dir.file("s4.jsonl"))));
}

TEST(GenerateCli, RefusesBadInputBeforeAnyWork) {
  const TempDir dir;
  const std::string h = hydra_binary();
  ASSERT_EQ(run_command(h + " init --preset qwen3-tiny --out " + dir.file("m.h5")).exit_code, 0);
  write_prompts(dir.file("ok.h5"), ids_of(10, 3), {});
  std::vector<int32_t> bad = ids_of(10, 3);
  bad[4] = 256;  // the vocabulary is 256
  write_prompts(dir.file("range.h5"), bad, {});
  write_prompts(dir.file("empty.h5"), ids_of(10, 3), {0, 4, 4, 10});
  write_prompts(dir.file("short.h5"), ids_of(10, 3), {0, 4, 9});
  write_prompts(dir.file("start.h5"), ids_of(10, 3), {1, 10});
  { std::ofstream(dir.file("keep.jsonl")) << "previous\n"; }
  const std::string base = h + " generate --model " + dir.file("m.h5") + " --device cpu ";
  const auto refuse = [&](const std::string& args, const std::string& needle) {
    const CommandResult r = run_command(base + args);
    expect_user_error(r, needle);
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << "one line: " << r.output;
    std::ifstream kept(dir.file("keep.jsonl"));
    std::string first;
    std::getline(kept, first);
    EXPECT_EQ(first, "previous") << "a refused run touched its output: " << args;
  };
  const std::string out = " --out " + dir.file("keep.jsonl");
  refuse("--prompt " + dir.file("range.h5") + " --max-new-tokens 3" + out, "256");
  refuse("--prompt " + dir.file("empty.h5") + " --max-new-tokens 3" + out, "prompt 1 is empty");
  refuse("--prompt " + dir.file("short.h5") + " --max-new-tokens 3" + out, "prompt_offsets");
  refuse("--prompt " + dir.file("start.h5") + " --max-new-tokens 3" + out, "prompt_offsets");
  refuse("--prompt " + dir.file("ok.h5") + " --max-new-tokens 3 --stop-token 3,999" + out, "--stop-token: id 999");
  refuse("--prompt " + dir.file("ok.h5") + " --max-new-tokens 3 --stop-token x" + out, "--stop-token");
  refuse("--prompt " + dir.file("ok.h5") + " --max-new-tokens 0" + out, "--max-new-tokens");
  refuse("--prompt " + dir.file("ok.h5") + " --max-new-tokens 3 --top-p 0" + out, "--top-p");
  refuse("--prompt " + dir.file("ok.h5") + " --max-new-tokens 3 --temperature -1" + out, "--temperature");
  refuse("--prompt " + dir.file("ok.h5") + " --max-new-tokens 3 --repetition-penalty 0" + out, "--repetition-penalty");
  refuse("--prompt " + dir.file("ok.h5") + " --max-new-tokens 3 --repetition-penalty inf" + out, "--repetition-penalty");
  refuse("--prompt " + dir.file("nope.h5") + " --max-new-tokens 3" + out, "nope.h5");
  refuse("--prompt " + dir.file("ok.h5") + " --max-new-tokens 3 --cuda-graph maybe" + out, "--cuda-graph must be on, off or auto");
  refuse("--prompt " + dir.file("ok.h5") + " --max-new-tokens 3 --cuda-graph on" + out,
         "--cuda-graph on needs the GPU (this run: host");
  refuse("--prompt " + dir.file("ok.h5") + " --max-new-tokens 3 --cuda-graph" + out,
         "--cuda-graph on needs the GPU (this run: host");  // the flag alone means on
}

}  // namespace
}  // namespace hydra::test
