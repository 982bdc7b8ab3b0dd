// hydra generate as a user runs it: greedy tokens of a batch of prompts equal the arg-max
// of `hydra forward`'s logits over prompt + generated tokens (another code path: the full forward,
// no cache); 2 ranks under mpirun give the same tokens as 1, greedy and sampled; the JSON lines hold
// what the issue asks; bad input is one error line before any work and leaves no output.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <fstream>
#include <sstream>

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

std::vector<int32_t> ids_of(int64_t n, uint64_t salt) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = static_cast<int32_t>((i * 37 + salt * 11 + 3) % 256);
  return ids;
}

std::vector<std::vector<int32_t>> tokens_of(const std::vector<nlohmann::json>& lines) {
  std::vector<std::vector<int32_t>> out;
  for (const auto& j : lines) {
    if (!j.contains("summary")) out.push_back(j.at("tokens").get<std::vector<int32_t>>());
  }
  return out;
}

TEST(GenerateCli, GreedyEqualsForwardArgmaxAndRanksAgree) {
  const TempDir dir;
  const std::string h = hydra_binary();
  ASSERT_EQ(run_command(h + " init --preset hydrahead-tiny --weight-seed 4 --out " + dir.file("m.h5")).exit_code, 0);
  // Two prompts of 23 and 6 tokens.
  std::vector<int32_t> a = ids_of(23, 1), b = ids_of(6, 2), both = a;
  both.insert(both.end(), b.begin(), b.end());
  write_prompts(dir.file("p.h5"), both, {0, 23, 29});
  const std::string args = " generate --model " + dir.file("m.h5") + " --prompt " + dir.file("p.h5") +
                           " --max-new-tokens 5 --device cpu";
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
  // hydrahead-tiny: 2 layers, FA sets {1} and {2, 3} (one KV head each), d = 64, fp32 on the CPU.
  EXPECT_EQ(lines[2].at("cache_bytes_per_token").get<double>(), 2.0 * (2 * 1 * 64 * 4));
  const auto generated = tokens_of(lines);
  ASSERT_EQ(generated.size(), 2u);
  // hydra forward over prompt + all new tokens but the last: its arg-max at the prompt's last
  // position and after is the greedy sequence.
  const std::vector<std::vector<int32_t>> prompts = {a, b};
  for (size_t p = 0; p < 2; ++p) {
    ASSERT_EQ(generated[p].size(), 5u);
    std::vector<int32_t> seq = prompts[p];
    seq.insert(seq.end(), generated[p].begin(), generated[p].end() - 1);
    write_token_file(dir.file("seq.h5"), seq);
    const CommandResult f = run_command(h + " forward --model " + dir.file("m.h5") + " --input " + dir.file("seq.h5") +
                                        " --output " + dir.file("logits.h5"));
    ASSERT_EQ(f.exit_code, 0) << f.output;
    const Tensor logits = H5File::open_read(dir.file("logits.h5")).read("logits");
    const int64_t vocab = logits.size(1), t0 = static_cast<int64_t>(prompts[p].size()) - 1;
    for (size_t i = 0; i < generated[p].size(); ++i) {
      const float* row = logits.data_as<float>() + (t0 + static_cast<int64_t>(i)) * vocab;
      EXPECT_EQ(generated[p][i], std::max_element(row, row + vocab) - row) << "prompt " << p << " token " << i;
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
  const std::string h = hydra_binary();
  ASSERT_EQ(run_command(h + " init --preset hydrahead-tiny --weight-seed 4 --out " + dir.file("m.h5")).exit_code, 0);
  std::vector<int32_t> all;
  std::vector<int64_t> offsets = {0};
  for (int i = 0; i < 5; ++i) {
    const std::vector<int32_t> p = ids_of(17 + 5 * i, 10 + i);
    all.insert(all.end(), p.begin(), p.end());
    offsets.push_back(static_cast<int64_t>(all.size()));
  }
  write_prompts(dir.file("p.h5"), all, offsets);
  const std::string args = " generate --model " + dir.file("m.h5") + " --prompt " + dir.file("p.h5") +
                           " --max-new-tokens 4 --device cpu";
  for (const std::string mode : {std::string(""), std::string(" --temperature 0.9 --top-k 40 --seed 3")}) {
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
  const std::string h = hydra_binary();
  ASSERT_EQ(run_command(h + " init --preset hydrahead-tiny --weight-seed 5 --out " + dir.file("m.h5")).exit_code, 0);
  const std::vector<int32_t> a = ids_of(19, 3), b = ids_of(9, 4);
  std::vector<int32_t> both = a;
  both.insert(both.end(), b.begin(), b.end());
  write_prompts(dir.file("p.h5"), both, {0, 19, 28});
  const std::string args = " generate --model " + dir.file("m.h5") + " --prompt " + dir.file("p.h5") +
                           " --max-new-tokens 4 --device cpu --logprobs 3";
  const CommandResult one = run_command(h + args + " --out " + dir.file("one.jsonl"));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const auto lines = json_lines(dir.file("one.jsonl"));
  ASSERT_EQ(lines.size(), 3u);
  const std::vector<std::vector<int32_t>> prompts = {a, b};
  for (size_t p = 0; p < 2; ++p) {
    const auto tokens = lines[p].at("tokens").get<std::vector<int32_t>>();
    const auto lps = lines[p].at("logprobs").get<std::vector<double>>();
    const auto top = lines[p].at("top_logprobs");
    ASSERT_EQ(lps.size(), tokens.size());
    ASSERT_EQ(top.size(), tokens.size());
    std::vector<int32_t> seq = prompts[p];
    seq.insert(seq.end(), tokens.begin(), tokens.end() - 1);
    write_token_file(dir.file("seq.h5"), seq);
    const CommandResult f = run_command(h + " forward --model " + dir.file("m.h5") + " --input " + dir.file("seq.h5") +
                                        " --output " + dir.file("logits.h5"));
    ASSERT_EQ(f.exit_code, 0) << f.output;
    const Tensor logits = H5File::open_read(dir.file("logits.h5")).read("logits");
    const int64_t vocab = logits.size(1), t0 = static_cast<int64_t>(prompts[p].size()) - 1;
    for (size_t i = 0; i < tokens.size(); ++i) {
      const float* row = logits.data_as<float>() + (t0 + static_cast<int64_t>(i)) * vocab;
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
        if (k > 0) EXPECT_LE(top[i][k][1].get<double>(), top[i][k - 1][1].get<double>());
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
  const CommandResult bad = run_command(h + " generate --model " + dir.file("m.h5") + " --prompt " + dir.file("p.h5") +
                                        " --max-new-tokens 4 --device cpu --logprobs 101 --out " + dir.file("bad.jsonl"));
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
  const std::string h = hydra_binary();
  ASSERT_EQ(run_command(h + " init --preset hydrahead-tiny --weight-seed 4 --out " + dir.file("m.h5")).exit_code, 0);
  const std::vector<int32_t> a = ids_of(13, 1), b = ids_of(7, 2);
  std::vector<int32_t> both = a;
  both.insert(both.end(), b.begin(), b.end());
  write_prompts(dir.file("p.h5"), both, {0, 13, 20});
  const std::string args = " generate --model " + dir.file("m.h5") + " --prompt " + dir.file("p.h5") +
                           " --max-new-tokens 12 --device cpu";
  const CommandResult plain = run_command(h + args + " --out " + dir.file("plain.jsonl"));
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  const auto free_run = tokens_of(json_lines(dir.file("plain.jsonl")));
  const std::vector<std::vector<int32_t>> prompts = {a, b};
  const auto repeats = [&](size_t p, const std::vector<int32_t>& tokens) {
    std::vector<int32_t> seen = prompts[p];
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
    std::vector<int32_t> seq = prompts[p];
    seq.insert(seq.end(), penalized[p].begin(), penalized[p].end() - 1);
    write_token_file(dir.file("seq.h5"), seq);
    const CommandResult f = run_command(h + " forward --model " + dir.file("m.h5") + " --input " + dir.file("seq.h5") +
                                        " --output " + dir.file("logits.h5"));
    ASSERT_EQ(f.exit_code, 0) << f.output;
    const Tensor logits = H5File::open_read(dir.file("logits.h5")).read("logits");
    const int64_t vocab = logits.size(1), t0 = static_cast<int64_t>(prompts[p].size()) - 1;
    for (size_t i = 0; i < penalized[p].size(); ++i) {
      const float* r = logits.data_as<float>() + (t0 + static_cast<int64_t>(i)) * vocab;
      std::vector<float> row(r, r + vocab);
      std::vector<bool> seen(static_cast<size_t>(vocab), false);
      for (size_t j = 0; j < prompts[p].size() + i; ++j) seen[static_cast<size_t>(seq[j])] = true;
      for (int64_t v = 0; v < vocab; ++v) {
        float& x = row[static_cast<size_t>(v)];
        if (seen[static_cast<size_t>(v)]) x = x < 0 ? x * static_cast<float>(penalty) : x / static_cast<float>(penalty);
      }
      EXPECT_EQ(penalized[p][i], std::max_element(row.begin(), row.end()) - row.begin()) << "prompt " << p << " token " << i;
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
}

}  // namespace
}  // namespace hydra::test
