#include "model/token_text.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>

#include <nlohmann/json.hpp>

#include "runtime/content_hash.h"
#include "runtime/error.h"

namespace hydra {
namespace {

using json = nlohmann::json;

// The code points of a UTF-8 string (tokenizer.json is JSON, so its strings are valid UTF-8).
std::vector<uint32_t> code_points(const std::string& s) {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const int n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    uint32_t cp = n == 1 ? c : n == 2 ? c & 0x1F : n == 3 ? c & 0x0F : c & 0x07;
    for (int k = 1; k < n && i + static_cast<size_t>(k) < s.size(); ++k) {
      cp = (cp << 6) | (static_cast<unsigned char>(s[i + static_cast<size_t>(k)]) & 0x3F);
    }
    out.push_back(cp);
    i += static_cast<size_t>(n);
  }
  return out;
}

// GPT-2's byte-to-unicode table inverted: the code point a byte-level vocabulary writes for byte b is
// b itself for the printable bytes 33..126, 161..172, 174..255, and 256 + k for the k-th other byte.
std::vector<int> byte_of_code_point() {
  std::vector<int> inverse(512, -1);
  int next = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    inverse[static_cast<size_t>(printable ? b : 256 + next++)] = b;
  }
  return inverse;
}

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  if (from.empty()) return;
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) s.replace(at, from.size(), to);
}

// One decoder step on one token's text (header of token_text.h); `first` decoders list their types.
class Decoder {
 public:
  Decoder(const json& d, const std::string& source) {
    if (d.is_null()) {
      joins_with_space_ = true;  // tokenizers' default decode: the tokens joined by " "
      name_ = "none";
      return;
    }
    add(d, source);
  }
  std::string apply(std::string token) const {
    for (const Step& s : steps_) token = s(token);
    return joins_with_space_ ? " " + token : token;
  }
  const std::string& name() const { return name_; }

 private:
  using Step = std::function<std::string(const std::string&)>;
  void add(const json& d, const std::string& source) {
    const std::string type = d.is_object() ? d.value("type", "") : "";
    if (type == "Sequence") {
      const json& list = d.value("decoders", json::array());
      std::string inner;
      for (const json& x : list) {
        add(x, source);
        inner += (inner.empty() ? "" : ", ") + last_;
      }
      name_ = "Sequence(" + inner + ")";
      return;
    }
    last_ = type;
    if (name_.empty()) name_ = type;
    if (type == "ByteLevel") {
      steps_.push_back([inverse = byte_of_code_point()](const std::string& t) {
        std::string out;
        for (uint32_t cp : code_points(t)) {
          const int b = cp < inverse.size() ? inverse[cp] : -1;
          if (b < 0) return t;  // not a byte-level token (an added token's text): as it is
          out += static_cast<char>(b);
        }
        return out;
      });
    } else if (type == "Metaspace") {
      const std::string replacement = d.value("replacement", std::string("\xE2\x96\x81"));
      steps_.push_back([replacement](const std::string& t) {
        std::string out = t;
        replace_all(out, replacement, " ");
        return out;
      });
    } else if (type == "Replace") {
      const json& pattern = d.value("pattern", json::object());
      HYDRA_USER_CHECK(pattern.contains("String") && pattern.at("String").is_string() && d.value("content", json()).is_string(),
                       "{}: a Replace decoder with a pattern other than a string (a Regex) is not one hydra reads", source);
      steps_.push_back([from = pattern.at("String").get<std::string>(), to = d.at("content").get<std::string>()](const std::string& t) {
        std::string out = t;
        replace_all(out, from, to);
        return out;
      });
    } else if (type == "ByteFallback") {
      steps_.push_back([](const std::string& t) {
        if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>') {
          return std::string(1, static_cast<char>(std::stoi(t.substr(3, 2), nullptr, 16)));
        }
        return t;
      });
    } else if (type == "Fuse" || type == "Strip") {
      // They act on the joined text (Fuse joins, Strip trims its ends): a token keeps its bytes.
    } else if (type == "WordPiece") {
      steps_.push_back([prefix = d.value("prefix", std::string("##"))](const std::string& t) {
        return t.compare(0, prefix.size(), prefix) == 0 ? t.substr(prefix.size()) : " " + t;
      });
    } else if (type == "BPEDecoder") {
      steps_.push_back([suffix = d.value("suffix", std::string("</w>"))](const std::string& t) {
        std::string out = t;
        replace_all(out, suffix, " ");
        return out;
      });
    } else {
      HYDRA_USER_FAIL("{}: its decoder {} is not one hydra reads for stop strings (ByteLevel, Metaspace, Replace, "
                      "ByteFallback, Fuse, Strip, WordPiece, BPEDecoder, Sequence); stop on ids with --stop-token",
                      source, type.empty() ? d.dump().substr(0, 60) : type);
    }
  }
  std::vector<Step> steps_;
  bool joins_with_space_ = false;
  std::string name_, last_;
};

json read_json_file(const std::string& path, const std::string& what) {
  std::ifstream in(path);
  HYDRA_USER_CHECK(in.good(), "{}: cannot read the {}", path, what);
  const json j = json::parse(in, nullptr, false);
  HYDRA_USER_CHECK(!j.is_discarded() && j.is_object(), "{}: the {} is not a JSON object", path, what);
  return j;
}

}  // namespace

TokenTexts TokenTexts::from_file(const std::string& path, Decode decode) {
  const json j = read_json_file(path, "tokenizer (tokenizer.json)");
  HYDRA_USER_CHECK(j.contains("model") && j.at("model").is_object() && j.at("model").contains("vocab"),
                   "{}: not a Hugging Face tokenizer.json (no model.vocab)", path);
  const std::optional<Decoder> decoder =
      decode == Decode::yes ? std::optional<Decoder>(std::in_place, j.value("decoder", json()), path) : std::nullopt;
  TokenTexts t;
  t.decoder_ = decoder ? decoder->name() : "not read";
  std::vector<std::pair<int64_t, std::string>> tokens;  // id, vocabulary string
  const json& vocab = j.at("model").at("vocab");
  if (vocab.is_object()) {  // BPE, WordLevel, WordPiece: token -> id
    for (const auto& [token, id] : vocab.items()) {
      HYDRA_USER_CHECK(id.is_number_integer(), "{}: model.vocab['{}'] is not an id", path, token);
      tokens.emplace_back(id.get<int64_t>(), token);
    }
  } else if (vocab.is_array()) {  // Unigram: [[piece, score], ...], the id is the index
    for (size_t i = 0; i < vocab.size(); ++i) {
      HYDRA_USER_CHECK(vocab[i].is_array() && !vocab[i].empty() && vocab[i][0].is_string(), "{}: model.vocab[{}] is not "
                       "a [piece, score] pair", path, i);
      tokens.emplace_back(static_cast<int64_t>(i), vocab[i][0].get<std::string>());
    }
  } else {
    HYDRA_USER_FAIL("{}: model.vocab is neither an object nor a list", path);
  }
  std::vector<std::pair<int64_t, std::string>> added;  // id, content (not decoded)
  for (const json& a : j.value("added_tokens", json::array())) {
    HYDRA_USER_CHECK(a.is_object() && a.value("id", json()).is_number_integer() && a.value("content", json()).is_string(),
                     "{}: an added token without an id and a content ({})", path, a.dump().substr(0, 80));
    added.emplace_back(a.at("id").get<int64_t>(), a.at("content").get<std::string>());
  }
  int64_t size = 0;
  for (const auto& [id, s] : tokens) size = std::max(size, id + 1);
  for (const auto& [id, s] : added) size = std::max(size, id + 1);
  HYDRA_USER_CHECK(size > 0 && size < (int64_t{1} << 31), "{}: ids up to {}, outside [0, 2^31)", path, size - 1);
  for (const auto& [id, s] : tokens) HYDRA_USER_CHECK(id >= 0, "{}: the token '{}' has the id {}", path, s, id);
  for (const auto& [id, s] : added) HYDRA_USER_CHECK(id >= 0, "{}: the added token '{}' has the id {}", path, s, id);
  t.bytes_.assign(static_cast<size_t>(size), std::string());
  for (const auto& [id, s] : tokens) {
    if (decoder) t.bytes_[static_cast<size_t>(id)] = decoder->apply(s);
    t.ids_.emplace_back(s, static_cast<int32_t>(id));
  }
  for (const auto& [id, s] : added) {
    if (decoder) t.bytes_[static_cast<size_t>(id)] = s;
    t.ids_.emplace_back(s, static_cast<int32_t>(id));
  }
  std::sort(t.ids_.begin(), t.ids_.end());
  return t;
}

const std::string& TokenTexts::bytes(int32_t id) const {
  static const std::string none;
  return id >= 0 && id < size() ? bytes_[static_cast<size_t>(id)] : none;
}

std::optional<int32_t> TokenTexts::id_of(const std::string& token) const {
  const auto it = std::lower_bound(ids_.begin(), ids_.end(), std::make_pair(token, INT32_MIN));
  if (it == ids_.end() || it->first != token) return std::nullopt;
  return it->second;
}

std::string TokenTexts::fingerprint() const {
  std::string all;
  for (const std::string& b : bytes_) all += std::to_string(b.size()) + ":" + b;
  return hash_hex(hash_bytes(all.data(), all.size()));
}

std::vector<int32_t> default_stop_ids(const std::string& tokenizer_json, const TokenTexts& texts) {
  namespace fs = std::filesystem;
  const fs::path folder = fs::path(tokenizer_json).parent_path();
  std::vector<int32_t> ids;
  const auto in_vocabulary = [&](int64_t id) {
    HYDRA_USER_CHECK(id >= 0 && id < texts.size(), "{}: eos_token_id {} is outside the tokenizer's ids [0, {})",
                     (folder / "generation_config.json").string(), id, texts.size());
    return static_cast<int32_t>(id);
  };
  if (fs::exists(folder / "generation_config.json")) {
    const json g = read_json_file((folder / "generation_config.json").string(), "generation config");
    const json& eos = g.value("eos_token_id", json());
    if (eos.is_number_integer()) ids.push_back(in_vocabulary(eos.get<int64_t>()));
    if (eos.is_array()) {
      for (const json& e : eos) {
        if (e.is_number_integer()) ids.push_back(in_vocabulary(e.get<int64_t>()));
      }
    }
    if (!ids.empty()) return ids;
  }
  if (fs::exists(folder / "tokenizer_config.json")) {
    const json c = read_json_file((folder / "tokenizer_config.json").string(), "tokenizer config");
    json eos = c.value("eos_token", json());
    if (eos.is_object()) eos = eos.value("content", json());
    if (eos.is_string()) {
      if (const auto id = texts.id_of(eos.get<std::string>())) return {*id};
    }
  }
  for (const char* name : {"<|endoftext|>", "</s>", "<eos>"}) {
    if (const auto id = texts.id_of(name)) return {*id};
  }
  return {};
}

StopStrings::StopStrings(std::vector<std::string> strings, const TokenTexts* texts)
    : strings_(std::move(strings)), texts_(texts) {
  for (const std::string& s : strings_) {
    HYDRA_USER_CHECK(!s.empty(), "--stop: an empty stop string would stop at once");
    longest_ = std::max(longest_, s.size());
  }
  HYDRA_ASSERT(strings_.empty() || texts_ != nullptr, "stop strings without the tokenizer's texts");
}

StopStrings::State StopStrings::start(std::span<const int32_t> prompt) const {
  State s;
  if (strings_.empty()) return s;
  // The prompt's last tokens, enough bytes for a match that begins in them.
  for (size_t k = prompt.size(); k > 0 && s.tail.size() + 1 < longest_; --k) s.tail = texts_->bytes(prompt[k - 1]) + s.tail;
  if (s.tail.size() + 1 > longest_) s.tail.erase(0, s.tail.size() + 1 - longest_);
  return s;
}

std::optional<std::string> StopStrings::add(State& state, int32_t id) const {
  if (strings_.empty()) return std::nullopt;
  const size_t before = state.tail.size();
  state.tail += texts_->bytes(id);
  std::optional<std::string> hit;
  for (const std::string& s : strings_) {
    // A match ending in the new bytes begins at or after before + 1 − |s|.
    const size_t from = before + 1 >= s.size() ? before + 1 - s.size() : 0;
    const size_t at = state.tail.find(s, from);
    if (at != std::string::npos && at + s.size() > before) {
      hit = s;
      break;
    }
  }
  if (state.tail.size() + 1 > longest_) state.tail.erase(0, state.tail.size() + 1 - longest_);
  return hit;
}

}  // namespace hydra
