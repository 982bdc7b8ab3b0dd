#include "runtime/token_identity.h"

#include <sys/stat.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/atomic_file.h"
#include "runtime/content_hash.h"
#include "runtime/error.h"
#include "runtime/hdf5_file.h"
#include "runtime/json_integer.h"
#include "runtime/log.h"
#include "runtime/token_file.h"

namespace hydra {
namespace fs = std::filesystem;
namespace {

constexpr int kIdentityVersion = 1;  // of the fingerprint's definition: a cache entry of another is stale
constexpr int64_t kBlock = int64_t{1} << 22;  // tokens per read (16 MiB of int32 ids)

class Hasher {
 public:
  Hasher() : state_(XXH3_createState(), XXH3_freeState) {
    HYDRA_ASSERT(state_ != nullptr && XXH3_64bits_reset(state_.get()) == XXH_OK, "XXH3 state");
  }
  void update(const void* data, size_t bytes) { XXH3_64bits_update(state_.get(), data, bytes); }
  void text(const std::string& s) { update(s.data(), s.size() + 1); }  // with its NUL: fields stay apart
  uint64_t digest() const { return XXH3_64bits_digest(state_.get()); }

 private:
  std::unique_ptr<XXH3_state_t, XXH_errorcode (*)(XXH3_state_t*)> state_;
};

// "name:absent" or "name:int<width*8>|uint<width*8>:<length>".
std::string describe(const H5File& file, const std::string& name) {
  if (!file.has_dataset(name)) return name + ":absent";
  const H5File::IntegerVectorInfo info = file.integer_vector_info(name);
  return fmt::format("{}:{}int{}:{}", name, info.is_signed ? "" : "u", info.width * 8, info.length);
}

struct FileStamp {
  int64_t size = 0, inode = 0, device = 0, mtime_ns = 0, ctime_ns = 0;
  nlohmann::json json() const {
    return {{"size", size}, {"inode", inode}, {"device", device}, {"mtime_ns", mtime_ns}, {"ctime_ns", ctime_ns}};
  }
};

FileStamp stamp_of(const std::string& path) {
  struct stat st {};
  HYDRA_USER_CHECK(::stat(path.c_str(), &st) == 0, "cannot read {}: {}", path, std::strerror(errno));
  return FileStamp{static_cast<int64_t>(st.st_size), static_cast<int64_t>(st.st_ino), static_cast<int64_t>(st.st_dev),
                   static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec,
                   static_cast<int64_t>(st.st_ctim.tv_sec) * 1000000000 + st.st_ctim.tv_nsec};
}

}  // namespace

namespace {
std::string& cache_dir() {
  static std::string dir;
  return dir;
}
}  // namespace

void set_token_identity_cache_dir(std::string dir) { cache_dir() = std::move(dir); }
const std::string& token_identity_cache_dir() { return cache_dir(); }

TokenFileIdentity compute_token_file_identity(const std::string& path, int64_t window_seq_len,
                                              std::vector<int32_t>* window_index) {
  // The widest vocabulary the int32 ids admit: the range is checked against the model's later.
  const TokenReader reader(path, int64_t{std::numeric_limits<int32_t>::max()} + 1);
  const H5File file = H5File::open_read(path);
  TokenFileIdentity id;
  id.tokens = reader.length();
  id.min_id = std::numeric_limits<int64_t>::max();
  id.max_id = -1;
  Hasher ids_hash, mask_hash, offsets_hash;
  std::vector<int32_t> ids;
  for (int64_t first = 0; first < reader.length(); first += kBlock) {
    ids.resize(static_cast<size_t>(std::min(kBlock, reader.length() - first)));
    reader.read_ids(first, ids);
    ids_hash.update(ids.data(), ids.size() * sizeof(int32_t));
    const auto [lo, hi] = std::minmax_element(ids.begin(), ids.end());
    id.min_id = std::min<int64_t>(id.min_id, *lo);
    id.max_id = std::max<int64_t>(id.max_id, *hi);
  }
  // The mask and the offsets in one pass that also counts the windows' targets when asked.
  TokenFlagHooks hooks;
  hooks.mask = [&](std::span<const uint8_t> m) { mask_hash.update(m.data(), m.size()); };
  hooks.offsets = [&](std::span<const int64_t> o) { offsets_hash.update(o.data(), o.size() * sizeof(int64_t)); };
  const bool flagged = reader.has_mask() || reader.has_documents();
  std::vector<int32_t> index = count_window_targets(reader, flagged && window_index ? window_seq_len : 0, hooks);
  if (window_index) *window_index = flagged ? std::move(index) : std::vector<int32_t>{};
  // Each dataset: "<description> <XXH3 of its values>", or "<name>:absent".
  const auto field = [&](const char* name, const Hasher& h) {
    if (!id.fingerprint.empty()) id.fingerprint += "; ";
    id.fingerprint += describe(file, name);
    if (file.has_dataset(name)) id.fingerprint += " " + hash_hex(h.digest());
  };
  field("input_ids", ids_hash);
  field("loss_mask", mask_hash);
  field("document_offsets", offsets_hash);
  for (const char* name : {"answer_start", "answer_length"}) {
    Hasher h;
    if (file.has_dataset(name)) {
      const std::vector<int64_t> values = file.read_integer_vector(name);  // O(answers), as the reader holds
      h.update(values.data(), values.size() * sizeof(int64_t));
    }
    field(name, h);
  }
  id.fingerprint = fmt::format("v{}; {}", kIdentityVersion, id.fingerprint);
  return id;
}

namespace {
std::string window_index_key(const std::string& identity, int64_t seq_len) {
  return fmt::format("{} seq_len {}", identity, seq_len);
}
std::string window_index_entry(const std::string& identity, int64_t seq_len) {
  const std::string key = window_index_key(identity, seq_len);
  return (fs::path(token_identity_cache_dir()) / "token-index" / (hash_hex(hash_bytes(key.data(), key.size())) + ".i32"))
      .string();
}
// The entry's checksum: XXH3 of its key (the identity and seq_len) and its counts, so an entry that
// was damaged, cut short, edited or copied from another file's name does not verify.
uint64_t window_index_checksum(const std::string& identity, int64_t seq_len, const std::vector<int32_t>& index) {
  Hasher h;
  h.text(window_index_key(identity, seq_len));
  h.update(index.data(), index.size() * sizeof(int32_t));
  return h.digest();
}
}  // namespace

std::optional<std::vector<int32_t>> load_window_index(const std::string& identity, int64_t seq_len, int64_t windows) {
  if (token_identity_cache_dir().empty()) return std::nullopt;
  const std::string entry = window_index_entry(identity, seq_len);
  std::error_code ec;
  // A regular file of the counts (4 bytes a window) and their checksum (8 bytes, little-endian).
  if (!fs::is_regular_file(entry, ec) || fs::file_size(entry, ec) != static_cast<uintmax_t>(windows) * 4 + 8 || ec) {
    return std::nullopt;
  }
  std::vector<int32_t> index(static_cast<size_t>(windows));
  uint64_t stored = 0;
  try {
    std::ifstream in(entry, std::ios::binary);
    if (!in || !in.read(reinterpret_cast<char*>(index.data()), windows * 4) ||
        !in.read(reinterpret_cast<char*>(&stored), sizeof(stored))) {
      return std::nullopt;
    }
  } catch (const std::exception&) {  // a read error of the stream: an entry not used
    return std::nullopt;
  }
  if (stored != window_index_checksum(identity, seq_len, index)) return std::nullopt;
  if (!std::all_of(index.begin(), index.end(), [&](int32_t c) { return c >= 0 && c <= seq_len; })) return std::nullopt;
  return index;
}

void store_window_index(const std::string& identity, int64_t seq_len, const std::vector<int32_t>& index,
                        const std::string& file_for_messages) {
  if (token_identity_cache_dir().empty()) return;
  const std::string entry = window_index_entry(identity, seq_len);
  try {
    fs::create_directories(fs::path(entry).parent_path());
    AtomicFile out(entry);
    {
      const uint64_t checksum = window_index_checksum(identity, seq_len, index);
      std::ofstream o(out.temp_path(), std::ios::binary);
      o.write(reinterpret_cast<const char*>(index.data()), static_cast<std::streamsize>(index.size() * 4));
      o.write(reinterpret_cast<const char*>(&checksum), sizeof(checksum));
      HYDRA_USER_CHECK(o.good(), "writing {} failed", out.temp_path());
    }
    out.commit();
  } catch (const std::exception& e) {
    log::warn("the window index of {} is not cached ({}): the next start counts it again", file_for_messages, e.what());
  }
}

std::string token_identity_difference(const std::string& a, const std::string& b) {
  // The fields are "; "-separated, each starting with its dataset's name (up to ':').
  const auto split = [](const std::string& s) {
    std::vector<std::string> out;
    for (size_t at = 0; at <= s.size();) {
      const size_t end = std::min(s.find("; ", at), s.size());
      out.push_back(s.substr(at, end - at));
      at = end + 2;
    }
    return out;
  };
  const std::vector<std::string> fa = split(a), fb = split(b);
  std::string differ;
  for (size_t i = 0; i < std::max(fa.size(), fb.size()); ++i) {
    const std::string x = i < fa.size() ? fa[i] : "", y = i < fb.size() ? fb[i] : "";
    if (x == y) continue;
    const std::string& named = x.empty() ? y : x;
    std::string name = named.substr(0, named.find(':'));
    if (i == 0) name = "the identity's version";
    differ += (differ.empty() ? "" : ", ") + name;
  }
  return differ;
}

namespace {

// The cache entry of `kind` ("token-identity", "file-hash") for a file: a JSON object with the
// file's absolute path and stamp and the cached fields.
struct CacheEntry {
  fs::path path;
  std::string absolute;
  nlohmann::json stamp;
};

CacheEntry cache_entry(const std::string& kind, const std::string& path) {
  const std::string absolute = fs::absolute(path).lexically_normal().string();
  return CacheEntry{fs::path(token_identity_cache_dir()) / kind / (hash_hex(hash_bytes(absolute.data(), absolute.size())) + ".json"),
                    absolute, stamp_of(path).json()};
}

// XXH3 hex of an entry's fields without its checksum (nlohmann dumps an object's keys in order).
std::string entry_checksum(nlohmann::json fields) {
  fields.erase("checksum");
  const std::string text = fields.dump();
  return hash_hex(hash_bytes(text.data(), text.size()));
}

// The cached fields when the entry is a regular file of JSON whose checksum verifies (damage, a cut,
// an edit) and that is fresh (same version, path and stamp), else null: the caller computes again.
nlohmann::json read_cache(const CacheEntry& e) {
  if (token_identity_cache_dir().empty()) return nlohmann::json();
  std::error_code ec;
  if (!fs::is_regular_file(e.path, ec) || fs::file_size(e.path, ec) > (size_t{1} << 20)) return nlohmann::json();
  nlohmann::json cached;
  try {
    std::ifstream in(e.path);
    std::stringstream text;
    text << in.rdbuf();
    cached = nlohmann::json::parse(text.str(), nullptr, false);
  } catch (const std::exception&) {
    return nlohmann::json();
  }
  const auto is = [&](const char* key, const nlohmann::json& value) { return cached.contains(key) && cached[key] == value; };
  const bool fresh = cached.is_object() && cached.contains("checksum") && cached["checksum"].is_string() &&
                     cached["checksum"].get<std::string>() == entry_checksum(cached) && is("version", kIdentityVersion) &&
                     is("path", e.absolute) && is("stamp", e.stamp);
  return fresh ? cached : nlohmann::json();
}

// Written only when the file did not change while it was read (its stamp still the one read first).
void write_cache(const CacheEntry& e, const std::string& path, nlohmann::json fields) {
  if (token_identity_cache_dir().empty() || stamp_of(path).json() != e.stamp) return;
  try {
    std::error_code ec;
    fs::create_directories(e.path.parent_path(), ec);
    fields["version"] = kIdentityVersion;
    fields["path"] = e.absolute;
    fields["stamp"] = e.stamp;
    fields["checksum"] = entry_checksum(fields);
    write_text_atomically(e.path.string(), fields.dump() + "\n");
  } catch (const std::exception& ex) {
    log::warn("the fingerprint of {} is not cached ({}): the next start reads the file again", path, ex.what());
  }
}

// A verified entry's identity, its fields of the kinds written and its token count the file's (its
// shape, cheap to read); nullopt otherwise (computed again).
std::optional<TokenFileIdentity> cached_identity(const nlohmann::json& cached, const std::string& path) {
  try {
    if (!cached.is_object() || !cached.contains("fingerprint") || !cached["fingerprint"].is_string()) return std::nullopt;
    TokenFileIdentity id{cached["fingerprint"].get<std::string>(), json_integer(cached.at("tokens"), "tokens"),
                         json_integer(cached.at("min_id"), "min_id"), json_integer(cached.at("max_id"), "max_id")};
    if (id.tokens != token_file_length(path) || id.min_id < 0 || id.min_id > id.max_id) return std::nullopt;
    return id;
  } catch (const UserError&) {  // a field of another kind
    return std::nullopt;
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
}

}  // namespace

TokenFileIdentity token_file_identity(const std::string& path, bool* reused, int64_t window_seq_len) {
  const CacheEntry entry = cache_entry("token-identity", path);
  if (reused) *reused = false;
  if (const std::optional<TokenFileIdentity> cached = cached_identity(read_cache(entry), path)) {
    if (reused) *reused = true;
    return *cached;
  }
  std::vector<int32_t> index;
  const TokenFileIdentity id = compute_token_file_identity(path, window_seq_len, &index);
  if (stamp_of(path).json() != entry.stamp) return id;  // changed while read: neither is cached
  if (!index.empty()) store_window_index(id.fingerprint, window_seq_len, index, path);
  write_cache(entry, path, {{"fingerprint", id.fingerprint}, {"tokens", id.tokens}, {"min_id", id.min_id},
                            {"max_id", id.max_id}});
  return id;
}

uint64_t cached_file_hash(const std::string& path, bool* reused) {
  const CacheEntry entry = cache_entry("file-hash", path);
  if (reused) *reused = false;
  if (const nlohmann::json cached = read_cache(entry); cached.contains("xxh3") && cached["xxh3"].is_string()) {
    const std::string hex = cached["xxh3"].get<std::string>();
    char* stop = nullptr;
    const uint64_t h = std::strtoull(hex.c_str(), &stop, 16);
    if (hex.size() == 16 && stop == hex.c_str() + hex.size()) {
      if (reused) *reused = true;
      return h;
    }
  }
  const uint64_t h = hash_file(path);
  write_cache(entry, path, {{"xxh3", hash_hex(h)}});
  return h;
}

std::string token_file_sample(const std::string& path) {
  const TokenReader reader(path, int64_t{std::numeric_limits<int32_t>::max()} + 1);
  const H5File file = H5File::open_read(path);
  Hasher h;
  std::string shapes;
  for (const char* name : {"input_ids", "loss_mask", "document_offsets", "answer_start", "answer_length"}) {
    shapes += describe(file, name) + " ";
  }
  h.text(shapes);
  constexpr int64_t kSamples = 16, kLength = 4096;
  const int64_t t = reader.length(), len = std::min(kLength, t);
  std::vector<int32_t> ids(static_cast<size_t>(len));
  std::vector<uint8_t> mask(static_cast<size_t>(len));
  for (int64_t k = 0; k < kSamples; ++k) {
    const int64_t first = (t - len) * k / (kSamples - 1);  // 0 … t − len: the first and the last tokens included
    reader.read_ids(first, ids);
    h.update(ids.data(), ids.size() * sizeof(int32_t));
    if (reader.has_mask()) {
      reader.read_mask(first, mask);
      h.update(mask.data(), mask.size());
    }
  }
  return shapes + hash_hex(h.digest());
}

}  // namespace hydra
