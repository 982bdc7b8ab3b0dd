// Training windows read on demand: every window, flag and counted target equal to the
// whole-file reading (the reference below is the reader this replaced, kept here as the oracle);
// a rank's partial windows give exactly its rows; the read-ahead changes nothing; the content
// identity ignores what HDF5 writes around the data, names the dataset that differs, and its cache
// is reused only while the file is unchanged.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

#include <nlohmann/json.hpp>

#include "model/train/data.h"
#include "parallel/layout.h"
#include "runtime/content_hash.h"
#include "runtime/hdf5_file.h"
#include "runtime/random.h"
#include "runtime/token_file.h"
#include "runtime/token_identity.h"
#include "tests/common/test_util.h"

namespace hydra::train {
namespace {

using test::error_of;
using test::TempDir;

constexpr int64_t kVocab = 97;

struct Corpus {
  std::vector<int32_t> ids;
  std::vector<uint8_t> mask;
  std::vector<int64_t> offsets;
};

Corpus make_corpus(int64_t t, uint64_t seed, bool mask, bool documents) {
  const RandomStream rng{seed, 11};
  Corpus c;
  for (int64_t i = 0; i < t; ++i) c.ids.push_back(static_cast<int32_t>(rng.bits(static_cast<uint64_t>(i)) % kVocab));
  if (mask) {
    for (int64_t i = 0; i < t; ++i) c.mask.push_back(rng.bits(static_cast<uint64_t>(t + i)) % 10 < 7 ? 1 : 0);
  }
  if (documents) {
    c.offsets.push_back(0);
    for (uint64_t k = 0;; ++k) {
      const int64_t next = c.offsets.back() + 1 + static_cast<int64_t>(rng.bits(3 * static_cast<uint64_t>(t) + k) % 40);
      if (next >= t) break;
      c.offsets.push_back(next);
    }
    c.offsets.push_back(t);
  }
  return c;
}

// The reader this replaced: the whole file in memory, each window sliced from it.
Window reference_window(const TokenData& s, int64_t offset, int64_t len) {
  const auto slice = [&](const auto& v) {
    using V = std::decay_t<decltype(v)>;
    return v.empty() ? V{} : V(v.begin() + offset, v.begin() + offset + len + 1);
  };
  Window w{slice(s.ids), slice(s.loss_mask), slice(s.answer), {}};
  if (!s.document_offsets.empty()) {
    std::vector<int64_t> inside;
    const auto& o = s.document_offsets;
    for (auto it = std::upper_bound(o.begin(), o.end(), offset); it != o.end() && *it <= offset + len; ++it) {
      inside.push_back(*it - offset);
    }
    if (!inside.empty()) {
      w.counted = counted_within_documents(w.counted, len + 1, inside);
      w.document_starts.push_back(0);
      for (int64_t b : inside)
        if (b < len) w.document_starts.push_back(b);
      if (w.document_starts.size() == 1) w.document_starts.clear();
    }
  }
  return w;
}

void expect_same(const Window& a, const Window& b, const std::string& what) {
  EXPECT_EQ(a.ids, b.ids) << what;
  EXPECT_EQ(a.counted, b.counted) << what;
  EXPECT_EQ(a.answer, b.answer) << what;
  EXPECT_EQ(a.document_starts, b.document_starts) << what;
}

// A file with answer spans besides (as hydra synth writes them).
void add_answers(const std::string& path, int64_t t) {
  // Rewritten whole: H5File creates; the datasets of write_token_data first.
  const TokenData d = read_token_data(path, kVocab);
  H5File f = H5File::create(path + ".tmp");
  f.write("input_ids", TensorView(const_cast<int32_t*>(d.ids.data()), DType::i32, Device::host, {t}));
  if (!d.loss_mask.empty()) f.write_uint8("loss_mask", d.loss_mask);
  std::vector<int64_t> start, length;
  for (int64_t s = 5; s + 3 < t; s += 37) {
    start.push_back(s);
    length.push_back(1 + s % 3);
  }
  start.push_back(6);  // overlapping the first: spans may overlap
  length.push_back(4);
  f.write("answer_start", TensorView(start.data(), DType::i64, Device::host, {static_cast<int64_t>(start.size())}));
  f.write("answer_length", TensorView(length.data(), DType::i64, Device::host, {static_cast<int64_t>(length.size())}));
  f.close();
  std::filesystem::rename(path + ".tmp", path);
}

TEST(TokenWindows, EqualTheWholeFileReading) {
  TempDir dir;
  const int64_t len = 16;
  struct Case {
    std::string name;
    bool mask, documents, answers;
    int64_t t;
  };
  for (const Case& k : {Case{"plain", false, false, false, 1000}, Case{"mask", true, false, false, 1001},
                        Case{"documents", false, true, false, 999}, Case{"mask_documents", true, true, false, 1234},
                        Case{"answers", true, false, true, 777}}) {
    const Corpus c = make_corpus(k.t, 3, k.mask, k.documents);
    const std::string path = dir.file(k.name + ".h5");
    write_token_data(path, c.ids, c.mask, c.offsets);
    if (k.answers) add_answers(path, k.t);
    const TokenData whole = read_token_data(path, kVocab);
    const TokenWindows windows({path}, len, 5, kVocab);
    ASSERT_EQ(windows.count(), (k.t - 1) / len) << k.name;
    for (int64_t i = 0; i < windows.count(); ++i) {
      const Window ref = reference_window(whole, i * len, len);
      expect_same(windows.window_in_order(i), ref, k.name + " window " + std::to_string(i));
      const int64_t counted = ref.counted.empty() ? len : std::count(ref.counted.begin() + 1, ref.counted.end(), 1);
      EXPECT_EQ(windows.counted_targets_in_order(i), counted) << k.name << " window " << i;
    }
  }
}

TEST(TokenWindows, SeveralFilesAndTheirOrder) {
  TempDir dir;
  const Corpus a = make_corpus(300, 1, true, true), b = make_corpus(170, 2, false, false);
  write_token_data(dir.file("a.h5"), a.ids, a.mask, a.offsets);
  write_token_data(dir.file("b.h5"), b.ids, {}, {});
  const TokenWindows w({dir.file("a.h5"), dir.file("b.h5")}, 8, 9, kVocab);
  EXPECT_EQ(w.count(), 299 / 8 + 169 / 8);
  EXPECT_EQ(w.tokens(), 470);
  EXPECT_TRUE(w.masked());
  // Each epoch visits every window once.
  for (int64_t e = 0; e < 2; ++e) {
    std::vector<int64_t> seen;
    for (int64_t i = 0; i < w.count(); ++i) seen.push_back(w.index_of(e * w.count() + i));
    std::sort(seen.begin(), seen.end());
    for (int64_t i = 0; i < w.count(); ++i) EXPECT_EQ(seen[static_cast<size_t>(i)], i);
  }
  // Window 299/8 is b's first.
  EXPECT_EQ(w.window_in_order(299 / 8).ids, std::vector<int32_t>(b.ids.begin(), b.ids.begin() + 9));
}

// A mask stored as int64 (older writers) is read through HDF5 hyperslabs: the same windows.
TEST(TokenWindows, WideMaskReadsThroughHdf5) {
  TempDir dir;
  const Corpus c = make_corpus(500, 4, true, true);
  write_token_data(dir.file("narrow.h5"), c.ids, c.mask, c.offsets);
  {
    H5File f = H5File::create(dir.file("wide.h5"));
    f.write("input_ids", TensorView(const_cast<int32_t*>(c.ids.data()), DType::i32, Device::host, {500}));
    std::vector<int64_t> wide(c.mask.begin(), c.mask.end());
    f.write("loss_mask", TensorView(wide.data(), DType::i64, Device::host, {500}));
    f.write("document_offsets", TensorView(const_cast<int64_t*>(c.offsets.data()), DType::i64, Device::host,
                                           {static_cast<int64_t>(c.offsets.size())}));
    f.close();
  }
  const TokenWindows narrow({dir.file("narrow.h5")}, 12, 0, kVocab), wide({dir.file("wide.h5")}, 12, 0, kVocab);
  EXPECT_TRUE(narrow.reads_on_any_thread());
  EXPECT_FALSE(wide.reads_on_any_thread());
  for (int64_t i = 0; i < narrow.count(); ++i) {
    expect_same(wide.window_in_order(i), narrow.window_in_order(i), "window " + std::to_string(i));
    EXPECT_EQ(wide.counted_targets_in_order(i), narrow.counted_targets_in_order(i));
  }
}

TEST(TokenWindows, BadValuesNameTheFileAndPosition) {
  TempDir dir;
  Corpus c = make_corpus(200, 5, true, false);
  c.ids[150] = static_cast<int32_t>(kVocab);
  write_token_data(dir.file("ids.h5"), c.ids, {}, {});
  const TokenWindows w({dir.file("ids.h5")}, 10, 0, kVocab);  // ids are checked where read
  EXPECT_NE(error_of([&] { w.window_in_order(14); }).find("token id 97 at position 150"), std::string::npos)
      << error_of([&] { w.window_in_order(14); });
  c.ids[150] = 0;
  c.mask[33] = 2;
  write_token_data(dir.file("mask.h5"), c.ids, c.mask, {});
  EXPECT_NE(error_of([&] { TokenWindows({dir.file("mask.h5")}, 10, 0, kVocab); }).find("loss_mask[33] is 2"),
            std::string::npos);
  write_token_data(dir.file("docs.h5"), c.ids, {}, {0, 50, 40, 200});
  EXPECT_NE(error_of([&] { TokenWindows({dir.file("docs.h5")}, 10, 0, kVocab); }).find("document_offsets[2] = 40"),
            std::string::npos);
}

// Each rank's rows of a packed micro-batch from its partial windows equal its rows of the whole
// windows, for every sequence-group size and rank; the read-ahead returns the same windows.
TEST(StepWindows, RanksReadOnlyTheirRowsAndTheSameRows) {
  TempDir dir;
  const Corpus c = make_corpus(5000, 6, true, true);
  write_token_data(dir.file("d.h5"), c.ids, c.mask, c.offsets);
  const int64_t len = 24, batch = 3, accum = 2, replicas = 2;
  const TokenWindows data({dir.file("d.h5")}, len, 1, kVocab);
  for (int sp : {1, 2, 3}) {
    for (int r = 0; r < sp; ++r) {
      for (int64_t replica = 0; replica < replicas; ++replica) {
        StepWindows reader(data, {.batch_seqs = batch, .grad_accum = accum, .replicas = replicas, .replica = replica,
                                  .sp = sp, .sp_rank = r});
        const int64_t per_step = batch * accum * replicas;
        for (int64_t step = 0; step < 4; ++step) {
          const int64_t position = step * per_step;
          const auto batches = reader.take(position, step < 3 ? position + per_step : -1);
          ASSERT_EQ(static_cast<int64_t>(batches.size()), accum);
          for (int64_t m = 0; m < accum; ++m) {
            std::vector<Window> whole;
            for (int64_t b = 0; b < batch; ++b) whole.push_back(data.window(position + (m * batch + b) * replicas + replica));
            const PackedBatch pw = pack_windows(whole), pp = pack_windows(batches[static_cast<size_t>(m)]);
            EXPECT_EQ(pw.document_starts, pp.document_starts);
            const SequenceLayout layout = SequenceLayout::zigzag(batch * len, sp, r, pw.document_starts);
            const TokenRows a = layout.rows_of(pw.ids, pw.targets, pw.answer), b = layout.rows_of(pp.ids, pp.targets, pp.answer);
            const std::string what = fmt::format("sp {} rank {} replica {} step {} micro-batch {}", sp, r, replica, step, m);
            ASSERT_EQ(a.ids.numel(), b.ids.numel()) << what;
            for (int64_t i = 0; i < a.ids.numel(); ++i) {
              ASSERT_EQ(a.ids.data_as<int32_t>()[i], b.ids.data_as<int32_t>()[i]) << what << " row " << i;
              ASSERT_EQ(a.targets.data_as<int32_t>()[i], b.targets.data_as<int32_t>()[i]) << what << " row " << i;
            }
          }
        }
        // A position other than the one read ahead (a skipped step) is read on the spot.
        const auto again = reader.take(0, -1);
        EXPECT_EQ(again.size(), static_cast<size_t>(accum));
      }
    }
  }
}

TEST(Blend, ParsesWeights) {
  const std::vector<DataSource> s = parse_data_sources("a.h5:0.7, b.h5 ,c:d.h5:0.1,e.h5:x", "--data");
  ASSERT_EQ(s.size(), 4u);
  EXPECT_EQ(s[0].path, "a.h5");
  EXPECT_DOUBLE_EQ(s[0].weight, 0.7);
  EXPECT_EQ(s[1].path, "b.h5");
  EXPECT_EQ(s[1].weight, -1);
  EXPECT_EQ(s[2].path, "c:d.h5");  // a path may hold ':'
  EXPECT_DOUBLE_EQ(s[2].weight, 0.1);
  EXPECT_EQ(s[3].path, "e.h5:x");  // not a number: part of the path
  EXPECT_NE(error_of([] { parse_data_sources("a.h5:0", "--data"); }).find("must be a positive number"), std::string::npos);
  EXPECT_NE(error_of([] { parse_data_sources("a.h5:-2", "--data"); }).find("must be a positive number"), std::string::npos);
}

// Three files of different sizes: every 1,000 consecutive windows follow the weights within 1%,
// each file runs through whole epochs of its own windows, the draws are a function of the position
// (a fresh reader and a jump back agree) and drawn() counts them.
TEST(Blend, FollowsTheWeightsAndEachFileItsOwnEpochs) {
  TempDir dir;
  const int64_t len = 8;
  const std::vector<int64_t> sizes{801, 161, 3201};  // 100, 20 and 400 windows
  std::vector<DataSource> sources;
  for (size_t f = 0; f < sizes.size(); ++f) {
    const Corpus c = make_corpus(sizes[f], 20 + f, false, false);
    write_token_data(dir.file(fmt::format("f{}.h5", f)), c.ids, {}, {});
    sources.push_back({dir.file(fmt::format("f{}.h5", f)), f == 0 ? 0.5 : f == 1 ? 0.3 : -1});
  }
  const TokenWindows w(sources, len, 4, kVocab);
  ASSERT_TRUE(w.blended());
  EXPECT_NEAR(w.weights()[2], 0.2, 1e-12);  // the weight the others leave
  const int64_t n = 20000;
  std::vector<int64_t> file_of_draw, index;
  for (int64_t i = 0; i < n; ++i) {
    index.push_back(w.index_of(i));
    file_of_draw.push_back(index.back() < 100 ? 0 : index.back() < 120 ? 1 : 2);
  }
  for (int64_t a = 0; a + 1000 <= n; a += 50) {
    for (int64_t f = 0; f < 3; ++f) {
      const int64_t k = std::count(file_of_draw.begin() + a, file_of_draw.begin() + a + 1000, f);
      ASSERT_NEAR(static_cast<double>(k) / 1000.0, w.weights()[static_cast<size_t>(f)], 0.01) << "windows " << a << " file " << f;
    }
  }
  // File 1 (20 windows, 30%) exhausts first: its draws come in epochs of all its 20 windows.
  std::vector<int64_t> ones;
  for (int64_t i = 0; i < n; ++i)
    if (file_of_draw[static_cast<size_t>(i)] == 1) ones.push_back(index[static_cast<size_t>(i)]);
  for (size_t e = 0; e + 20 <= ones.size(); e += 20) {
    std::vector<int64_t> epoch(ones.begin() + static_cast<std::ptrdiff_t>(e), ones.begin() + static_cast<std::ptrdiff_t>(e + 20));
    std::sort(epoch.begin(), epoch.end());
    for (int64_t k = 0; k < 20; ++k) ASSERT_EQ(epoch[static_cast<size_t>(k)], 100 + k) << "epoch " << e / 20;
  }
  EXPECT_NE(std::vector<int64_t>(ones.begin(), ones.begin() + 20), std::vector<int64_t>(ones.begin() + 20, ones.begin() + 40));
  // A fresh reader, asked out of order (a resume, the read-ahead), draws the same windows.
  const TokenWindows again(sources, len, 4, kVocab);
  for (int64_t i : {int64_t{19999}, int64_t{5}, int64_t{300000}, int64_t{12345}}) {
    if (i < n) EXPECT_EQ(again.index_of(i), index[static_cast<size_t>(i)]) << i;
  }
  EXPECT_EQ(again.index_of(299999) >= 0, true);
  EXPECT_EQ(again.index_of(7), index[7]);
  const std::vector<int64_t> drawn = w.drawn(12345);
  for (int64_t f = 0; f < 3; ++f) {
    EXPECT_EQ(drawn[static_cast<size_t>(f)], std::count(file_of_draw.begin(), file_of_draw.begin() + 12345, f));
  }
  // Another seed, another order within the files; the same shares.
  const TokenWindows other(sources, len, 5, kVocab);
  int64_t same = 0;
  for (int64_t i = 0; i < 1000; ++i) same += other.index_of(i) == index[static_cast<size_t>(i)] ? 1 : 0;
  EXPECT_LT(same, 100);
  // Weights that leave nothing for a file without one.
  sources[0].weight = 0.8;
  sources[1].weight = 0.3;
  EXPECT_NE(error_of([&] { TokenWindows(sources, len, 4, kVocab); }).find("leaving nothing"), std::string::npos);
}

// A corpus is a folder of shards (cluster/tokenize_text.py's manifest.json, names relative to it):
// `--data web/:0.7,code/manifest.json:0.3` blends the two corpora by their weights, each pooling its
// shards' windows, and the draws are counted per corpus (data_shares, data_state).
TEST(Corpora, FoldersAndManifestsBlendByCorpus) {
  TempDir dir;
  const int64_t len = 8;
  const auto folder = [&](const std::string& name, const std::vector<int64_t>& sizes, uint64_t seed) {
    std::filesystem::create_directories(dir.file(name));
    nlohmann::json shards = nlohmann::json::array();
    for (size_t k = 0; k < sizes.size(); ++k) {
      const std::string shard = fmt::format("shard-00000-{:04d}.h5", k);
      write_token_data(dir.file(name + "/" + shard), make_corpus(sizes[k], seed + k, false, false).ids, {}, {});
      shards.push_back(shard);
    }
    std::ofstream(dir.file(name + "/manifest.json")) << nlohmann::json{{"shards", shards}}.dump();
  };
  folder("web", {161, 81, 241}, 1);  // 20 + 10 + 30 windows
  folder("code", {401}, 9);          // 50 windows
  const std::vector<DataSource> s =
      parse_data_sources(dir.file("web") + ":0.7," + dir.file("code/manifest.json") + ":0.3", "--data");
  ASSERT_EQ(s.size(), 4u);
  EXPECT_EQ(s[0].path, dir.file("web/shard-00000-0000.h5"));
  EXPECT_EQ(s[2].path, dir.file("web/shard-00000-0002.h5"));
  EXPECT_EQ(s[0].corpus, dir.file("web"));
  EXPECT_EQ(s[3].corpus, dir.file("code/manifest.json"));
  EXPECT_DOUBLE_EQ(s[1].weight, 0.7);
  EXPECT_DOUBLE_EQ(s[3].weight, 0.3);
  const auto groups = corpora_of(s);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].second.size(), 3u);
  const TokenWindows w(s, len, 4, kVocab);
  ASSERT_TRUE(w.blended());
  ASSERT_EQ(w.corpora(), 2);
  EXPECT_EQ(w.corpus_name(0), dir.file("web"));
  EXPECT_DOUBLE_EQ(w.weights()[0], 0.7);
  // Windows 0..59 are web's three shards, 60..109 code's: the draws follow 0.7 / 0.3, web's epochs
  // visit all 60 of its windows (all three shards), and drawn() counts per corpus.
  const int64_t n = 1200;
  int64_t web = 0;
  std::vector<int64_t> web_epoch;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t k = w.index_of(i);
    if (k < 60) {
      ++web;
      if (web_epoch.size() < 60) web_epoch.push_back(k);
    }
  }
  EXPECT_NEAR(static_cast<double>(web) / n, 0.7, 0.002);
  std::sort(web_epoch.begin(), web_epoch.end());
  for (int64_t k = 0; k < 60; ++k) ASSERT_EQ(web_epoch[static_cast<size_t>(k)], k);
  EXPECT_EQ(w.drawn(n), (std::vector<int64_t>{web, n - web}));
  // Without weights: the corpora's windows pooled, as files are.
  const TokenWindows pooled(parse_data_sources(dir.file("web") + "," + dir.file("code"), "--data"), len, 4, kVocab);
  EXPECT_FALSE(pooled.blended());
  EXPECT_EQ(pooled.count(), 110);
}

// Nothing in a manifest makes hydra read outside its folder: absolute paths, subfolders, "..", a
// link that leaves the folder; an older manifest (paths relative to where the tokenizer ran) is
// named as such. Each a one-line error naming the entry.
TEST(Corpora, ManifestNamesStayInTheirFolder) {
  TempDir dir;
  std::filesystem::create_directories(dir.file("c/sub"));
  write_token_data(dir.file("outside.h5"), make_corpus(100, 1, false, false).ids, {}, {});
  write_token_data(dir.file("c/sub/inner.h5"), make_corpus(100, 1, false, false).ids, {}, {});
  std::filesystem::create_symlink(dir.file("outside.h5"), dir.file("c/link.h5"));
  const auto refused = [&](const nlohmann::json& shards) {
    std::ofstream(dir.file("c/manifest.json")) << nlohmann::json{{"shards", shards}}.dump();
    return error_of([&] { parse_data_sources(dir.file("c"), "--data"); });
  };
  for (const std::string& bad : {dir.file("outside.h5"), std::string("../outside.h5"), std::string("sub/inner.h5"),
                                 std::string(".."), std::string("")}) {
    const std::string e = refused(nlohmann::json::array({bad}));
    EXPECT_NE(e.find("is not a plain file name in the manifest's folder"), std::string::npos) << bad << ": " << e;
    EXPECT_NE(e.find("'" + bad + "'"), std::string::npos) << e;
  }
  EXPECT_NE(refused(nlohmann::json::array({"link.h5"})).find("resolves to " + std::filesystem::canonical(dir.file("outside.h5")).string() + ", outside"),
            std::string::npos);
  EXPECT_NE(refused(nlohmann::json::array({5})).find("not a file name"), std::string::npos);
  EXPECT_NE(refused(nlohmann::json::array()).find("not a token-shard manifest"), std::string::npos);
  EXPECT_NE(error_of([&] { parse_data_sources(dir.file("c/sub"), "--data"); }).find("no readable"), std::string::npos);
}

TEST(TokenIdentity, EqualContentsAgreeWhateverHdf5Wrote) {
  TempDir dir;
  const Corpus c = make_corpus(3000, 7, true, true);
  write_token_data(dir.file("a.h5"), c.ids, c.mask, c.offsets);
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));  // other HDF5 object timestamps
  write_token_data(dir.file("b.h5"), c.ids, c.mask, c.offsets);
  const TokenFileIdentity a = compute_token_file_identity(dir.file("a.h5")), b = compute_token_file_identity(dir.file("b.h5"));
  EXPECT_EQ(a.fingerprint, b.fingerprint);
  EXPECT_EQ(a.tokens, 3000);
  EXPECT_EQ(a.min_id, *std::min_element(c.ids.begin(), c.ids.end()));
  EXPECT_EQ(a.max_id, *std::max_element(c.ids.begin(), c.ids.end()));
  EXPECT_EQ(token_file_sample(dir.file("a.h5")), token_file_sample(dir.file("b.h5")));
  // One mask value changed: the identity names loss_mask, and only it.
  Corpus d = c;
  d.mask[2999] ^= 1;
  write_token_data(dir.file("c.h5"), d.ids, d.mask, d.offsets);
  const TokenFileIdentity m = compute_token_file_identity(dir.file("c.h5"));
  EXPECT_EQ(token_identity_difference(a.fingerprint, m.fingerprint), "loss_mask");
  EXPECT_NE(token_file_sample(dir.file("a.h5")), token_file_sample(dir.file("c.h5")));  // the last window is sampled
  // Without documents: document_offsets differ (absent), the ids do not.
  write_token_data(dir.file("e.h5"), c.ids, c.mask, {});
  EXPECT_EQ(token_identity_difference(a.fingerprint, compute_token_file_identity(dir.file("e.h5")).fingerprint),
            "document_offsets");
}

TEST(TokenIdentity, CacheIsReusedOnlyWhileTheFileIsUnchanged) {
  TempDir dir;
  set_token_identity_cache_dir(dir.file("cache"));
  const Corpus c = make_corpus(2000, 8, false, false);
  write_token_data(dir.file("a.h5"), c.ids, {}, {});
  bool reused = true;
  const TokenFileIdentity first = token_file_identity(dir.file("a.h5"), &reused);
  EXPECT_FALSE(reused);
  const TokenFileIdentity second = token_file_identity(dir.file("a.h5"), &reused);
  EXPECT_TRUE(reused);
  EXPECT_EQ(first.fingerprint, second.fingerprint);
  EXPECT_EQ(second.max_id, first.max_id);
  // Other contents under the same path (written anew, then its mtime set back): recomputed.
  Corpus d = c;
  d.ids[7] = (d.ids[7] + 1) % kVocab;
  struct stat before {};
  ASSERT_EQ(stat(dir.file("a.h5").c_str(), &before), 0);
  write_token_data(dir.file("a.h5"), d.ids, {}, {});
  const std::filesystem::file_time_type old = std::filesystem::last_write_time(dir.file("a.h5"));
  std::filesystem::last_write_time(dir.file("a.h5"), old - std::chrono::hours(1));
  const TokenFileIdentity third = token_file_identity(dir.file("a.h5"), &reused);
  EXPECT_FALSE(reused);
  EXPECT_EQ(token_identity_difference(first.fingerprint, third.fingerprint), "input_ids");
  // The byte hash of a file (the model's), cached the same way.
  const uint64_t bytes = cached_file_hash(dir.file("a.h5"), &reused);
  EXPECT_FALSE(reused);
  EXPECT_EQ(bytes, hash_file(dir.file("a.h5")));
  EXPECT_EQ(cached_file_hash(dir.file("a.h5"), &reused), bytes);
  EXPECT_TRUE(reused);
  write_token_data(dir.file("a.h5"), c.ids, {}, {});
  std::filesystem::last_write_time(dir.file("a.h5"), old - std::chrono::hours(2));
  EXPECT_EQ(cached_file_hash(dir.file("a.h5"), &reused), hash_file(dir.file("a.h5")));
  EXPECT_FALSE(reused);
  set_token_identity_cache_dir("");
}

// The window index from one streamed pass: equal whatever the block size (blocks that cut windows and
// fall on document starts), and the hooks see the mask and the offsets exactly once, in order.
TEST(TokenIdentity, WindowCountsAreTheSameInAnyBlocksAndTheHooksSeeEveryValueOnce) {
  TempDir dir;
  const Corpus c = make_corpus(1234, 9, true, true);
  write_token_data(dir.file("a.h5"), c.ids, c.mask, c.offsets);
  const TokenReader reader(dir.file("a.h5"), kVocab);
  const TokenWindows windows({dir.file("a.h5")}, 16, 5, kVocab);
  for (const int64_t block : {int64_t{1}, int64_t{7}, int64_t{16}, int64_t{17}, int64_t{1000}, int64_t{1} << 24}) {
    std::vector<uint8_t> mask;
    std::vector<int64_t> offsets;
    TokenFlagHooks hooks;
    hooks.mask = [&](std::span<const uint8_t> m) { mask.insert(mask.end(), m.begin(), m.end()); };
    hooks.offsets = [&](std::span<const int64_t> o) { offsets.insert(offsets.end(), o.begin(), o.end()); };
    const std::vector<int32_t> counted = count_window_targets(reader, 16, hooks, block);
    ASSERT_EQ(static_cast<int64_t>(counted.size()), windows.count()) << "blocks of " << block;
    for (int64_t i = 0; i < windows.count(); ++i) {
      EXPECT_EQ(counted[static_cast<size_t>(i)], windows.counted_targets_in_order(i)) << "blocks of " << block << ", window " << i;
    }
    EXPECT_EQ(mask, c.mask) << "blocks of " << block;
    EXPECT_EQ(offsets, c.offsets) << "blocks of " << block;
  }
}

// A first start reads the file once: the identity's pass leaves the window index of the run's
// --seq-len in the cache, equal to a count of its own, and the loader takes it from there (an entry
// doctored within range is what the loader reports: it did not count again).
TEST(TokenIdentity, IdentityPassCachesTheWindowIndexTheLoaderUses) {
  TempDir dir;
  set_token_identity_cache_dir(dir.file("cache"));
  const Corpus c = make_corpus(2000, 10, true, true);
  write_token_data(dir.file("a.h5"), c.ids, c.mask, c.offsets);
  bool reused = true;
  const TokenFileIdentity id = token_file_identity(dir.file("a.h5"), &reused, 16);
  EXPECT_FALSE(reused);
  const int64_t nw = (2000 - 1) / 16;
  const std::optional<std::vector<int32_t>> cached = load_window_index(id.fingerprint, 16, nw);
  ASSERT_TRUE(cached.has_value());
  EXPECT_EQ(*cached, count_window_targets(TokenReader(dir.file("a.h5"), kVocab), 16));
  EXPECT_FALSE(load_window_index(id.fingerprint, 32, (2000 - 1) / 32).has_value());  // only the length asked for
  std::vector<int32_t> doctored = *cached;
  doctored[3] = doctored[3] == 0 ? 1 : 0;
  store_window_index(id.fingerprint, 16, doctored, "a.h5");
  const TokenWindows loader(std::vector<DataSource>{{dir.file("a.h5"), -1.0, id.fingerprint}}, 16, 5, kVocab, false);
  EXPECT_EQ(loader.counted_targets_in_order(3), doctored[3]);
  EXPECT_EQ(loader.counted_targets_in_order(4), (*cached)[4]);
  set_token_identity_cache_dir("");
}

}  // namespace
}  // namespace hydra::train
