// Hostile and damaged files through the hydra binary (issue 54, a probe of 409 cases at 6777ccb):
// step folders whose manifest or `latest` was edited, caches that lie, HDF5 files that declare more
// than they hold or hold it in other files. Each case ends with one line naming the problem and the
// file, exit 2, before any work; nothing is read outside the run folder; a cache never changes what
// trains; a fresh run never overwrites another run's checkpoints. Each test says what 6777ccb did.
//
// HYDRA_TEST_BINARY=/path/to/hydra runs these against another build (test_util.h), e.g. 6777ccb's,
// to see each test fail there.
#include <hdf5.h>

#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "model/model.h"
#include "model/params.h"
#include "runtime/checkpoint.h"
#include "runtime/token_file.h"
#include "tests/common/test_util.h"
#include "tests/launch/train_log.h"

namespace hydra::test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

json read_json(const std::string& path) { return json::parse(read_all(path)); }
void write_json(const std::string& path, const json& j) { std::ofstream(path) << j.dump(1) << "\n"; }

// A user error as the contract says: exit 2, one "hydra: error" line with `needle`, no internal error.
void expect_refused(const CommandResult& r, const std::string& needle) {
  expect_user_error(r, needle);
  EXPECT_EQ(r.output.find("internal error"), std::string::npos) << r.output;
  size_t errors = 0;
  for (size_t at = r.output.find("hydra: error"); at != std::string::npos; at = r.output.find("hydra: error", at + 1)) {
    ++errors;
  }
  EXPECT_EQ(errors, 1u) << r.output;
}

// Every step line of a run's log as text (a skipped step's loss is null).
std::vector<std::string> step_lines(const std::string& out) {
  std::vector<std::string> lines;
  for (const json& j : log_lines(out)) lines.push_back(j.at("loss").dump() + " " + j.at("counted_tokens").dump());
  return lines;
}

class HostileFiles : public ::testing::Test {
 protected:
  // hydra with this test's own cache folder (the identity and window-index caches).
  CommandResult run(const std::string& args) {
    return run_command("env HYDRA_CACHE_DIR=" + dir_.file("cache") + " timeout 120 " + hydra_binary() + " " + args);
  }
  std::string model() {
    const std::string path = dir_.file("m.h5");
    if (!fs::exists(path)) {
      const ModelConfig c = preset_config("hydrahead-tiny");
      write_model_checkpoint(path, c, random_parameters(c, 3));
    }
    return path;
  }
  std::string tokens(const std::string& name, int64_t n) {
    write_token_file(dir_.file(name), random_tokens(n, 256, 4));
    return dir_.file(name);
  }
  // `hydra train` of the tiny hybrid on d.h5 into `out` (4 steps of one 64-token window).
  std::string train_args(const std::string& out, const std::string& extra = "") {
    return "train --stage pretrain --model " + model() + " --data " + dir_.file("d.h5") +
           " --seq-len 64 --steps 4 --device cpu --seed 2 --out-dir " + out + " " + extra;
  }
  // A run stopped after step 2 (step-000002 saved, `latest` names it), copied to `name` per case.
  std::string stopped_run(const std::string& name, const std::string& lr = "1e-3") {
    const std::string out = dir_.file(name);
    if (!fs::exists(dir_.file("d.h5"))) tokens("d.h5", 8 * 64 + 1);
    const CommandResult r = run(train_args(out, "--stop-at 2 --lr " + lr));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return out;
  }
  TempDir dir_;
};

// ---- Step folders: the manifest and `latest` -----------------------------------------------------

// Each edit of a saved step's manifest.json is refused on --resume, naming the manifest and the field.
// At 6777ccb: a config that is not JSON and a shard entry without `file` were internal errors (exit
// 1); format_version 3.7 was read as 3 and resumed; step 1e300 was reported as -9223372036854775808
// (undefined behaviour); step 1.5 was truncated to 1 and the error blamed the shard.
TEST_F(HostileFiles, EditedManifestFieldsAreRefusedNamingTheField) {
  const std::string base = stopped_run("base");
  struct Edit {
    std::string name, needle;
    std::function<void(json&)> apply;
  };
  const std::vector<Edit> edits = {
      {"config", "field 'config' does not hold a JSON object", [](json& m) { m["config"] = "{not json"; }},
      {"no-file", "field 'file' is missing", [](json& m) { m["shards"][0].erase("file"); }},
      {"version", "field 'format_version': 3.7 is not an integer", [](json& m) { m["format_version"] = 3.7; }},
      {"step-huge", "field 'step': 1e+300 is not an integer", [](json& m) { m["step"] = 1e300; }},
      {"step-half", "field 'step': 1.5 is not an integer", [](json& m) { m["step"] = 1.5; }},
      {"begin", "field 'begin': 0.5 is not an integer", [](json& m) { m["shards"][0]["begin"] = 0.5; }},
      {"bytes", "field 'bytes': -5 is out of range", [](json& m) { m["shards"][0]["bytes"] = -5; }},
      {"sp", "field 'sp': 4 is out of range [1, 1]", [](json& m) { m["world_size"] = 1.0; m["sp"] = 4; }},
  };
  for (const Edit& e : edits) {
    SCOPED_TRACE(e.name);
    const std::string out = dir_.file("run-" + e.name);
    fs::copy(base, out, fs::copy_options::recursive);
    const std::string manifest = out + "/step-000002/manifest.json";
    json m = read_json(manifest);
    e.apply(m);
    write_json(manifest, m);
    const CommandResult r = run(train_args(out, "--resume"));
    expect_refused(r, e.needle);
    EXPECT_NE(r.output.find(manifest), std::string::npos) << r.output;
  }
}

// A shard dataset of another shape whose bytes (and so checksum) match: refused naming its shape.
// At 6777ccb: an internal error ("narrow(0, 0, N) of [2, N/2]").
TEST_F(HostileFiles, TwoDimensionalShardDatasetIsRefused) {
  const std::string out = stopped_run("run");
  const std::string shard = out + "/step-000002/shard-00000-of-00001.h5";
  const hid_t f = H5Fopen(shard.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  const hid_t d = H5Dopen2(f, "master", H5P_DEFAULT);
  const hid_t space = H5Dget_space(d);
  hsize_t n = 0;
  H5Sget_simple_extent_dims(space, &n, nullptr);
  std::vector<float> v(n);
  H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
  H5Sclose(space);
  H5Dclose(d);
  H5Ldelete(f, "master", H5P_DEFAULT);
  const hsize_t dims[2] = {n % 2 == 0 ? 2 : n, n % 2 == 0 ? n / 2 : 1};
  const hid_t space2 = H5Screate_simple(2, dims, nullptr);
  const hid_t d2 = H5Dcreate2(f, "master", H5T_IEEE_F32LE, space2, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  H5Dwrite(d2, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
  H5Dclose(d2);
  H5Sclose(space2);
  H5Fclose(f);
  const std::string manifest = out + "/step-000002/manifest.json";
  json m = read_json(manifest);
  m["shards"][0]["bytes"] = fs::file_size(shard);  // the checksum is of the values: it still matches
  write_json(manifest, m);
  expect_refused(run(train_args(out, "--resume")), fmt::format("dataset 'master' is float32 [{}, {}], not [{}] float", dims[0],
                                                               dims[1], n));
}

// Names read from the run folder lead nowhere else: a shard `file` of ../../other/… or an absolute
// path, and a `latest` of ../other/step-000002, each naming another run's valid checkpoint, are
// refused. At 6777ccb each was read and the run resumed on the other run's state (exit 0).
TEST_F(HostileFiles, NamesLeadingOutOfTheRunFolderAreRefused) {
  const std::string base = stopped_run("base");
  const std::string other = stopped_run("other", "5e-3");  // the same run's identity, another state
  const json other_entry = read_json(other + "/step-000002/manifest.json")["shards"][0];
  const std::string other_shard = other + "/step-000002/shard-00000-of-00001.h5";
  for (const std::string& name : {std::string("../../other/step-000002/shard-00000-of-00001.h5"), other_shard}) {
    SCOPED_TRACE(name);
    const std::string out = dir_.file(name[0] == '/' ? "absolute" : "relative");
    fs::copy(base, out, fs::copy_options::recursive);
    const std::string manifest = out + "/step-000002/manifest.json";
    json m = read_json(manifest);
    m["shards"][0] = other_entry;
    m["shards"][0]["file"] = name;
    write_json(manifest, m);
    expect_refused(run(train_args(out, "--resume")), "is not shard-00000-of-00001.h5, the name its rank writes");
  }
  const std::string out = dir_.file("latest-outside");
  fs::copy(base, out, fs::copy_options::recursive);
  std::ofstream(out + "/latest") << "../other/step-000002\n";
  expect_refused(run(train_args(out, "--resume")),
                 out + "/latest: holds '../other/step-000002', not the name of a step folder");
  // A link inside the run folder to another run's step folder.
  fs::remove_all(out + "/step-000002");
  fs::create_directory_symlink(other + "/step-000002", out + "/step-000002");
  std::ofstream(out + "/latest") << "step-000002\n";
  expect_refused(run(train_args(out, "--resume")), "is a link to " + fs::canonical(other + "/step-000002").string());
  EXPECT_EQ(losses(other).size(), 2u);  // the other run is untouched
}

// At 6777ccb a deleted manifest.json was reported as a missing state.h5.
TEST_F(HostileFiles, DeletedManifestIsNamed) {
  const std::string out = stopped_run("run");
  fs::remove(out + "/step-000002/manifest.json");
  expect_refused(run(train_args(out, "--resume")), out + "/step-000002: manifest.json is missing");
}

// A fresh run into a folder that holds another run's step folders but no `latest` (and no log) is
// refused and changes nothing. At 6777ccb it exited 0, replacing step-000001 and leaving the old
// step-000002 beside it (the README said such a folder is refused).
TEST_F(HostileFiles, FreshRunNeverOverwritesAnotherRunsCheckpoints) {
  tokens("d.h5", 8 * 64 + 1);
  const std::string out = dir_.file("run");
  ASSERT_EQ(run(train_args(out, "--stop-at 2 --save-every 1 --keep 5")).exit_code, 0);
  ASSERT_TRUE(fs::exists(out + "/step-000001/manifest.json"));
  fs::remove(out + "/latest");
  fs::remove(out + "/train.jsonl");
  const std::string before = read_all(out + "/step-000001/manifest.json");
  const CommandResult r = run("train --stage pretrain --model " + model() + " --data " + dir_.file("d.h5") +
                              " --seq-len 64 --steps 1 --device cpu --seed 9 --out-dir " + out);
  expect_refused(r, out + " holds step folders of another run (step-000001 .. step-000002) without a 'latest' pointer");
  EXPECT_EQ(read_all(out + "/step-000001/manifest.json"), before);
  EXPECT_FALSE(fs::exists(out + "/latest"));
}

// ---- Caches ---------------------------------------------------------------------------------------

std::string only_entry(const std::string& folder) {
  std::vector<std::string> found;
  for (const auto& e : fs::directory_iterator(folder)) found.push_back(e.path().string());
  return found.size() == 1 ? found.front() : "";
}

// A masked, documented corpus: its window index is what the cache keeps.
std::string masked_tokens(const std::string& path) {
  const std::vector<int32_t> ids = random_tokens(8 * 64 + 1, 256, 5);
  std::vector<uint8_t> mask(ids.size());
  for (size_t i = 0; i < mask.size(); ++i) mask[i] = i % 3 != 0;
  std::vector<int64_t> offsets;
  for (int64_t o = 0; o < static_cast<int64_t>(ids.size()); o += 45) offsets.push_back(o);
  offsets.push_back(static_cast<int64_t>(ids.size()));
  write_token_data(path, ids, mask, offsets);
  return path;
}

// Cache entries replaced by folders are computed again. At 6777ccb: an internal error
// ("basic_filebuf::underflow … Is a directory").
TEST_F(HostileFiles, CacheEntriesReplacedByFoldersAreComputedAgain) {
  masked_tokens(dir_.file("d.h5"));
  ASSERT_EQ(run(train_args(dir_.file("a"))).exit_code, 0);
  for (const char* kind : {"token-identity", "file-hash", "token-index"}) {
    const std::string entry = only_entry(dir_.file(std::string("cache/") + kind));
    ASSERT_FALSE(entry.empty()) << kind;
    fs::remove(entry);
    fs::create_directory(entry);
  }
  const CommandResult r = run(train_args(dir_.file("b")));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("content identity computed"), std::string::npos) << r.output;
  EXPECT_EQ(step_lines(dir_.file("b")), step_lines(dir_.file("a")));
}

// A window-index entry overwritten with in-range values — every count seq_len, every other count 0,
// every count 0 — is found out by its checksum and counted again: the run trains exactly as with a
// clean cache. At 6777ccb: an internal error ("step 1: 3 targets counted, 64 expected"), steps
// skipped "for the loss_mask", and "nothing to train on".
TEST_F(HostileFiles, WindowIndexCacheThatLiesChangesNothing) {
  masked_tokens(dir_.file("d.h5"));
  const CommandResult clean = run(train_args(dir_.file("clean")));
  ASSERT_EQ(clean.exit_code, 0) << clean.output;
  const std::vector<std::string> want = step_lines(dir_.file("clean"));
  ASSERT_EQ(want.size(), 4u);
  const std::string entry = only_entry(dir_.file("cache/token-index"));
  ASSERT_FALSE(entry.empty());
  const std::string seed = read_all(entry);
  const size_t windows = 8;  // (8·64 + 1 − 1) / 64
  for (int edit = 0; edit < 3; ++edit) {
    SCOPED_TRACE(edit);
    std::string b = seed;
    for (size_t w = 0; w < windows; ++w) {
      int32_t v = 0;
      std::memcpy(&v, seed.data() + 4 * w, 4);
      v = edit == 0 ? 64 : edit == 1 && w % 2 ? v : 0;
      std::memcpy(b.data() + 4 * w, &v, 4);
    }
    std::ofstream(entry, std::ios::binary | std::ios::trunc) << b;
    const std::string out = dir_.file(fmt::format("edit{}", edit));
    const CommandResult r = run(train_args(out));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(r.output.find("skipped"), std::string::npos) << r.output;
    EXPECT_EQ(step_lines(out), want) << r.output;
  }
}

// ---- HDF5 files that declare more than they hold ---------------------------------------------------

// A chunked 1-D dataset `name` of `n` elements in chunks of `chunk`, of which the first `written` are
// written (the other chunks never are); `filter` 32000 is h5py's lzf, registered here only while
// the file is written (a pass-through stand-in): hydra's HDF5 cannot decode it.
size_t pass_through(unsigned, size_t, const unsigned*, size_t nbytes, size_t*, void**) { return nbytes; }
const H5Z_class2_t kFakeLzf = {H5Z_CLASS_T_VERS, 32000, 1, 1, "lzf", nullptr, nullptr, pass_through};

void write_chunked(const std::string& path, const std::string& name, hsize_t n, hsize_t chunk, hsize_t written,
                   hid_t type, bool lzf = false, bool append = false) {
  if (lzf) {
    ASSERT_GE(H5Zregister(&kFakeLzf), 0);
  }
  const hid_t f = append ? H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT)
                         : H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  if (append) H5Ldelete(f, name.c_str(), H5P_DEFAULT);
  const hid_t space = H5Screate_simple(1, &n, nullptr);
  const hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_chunk(dcpl, 1, &chunk);
  if (lzf) H5Pset_filter(dcpl, 32000, H5Z_FLAG_MANDATORY, 0, nullptr);
  const hid_t d = H5Dcreate2(f, name.c_str(), type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  ASSERT_GE(d, 0);
  if (written > 0) {
    std::vector<double> v(written);
    for (hsize_t i = 0; i < written; ++i) v[i] = static_cast<double>((i * 7 + 3) % 200);
    const hid_t memory = H5Screate_simple(1, &written, nullptr);
    const hsize_t start = 0;
    H5Sselect_hyperslab(space, H5S_SELECT_SET, &start, nullptr, &written, nullptr);
    ASSERT_GE(H5Dwrite(d, H5T_NATIVE_DOUBLE, memory, space, H5P_DEFAULT, v.data()), 0);
    H5Sclose(memory);
  }
  H5Dclose(d);
  H5Pclose(dcpl);
  H5Sclose(space);
  H5Fclose(f);
  if (lzf) {
    ASSERT_GE(H5Zunregister(32000), 0);
  }
}

// A 1.4 KB file declaring 2^40 chunked token ids is refused at once by every command. At 6777ccb
// `hydra train` hashed 2^40 fill values until killed (here: the 60 s limit).
TEST_F(HostileFiles, DeclaredButNeverWrittenIdsAreRefusedAtOnce) {
  const std::string big = dir_.file("big.h5");
  write_chunked(big, "input_ids", hsize_t{1} << 40, 1024, 0, H5T_STD_I32LE);
  EXPECT_LT(fs::file_size(big), 4096u);
  const std::string needle = big + ": dataset 'input_ids' of shape [1099511627776] in chunks of [1024] holds 0 of its "
                                   "1073741824 chunks";
  const std::string m = model();
  for (const std::string& args :
       {"train --stage pretrain --model " + m + " --data " + big + " --seq-len 64 --steps 1 --device cpu --out-dir " +
            dir_.file("out"),
        "eval-lm --model " + m + " --data " + big + " --seq-len 64 --device cpu --out " + dir_.file("lm.json"),
        "forward --model " + m + " --input " + big + " --device cpu --output " + dir_.file("logits.h5")}) {
    SCOPED_TRACE(args);
    const CommandResult r = run_command("env HYDRA_CACHE_DIR=" + dir_.file("cache") + " timeout 60 " + hydra_binary() +
                                        " " + args);
    EXPECT_NE(r.exit_code, 124) << "still reading after 60 s";
    expect_refused(r, needle);
  }
  EXPECT_FALSE(fs::exists(dir_.file("out/latest")));
}

// 2^30 ids declared, only the first chunk written: an error, not zeros. At 6777ccb train and eval-lm
// ran on the zeros (exit 0). The same for a model tensor stored chunked with no data: at 6777ccb it
// loaded as zeros.
TEST_F(HostileFiles, UnwrittenChunksAreAnErrorNotZeros) {
  const std::string ids = dir_.file("ids.h5");
  write_chunked(ids, "input_ids", hsize_t{1} << 30, 1 << 16, 1 << 16, H5T_STD_I32LE);
  const std::string m = model();
  expect_refused(run("train --stage pretrain --model " + m + " --data " + ids +
                     " --seq-len 64 --steps 1 --device cpu --out-dir " + dir_.file("out")),
                 "holds 1 of its 16384 chunks: the others were never written");
  expect_refused(run("eval-lm --model " + m + " --data " + ids + " --seq-len 64 --windows 1 --device cpu --out " +
                     dir_.file("lm.json")),
                 "holds 1 of its 16384 chunks");
  // model.norm.weight [hidden] stored chunked, never written.
  const std::string broken = dir_.file("broken.h5");
  fs::copy_file(m, broken);
  const int64_t hidden = preset_config("hydrahead-tiny").hidden_size;
  write_chunked(broken, "model.norm.weight", static_cast<hsize_t>(hidden), 16, 0, H5T_IEEE_F32LE, false, true);
  const std::string d = tokens("d.h5", 65);
  expect_refused(run("forward --model " + broken + " --input " + d + " --device cpu --output " + dir_.file("l.h5")),
                 broken + ": dataset 'model.norm.weight' of shape [" + std::to_string(hidden) + "] in chunks of [16]");
  EXPECT_FALSE(fs::exists(dir_.file("l.h5")));
}

// Ids stored through a filter this HDF5 cannot decode (h5py's lzf): named as such. At 6777ccb:
// "reading … failed (truncated file?)".
TEST_F(HostileFiles, UndecodableCompressionIsNamed) {
  const std::string ids = dir_.file("lzf.h5");
  write_chunked(ids, "input_ids", 4096, 512, 4096, H5T_STD_I32LE, true);
  const CommandResult r = run("eval-lm --model " + model() + " --data " + ids +
                              " --seq-len 64 --windows 1 --device cpu --out " + dir_.file("lm.json"));
  expect_refused(r, "is stored through HDF5 filter 32000 ('lzf')");
  EXPECT_EQ(r.output.find("truncated"), std::string::npos) << r.output;
}

// document_offsets = [0]: the message says what the file holds. At 6777ccb: "got 1 entries, -1 .. -1".
TEST_F(HostileFiles, OneEntryDocumentOffsetsAreNamed) {
  const std::string d = dir_.file("d.h5");
  write_token_data(d, random_tokens(4 * 64 + 1, 256, 2), {}, {0});
  expect_refused(run(train_args(dir_.file("out"))),
                 "document_offsets must run from 0 to the 257 tokens (got 1 entry: [0])");
}

// Token ids whose values live in another file — an external link, external raw storage, a virtual
// dataset — are refused: a file never makes hydra read another. At 6777ccb each was read (exit 0).
TEST_F(HostileFiles, ValuesInOtherFilesAreRefused) {
  const std::string source = tokens("source.h5", 4 * 64 + 1);
  const std::string m = model();
  const auto with = [&](const std::string& name, const std::function<void(hid_t)>& build) {
    const std::string path = dir_.file(name);
    const hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    build(f);
    H5Fclose(f);
    return path;
  };
  const hsize_t n = 4 * 64 + 1;
  const std::string link = with("link.h5", [&](hid_t f) {
    H5Lcreate_external(source.c_str(), "input_ids", f, "input_ids", H5P_DEFAULT, H5P_DEFAULT);
  });
  const std::string raw = dir_.file("ids.raw");
  {
    const std::vector<int32_t> ids = random_tokens(static_cast<int64_t>(n), 256, 4);
    std::ofstream(raw, std::ios::binary).write(reinterpret_cast<const char*>(ids.data()), static_cast<std::streamsize>(4 * n));
  }
  const std::string external = with("external.h5", [&](hid_t f) {
    const hid_t space = H5Screate_simple(1, &n, nullptr);
    const hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_external(dcpl, raw.c_str(), 0, 4 * n);
    H5Dclose(H5Dcreate2(f, "input_ids", H5T_STD_I32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT));
    H5Pclose(dcpl);
    H5Sclose(space);
  });
  const std::string vds = with("virtual.h5", [&](hid_t f) {
    const hid_t space = H5Screate_simple(1, &n, nullptr);
    const hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_virtual(dcpl, space, source.c_str(), "input_ids", space);
    H5Dclose(H5Dcreate2(f, "input_ids", H5T_STD_I32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT));
    H5Pclose(dcpl);
    H5Sclose(space);
  });
  for (const auto& [path, needle] : {std::pair{link, "'input_ids' is a link to another file"},
                                     std::pair{external, "dataset 'input_ids' keeps its values in other files"},
                                     std::pair{vds, "dataset 'input_ids' is a virtual dataset"}}) {
    SCOPED_TRACE(path);
    expect_refused(run("train --stage pretrain --model " + m + " --data " + path +
                       " --seq-len 64 --steps 1 --device cpu --out-dir " + dir_.file("out")),
                   path + ": " + needle);
  }
  EXPECT_FALSE(fs::exists(dir_.file("out/latest")));
}

}  // namespace
}  // namespace hydra::test
