// Token texts from tokenizer.json files written here (the decoders hydra reads), and stop strings
// matched across token boundaries as transformers' stop_strings: inside a token ("the" stops on
// "e"), over several tokens, beginning in the prompt; only matches that end in a new token count.
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "model/token_text.h"
#include "tests/common/test_util.h"

namespace hydra {
namespace {

using nlohmann::json;
using test::error_of;
using test::TempDir;

std::string write(const TempDir& dir, const std::string& name, const json& j) {
  const std::string path = dir.file(name);
  std::ofstream(path) << j.dump();
  return path;
}

// A byte-level vocabulary: "Ġ" is the space (byte 32 maps to U+0120), "Ċ" the newline (U+010A).
json byte_level() {
  return {{"model", {{"type", "BPE"}, {"vocab", {{"t", 0}, {"he", 1}, {"\xC4\xA0wor", 2}, {"ld", 3}, {"\xC4\x8A", 4},
                                                   {"\xC3\x83\xC2\xA9", 5}}}}},
          {"added_tokens", {{{"id", 6}, {"content", "<|endoftext|>"}, {"special", true}}}},
          {"decoder", {{"type", "ByteLevel"}}}};
}

TEST(TokenTexts, DecodersGiveEachTokensBytes) {
  TempDir dir;
  const TokenTexts b = TokenTexts::from_file(write(dir, "byte.json", byte_level()));
  EXPECT_EQ(b.size(), 7);
  EXPECT_EQ(b.bytes(2), " wor");
  EXPECT_EQ(b.bytes(4), "\n");
  EXPECT_EQ(b.bytes(5), "\xC3\xA9");  // "Ã©", two byte-level symbols: the two bytes of "é" in UTF-8
  EXPECT_EQ(b.bytes(6), "<|endoftext|>");
  EXPECT_EQ(b.id_of("<|endoftext|>"), std::optional<int32_t>(6));
  EXPECT_EQ(b.id_of("nothing"), std::nullopt);
  // Metaspace: ▁ is a space; SentencePiece-style Sequence(Replace ▁ → " ", ByteFallback, Fuse, Strip).
  const json meta = {{"model", {{"type", "BPE"}, {"vocab", {{"\xE2\x96\x81the", 0}, {"re", 1}}}}}, {"decoder", {{"type", "Metaspace"}}}};
  EXPECT_EQ(TokenTexts::from_file(write(dir, "meta.json", meta)).bytes(0), " the");
  const json seq = {{"model", {{"type", "BPE"}, {"vocab", {{"\xE2\x96\x81" "a", 0}, {"<0x0A>", 1}}}}},
                    {"decoder", {{"type", "Sequence"},
                                 {"decoders", {{{"type", "Replace"}, {"pattern", {{"String", "\xE2\x96\x81"}}}, {"content", " "}},
                                               {{"type", "ByteFallback"}}, {{"type", "Fuse"}},
                                               {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}}};
  const TokenTexts s = TokenTexts::from_file(write(dir, "seq.json", seq));
  EXPECT_EQ(s.bytes(0), " a");
  EXPECT_EQ(s.bytes(1), "\n");
  EXPECT_EQ(s.decoder(), "Sequence(Replace, ByteFallback, Fuse, Strip)");
  // Unigram's list vocabulary; no decoder: the tokens joined by spaces, as tokenizers decodes.
  const json uni = {{"model", {{"type", "WordLevel"}, {"vocab", {{"alpha", 0}, {"bravo", 1}}}}}, {"decoder", nullptr}};
  EXPECT_EQ(TokenTexts::from_file(write(dir, "words.json", uni)).bytes(1), " bravo");
  const json list = {{"model", {{"type", "Unigram"}, {"vocab", json::array({json::array({"<unk>", 0.0}), json::array({"x", -1.5})})}}},
                     {"decoder", {{"type", "Metaspace"}}}};
  EXPECT_EQ(TokenTexts::from_file(write(dir, "uni.json", list)).bytes(1), "x");
  // What hydra cannot read is named.
  json other = byte_level();
  other["decoder"] = {{"type", "CTC"}};
  EXPECT_NE(error_of([&] { TokenTexts::from_file(write(dir, "ctc.json", other)); }).find("its decoder CTC is not one hydra reads"),
            std::string::npos);
  // Without stop strings only the ids are read (the default stop): that decoder is then no error.
  EXPECT_EQ(TokenTexts::from_file(dir.file("ctc.json"), TokenTexts::Decode::no).id_of("<|endoftext|>"), std::optional<int32_t>(6));
  EXPECT_NE(error_of([&] { TokenTexts::from_file(write(dir, "no.json", json{{"version", "1.0"}})); }).find("no model.vocab"),
            std::string::npos);
}

TEST(StopStrings, MatchAcrossTokensAsTheTextSays) {
  TempDir dir;
  const TokenTexts t = TokenTexts::from_file(write(dir, "byte.json", byte_level()));
  const auto first_stop = [&](const std::vector<std::string>& stops, const std::vector<int32_t>& prompt,
                              const std::vector<int32_t>& generated) -> std::pair<int, std::string> {
    const StopStrings s(stops, &t);
    StopStrings::State state = s.start(prompt);
    for (size_t i = 0; i < generated.size(); ++i) {
      if (const auto hit = s.add(state, generated[i])) return {static_cast<int>(i), *hit};
    }
    return {-1, ""};
  };
  // "t" "he" " wor" "ld": "e" ends inside "he"; "world" spans two tokens; "the world" three.
  EXPECT_EQ(first_stop({"e"}, {}, {0, 1, 2, 3}), std::make_pair(1, std::string("e")));
  EXPECT_EQ(first_stop({"world"}, {}, {0, 1, 2, 3}), std::make_pair(3, std::string("world")));
  EXPECT_EQ(first_stop({"the world"}, {}, {0, 1, 2, 3}), std::make_pair(3, std::string("the world")));
  EXPECT_EQ(first_stop({"xyz"}, {}, {0, 1, 2, 3}), std::make_pair(-1, std::string()));
  // A match may begin in the prompt ("th" + "e"), but one wholly in the prompt does not count.
  EXPECT_EQ(first_stop({"the"}, {0}, {1, 2}), std::make_pair(0, std::string("the")));
  EXPECT_EQ(first_stop({"t"}, {0}, {1, 2, 3}), std::make_pair(-1, std::string()));
  // The first of several that completes; the earlier-listed one on the same token; a newline.
  EXPECT_EQ(first_stop({"ld", "or"}, {}, {0, 1, 2, 3}), std::make_pair(2, std::string("or")));
  EXPECT_EQ(first_stop({"wor", " w"}, {}, {0, 1, 2, 3}), std::make_pair(2, std::string("wor")));
  EXPECT_EQ(first_stop({"\n"}, {}, {0, 4, 1}), std::make_pair(1, std::string("\n")));
  EXPECT_EQ(first_stop({"<|endoftext|>"}, {}, {0, 6}), std::make_pair(1, std::string("<|endoftext|>")));
  EXPECT_NE(error_of([&] { StopStrings({""}, &t); }).find("an empty stop string"), std::string::npos);
}

TEST(StopStrings, DefaultStopIsTheTokenizersEos) {
  TempDir dir;
  const std::string tok = write(dir, "tokenizer.json", byte_level());
  const TokenTexts t = TokenTexts::from_file(tok);
  EXPECT_EQ(default_stop_ids(tok, t), std::vector<int32_t>{6});  // <|endoftext|>: no config files
  write(dir, "tokenizer_config.json", json{{"eos_token", {{"content", "ld"}}}});
  EXPECT_EQ(default_stop_ids(tok, t), std::vector<int32_t>{3});
  write(dir, "generation_config.json", json{{"eos_token_id", {5, 4}}});
  EXPECT_EQ(default_stop_ids(tok, t), (std::vector<int32_t>{5, 4}));
  write(dir, "generation_config.json", json{{"eos_token_id", 99}});
  EXPECT_NE(error_of([&] { default_stop_ids(tok, t); }).find("eos_token_id 99 is outside"), std::string::npos);
}

}  // namespace
}  // namespace hydra
