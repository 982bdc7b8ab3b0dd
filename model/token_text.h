// The text of every token of a Hugging Face tokenizer (tokenizer.json), as bytes, and the stop
// strings `hydra generate --stop` matches against it.
//
// hydra never tokenizes (cluster/ scripts do, with the `tokenizers` package); generation only needs
// to know what text each new id adds, to stop on a string the way transformers' `stop_strings` does:
// a stop string ends a sequence as soon as the text of the new tokens contains it, wherever the token
// boundaries fall ("the" stops on "e"; " wor" + "ld" stops on "world"), also when it begins in the
// prompt's last tokens and ends in a new one.
//
// A token's bytes are its vocabulary string run through the tokenizer's decoder, token by token:
//   ByteLevel    each character is one byte through GPT-2's byte-to-unicode table (Qwen, GPT-2, Llama 3)
//   Metaspace    "▁" (its `replacement`) is a space (SentencePiece-style BPE and Unigram)
//   Replace      a String pattern replaced by its content; ByteFallback: <0xNN> is byte NN;
//   Fuse, Strip  no change to a token (they act on the joined text's ends)
//   WordPiece    "##" (its prefix) continues a word, any other token starts one with a space
//   BPEDecoder   its suffix ("</w>") ends a word with a space
//   Sequence     the decoders in order
//   none         the tokens joined by spaces, as `tokenizers` decodes (each token after a space)
// Added tokens (special or not) are their content. Another decoder is a UserError naming it.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace hydra {

class TokenTexts {
 public:
  // UserError for a file that is not a tokenizer.json hydra can read (naming what is missing).
  // Decode::no reads the ids alone (id_of, the default stop): a decoder hydra does not read is then
  // no error, and bytes() is empty.
  enum class Decode { yes, no };
  static TokenTexts from_file(const std::string& tokenizer_json, Decode decode = Decode::yes);
  int64_t size() const { return static_cast<int64_t>(bytes_.size()); }  // 1 + the largest id
  // The bytes id adds to the decoded text ("" for an id the tokenizer does not define).
  const std::string& bytes(int32_t id) const;
  // The id of a token by its vocabulary string or added-token content.
  std::optional<int32_t> id_of(const std::string& token) const;
  // XXH3 of every token's bytes (the ranks' agreement on the tokenizer).
  std::string fingerprint() const;
  // The decoder types read, for messages ("ByteLevel", "Sequence(Replace, ByteFallback, ...)").
  const std::string& decoder() const { return decoder_; }

 private:
  std::vector<std::string> bytes_;  // [size()]
  std::vector<std::pair<std::string, int32_t>> ids_;  // sorted by string
  std::string decoder_;
};

// The default stop of a tokenizer folder (the folder of tokenizer_json): generation_config.json's
// eos_token_id (a number or a list), else tokenizer_config.json's eos_token, else the first of
// <|endoftext|>, </s>, <eos> the vocabulary holds (what cluster/tokenize_text.py ends every document
// with). Empty when there is none.
std::vector<int32_t> default_stop_ids(const std::string& tokenizer_json, const TokenTexts& texts);

// Stop strings over a sequence's text (header comment).
class StopStrings {
 public:
  StopStrings() = default;
  StopStrings(std::vector<std::string> strings, const TokenTexts* texts);
  bool empty() const { return strings_.empty(); }
  // Per sequence: the text the matcher keeps (the tail a match may begin in).
  struct State {
    std::string tail;
  };
  // A sequence's state after its prompt (a match may begin in the prompt's last tokens).
  State start(std::span<const int32_t> prompt) const;
  // Adds a new token; the stop string the text now contains (the first given, on several), or
  // nullopt. Only matches that end inside the new token's bytes count: earlier text was checked.
  std::optional<std::string> add(State& state, int32_t id) const;

 private:
  std::vector<std::string> strings_;
  const TokenTexts* texts_ = nullptr;
  size_t longest_ = 0;
};

}  // namespace hydra
