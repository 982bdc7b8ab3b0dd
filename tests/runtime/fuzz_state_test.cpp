// Fuzzing of what a training run reads back from disk (issue 54's probe, as suites): a step folder's
// manifest.json and the `latest` pointer (model/train/shards.h, state.h), and the caches of
// runtime/token_identity.h (the content identity, the window index, the file hash).
//
// Manifests: a real step folder written by a 1-step run of a tiny model, then (1) the mutation fuzzer
// over its text (tests/runtime/fuzz_util.h), and (2) every field, at every depth, replaced by each
// of a list of hostile values (fractions, 1e300, 2^63, negative numbers, names that lead out of the
// folder — "../", absolute, ".", "", embedded NUL —, other kinds) or deleted. Allowed: success or a
// UserError; a shard name other than its writer's is always refused, even where a valid copy of the
// shard lies at the place it names (nothing is read outside the step folder).
// `latest`: names of every kind, links out of the folder; each resolves inside the run folder or is
// a UserError.
// Caches: entries mutated (bytes and JSON), cut, replaced by a folder or a link; the identity, the
// file hash and the window counts read back must equal those computed from the file itself — a
// cache never changes what trains — and nothing but success may come of it (a damaged cache is
// recomputed, not an error).
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "model/model.h"
#include "model/params.h"
#include "model/train/data.h"
#include "model/train/shards.h"
#include "model/train/state.h"
#include "model/train/trainer.h"
#include "parallel/self_communicator.h"
#include "parallel/sequence_groups.h"
#include "runtime/content_hash.h"
#include "runtime/token_file.h"
#include "runtime/token_identity.h"
#include "tests/common/test_util.h"
#include "tests/runtime/fuzz_util.h"

namespace hydra::test {
namespace {

namespace fs = std::filesystem;
using namespace fuzzing;
using nlohmann::json;

constexpr int64_t kVocab = 16;  // fuzz_config's vocabulary

// A run folder with step-000001 (manifest, one shard, model.h5) and `latest`, from a 1-step run.
std::string train_one_step(const TempDir& dir) {
  const ModelConfig config = fuzz_config(Arch::hydrahead);
  std::vector<int32_t> ids(4 * 8 + 1);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 5 + 3) % kVocab);
  write_token_file(dir.file("d.h5"), ids);
  Model student(config, random_parameters(config, 3), Device::host, DType::f32);
  train::TrainConfig c;
  c.stage = train::Stage::pretrain;
  c.data = {dir.file("d.h5")};
  c.seq_len = 8;
  c.steps = 1;
  c.seed = 1;
  c.out_dir = dir.file("run");
  c.optim.lr = 1e-3;
  SelfCommunicator self;
  SequenceGroups topology(self, 1);
  train::run_training(c, topology, student, nullptr);
  return dir.file("run/step-000001");
}

// Every path to a leaf (and to every object and array) of `j`, as JSON pointers.
void pointers(const json& j, const json::json_pointer& at, std::vector<json::json_pointer>& out) {
  if (!at.empty()) out.push_back(at);
  if (j.is_object()) {
    for (const auto& [k, v] : j.items()) pointers(v, at / k, out);
  } else if (j.is_array()) {
    for (size_t i = 0; i < j.size(); ++i) pointers(j[i], at / i, out);
  }
}

// The hostile values a manifest field is replaced by.
std::vector<json> hostile_values(const std::string& outside) {
  return {json(3.7),
          json(1e300),
          json(-1e300),
          json(1.5),
          json(-1),
          json(0),
          json(int64_t{1} << 53),
          json((int64_t{1} << 53) + 1),
          json(INT64_MAX),
          json(uint64_t{18446744073709551615ull}),
          json(INT64_MIN),
          json(nullptr),
          json(true),
          json::array(),
          json::object(),
          json("x"),
          json(""),
          json("."),
          json(".."),
          json("../../outside/shard-00000-of-00001.h5"),
          json(outside),
          json("/etc/passwd"),
          json("a/b"),
          json(std::string("shard-00000-of-00001.h5\0x", 25)),
          json("{not json"),
          json(R"({"vocab_size": 1e300})")};
}

// Reads `dir` as --resume's checks do and as the divergence search does (every file it names).
void read_step(const std::string& dir) {
  train::read_manifest(dir);
  train::verify_sharded_checkpoint(dir);
}

class FuzzState : public ::testing::Test {
 protected:
  TempDir dir_;
};

TEST_F(FuzzState, ManifestText) {
  const std::string step = train_one_step(dir_), manifest = step + "/manifest.json";
  const Bytes seed = read_all(manifest);
  ASSERT_NO_THROW(read_step(step));
  expect_clean(fuzz(manifest, seed, 21, 900, true, [&] { read_step(step); }), "manifest text");
}

TEST_F(FuzzState, ManifestFields) {
  const std::string step = train_one_step(dir_), manifest = step + "/manifest.json";
  const json seed = json::parse(read_all(manifest));
  // A valid copy of the shard outside the run folder: a name leading to it must still be refused.
  fs::create_directories(dir_.file("outside"));
  const std::string outside = dir_.file("outside/shard-00000-of-00001.h5");
  fs::copy_file(step + "/shard-00000-of-00001.h5", outside);
  std::vector<json::json_pointer> fields;
  pointers(seed, json::json_pointer(), fields);
  Outcome o;
  int outside_read = 0;
  for (const json::json_pointer& at : fields) {
    std::vector<json> variants = hostile_values(outside);
    variants.push_back(json("deleted"));  // marker: the field removed
    for (size_t v = 0; v < variants.size(); ++v) {
      json m = seed;
      const bool deleted = v + 1 == variants.size();
      if (deleted) {
        m[at.parent_pointer()].is_array() ? m[at.parent_pointer()].erase(std::stoul(at.back()))
                                          : static_cast<void>(m[at.parent_pointer()].erase(at.back()));
      } else {
        m[at] = variants[v];
      }
      write_all(manifest, m.dump(1));
      const std::string what = fmt::format("{} = {}", at.to_string(), deleted ? "(deleted)" : variants[v].dump());
      try {
        read_step(step);
        ++o.ok;
        // A shard's name is its writer's: any other is refused, wherever it leads.
        if (at.to_string() == "/shards/0/file") {
          ++outside_read;
          ADD_FAILURE() << what << ": read (a shard name other than shard-00000-of-00001.h5)";
        }
      } catch (const UserError&) {
        ++o.user_errors;
      } catch (const std::exception& e) {
        if (o.failures.size() < 8) o.failures.push_back(fmt::format("{}: {}", what, e.what()));
      }
    }
  }
  write_all(manifest, seed.dump(1));
  EXPECT_NO_THROW(read_step(step));
  EXPECT_EQ(outside_read, 0);
  expect_clean(o, "manifest fields");
  EXPECT_GT(fields.size(), 30u) << "the manifest's fields were not found";
}

TEST_F(FuzzState, LatestPointer) {
  const std::string step = train_one_step(dir_), run = dir_.file("run");
  fs::create_directories(dir_.file("other/step-000002"));
  fs::create_directory_symlink(dir_.file("other/step-000002"), run + "/step-000009");
  fs::create_directory_symlink("step-000001", run + "/step-000010");  // a link inside the folder: allowed
  const std::vector<std::string> names = {
      "step-000001",          "step-000001\n",     "  step-000001  \n", "../other/step-000002", dir_.file("other/step-000002"),
      "step-000009",          "step-1",            "step-00000a",        "step-000001/..",      "step-000001\nstep-000002",
      "step-000010",          "latest",            ".",                  "..",                  std::string("step-000001\0", 12),
      std::string(300, 's'),  "",                  "\n"};
  int inside = 0, refused = 0;
  for (const std::string& name : names) {
    write_all(run + "/latest", name);
    try {
      const std::string dir = train::latest_checkpoint(run);
      if (dir.empty()) continue;
      EXPECT_EQ(fs::canonical(dir).parent_path(), fs::canonical(run)) << "'" << name << "' led to " << dir;
      ++inside;
    } catch (const UserError&) {
      ++refused;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "'" << name << "': " << e.what();
    }
  }
  EXPECT_EQ(inside, 4);  // step-000001 with or without whitespace, and the link inside the folder
  EXPECT_GT(refused, 10);
  // A pointer that is a folder, or a link to another run's pointer.
  fs::remove(run + "/latest");
  fs::create_directory(run + "/latest");
  EXPECT_NE(error_of([&] { train::latest_checkpoint(run); }).find("is not a file"), std::string::npos);
  fs::remove(run + "/latest");
  std::ofstream(dir_.file("other/latest")) << "step-000002\n";
  fs::create_symlink(dir_.file("other/latest"), run + "/latest");
  EXPECT_NE(error_of([&] { train::latest_checkpoint(run); }).find("is not a file"), std::string::npos);
}

// ---- Caches --------------------------------------------------------------------------------------

// The token identity cache's folder for the test's lifetime (as hydra sets it at start; unset after:
// nothing cached).
class CacheDir {
 public:
  explicit CacheDir(const std::string& path) { set_token_identity_cache_dir(path); }
  ~CacheDir() { set_token_identity_cache_dir(""); }
};

// The single file under `folder` (a cache kind's one entry).
std::string only_entry(const std::string& folder) {
  std::vector<std::string> found;
  for (const auto& e : fs::directory_iterator(folder)) found.push_back(e.path().string());
  return found.size() == 1 ? found.front() : "";
}

// Replaces `entry` with a folder, a link to /dev/zero, a link to nothing, or an empty file (kind % 4).
void odd_entry(const std::string& entry, int kind) {
  fs::remove_all(entry);
  switch (kind % 4) {
    case 0: fs::create_directory(entry); break;
    case 1: fs::create_symlink("/dev/zero", entry); break;
    case 2: fs::create_symlink(entry + ".absent", entry); break;
    default: std::ofstream(entry).flush();
  }
}

struct Corpus {
  std::vector<int32_t> ids;
  std::vector<uint8_t> mask;
  std::vector<int64_t> offsets;
};

// A masked, documented file: its window index is what the cache keeps.
Corpus write_corpus(const std::string& path) {
  Corpus c;
  for (int64_t i = 0; i < 900; ++i) {
    c.ids.push_back(static_cast<int32_t>((i * 7 + 1) % kVocab));
    c.mask.push_back(i % 5 == 0 ? 0 : 1);
  }
  for (int64_t o = 0; o < 900; o += 37) c.offsets.push_back(o);
  c.offsets.push_back(900);
  write_token_data(path, c.ids, c.mask, c.offsets);
  return c;
}

TEST_F(FuzzState, IdentityAndFileHashEntries) {
  const CacheDir cache(dir_.file("cache"));
  const std::string data = dir_.file("d.h5");
  write_corpus(data);
  const TokenFileIdentity truth = compute_token_file_identity(data);
  const uint64_t bytes = hash_file(data);
  token_file_identity(data);
  cached_file_hash(data);
  const std::string identity_entry = only_entry(dir_.file("cache/token-identity"));
  const std::string hash_entry = only_entry(dir_.file("cache/file-hash"));
  ASSERT_FALSE(identity_entry.empty());
  ASSERT_FALSE(hash_entry.empty());
  for (const auto& [entry, stream] : {std::pair{identity_entry, uint64_t{31}}, std::pair{hash_entry, uint64_t{32}}}) {
    token_file_identity(data);
    cached_file_hash(data);
    const Bytes seed = read_all(entry);
    int wrong = 0;
    const auto check = [&] {
      const TokenFileIdentity id = token_file_identity(data);
      wrong += id.fingerprint != truth.fingerprint || id.tokens != truth.tokens || id.min_id != truth.min_id ||
               id.max_id != truth.max_id || cached_file_hash(data) != bytes;
    };
    const Outcome json_mutants = fuzz(entry, seed, stream, 300, true, check);
    const Outcome byte_mutants = fuzz(entry, seed, stream + 100, 300, false, check);
    for (const Outcome& o : {json_mutants, byte_mutants}) {
      EXPECT_EQ(o.user_errors, 0) << entry << ": a damaged cache entry is recomputed, not an error";
      EXPECT_TRUE(o.failures.empty()) << entry << ": " << (o.failures.empty() ? "" : o.failures.front());
    }
    for (int kind = 0; kind < 4; ++kind) {
      odd_entry(entry, kind);
      EXPECT_NO_THROW(check()) << entry << " replaced (kind " << kind << ")";
    }
    EXPECT_EQ(wrong, 0) << entry << ": a mutated entry changed the identity or the hash read back";
    std::printf("[ fuzz ] cache entry %s: 604 mutants, every one read back as the file's own\n",
                fs::path(entry).parent_path().filename().c_str());
  }
}

TEST_F(FuzzState, WindowIndexEntries) {
  const CacheDir cache(dir_.file("cache"));
  const std::string data = dir_.file("d.h5");
  write_corpus(data);
  constexpr int64_t kSeqLen = 16;
  const TokenFileIdentity id = token_file_identity(data, nullptr, kSeqLen);  // caches the index of 16
  const std::vector<int32_t> truth = count_window_targets(TokenReader(data, kVocab), kSeqLen);
  const std::string entry = only_entry(dir_.file("cache/token-index"));
  ASSERT_FALSE(entry.empty());
  const Bytes seed = read_all(entry);
  int wrong = 0, from_cache = 0;
  const auto check = [&] {
    const train::TokenWindows windows(std::vector<train::DataSource>{{.path = data, .identity = id.fingerprint, .corpus = ""}}, kSeqLen, 1, kVocab);
    from_cache += windows.index_from_cache();
    for (int64_t i = 0; i < windows.count(); ++i) {
      wrong += windows.counted_targets_in_order(i) != truth[static_cast<size_t>(i)];
    }
  };
  // Each mutant is read twice: the first read finds the damage and counts again (rewriting the
  // entry), the second must then read the rewritten entry.
  Outcome o = fuzz(entry, seed, 41, 500, false, [&] {
    check();
    check();
  });
  EXPECT_EQ(o.user_errors, 0) << "a damaged window index is counted again, not an error";
  EXPECT_TRUE(o.failures.empty()) << (o.failures.empty() ? "" : o.failures.front());
  // The probe's edits: every count set to seq_len (in range), every other one zeroed, all zeroed.
  for (int edit = 0; edit < 3; ++edit) {
    Bytes b = seed;
    for (size_t w = 0; w < truth.size(); ++w) {
      const int32_t v = edit == 0 ? static_cast<int32_t>(kSeqLen) : edit == 1 && w % 2 ? truth[w] : 0;
      std::memcpy(b.data() + 4 * w, &v, 4);
    }
    write_all(entry, b);
    EXPECT_NO_THROW(check()) << "edit " << edit;
  }
  for (int kind = 0; kind < 4; ++kind) {
    odd_entry(entry, kind);
    EXPECT_NO_THROW(check()) << "entry replaced (kind " << kind << ")";
  }
  EXPECT_EQ(wrong, 0) << "a damaged window index changed the counted targets of some window";
  EXPECT_GT(from_cache, 0) << "the cache was never used: the test shows nothing";
  std::printf("[ fuzz ] window index: 500 mutants + 7 edits, every count the file's own (%d reads from the cache)\n",
              from_cache);
}

}  // namespace
}  // namespace hydra::test
