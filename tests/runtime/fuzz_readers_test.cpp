// Seeded mutation fuzzing of every reader of user files: checkpoints (HDF5, and the config JSON inside
// them), token files, NIAH eval sets, FA head-set files, safetensors files and HF checkpoint folders
// (config.json). Each reader gets a small valid input written here and a fixed number of mutants of
// it: truncated, with random bits flipped, with an "interesting" integer (0, −1, 2^31, 2^62, 2^63 − 1,
// ...) written over 1/2/4/8 bytes at a random offset, and for JSON inputs with a number or a value
// replaced by one that is too large, negative, fractional or of the wrong type. The only outcomes
// allowed are success and a hydra::UserError; anything else (an internal error, a JSON library
// exception, bad_alloc, a crash, a sanitizer report) fails the test, naming the mutant so that it can
// be replayed (same seed, same index).
//
// Deterministic: the mutants are a function of (reader, index) alone. Bounded: the counts below keep
// the whole suite under a minute on 2 cores in a sanitizer build; HYDRA_FUZZ_SCALE multiplies them
// for a longer local run, HYDRA_FUZZ_TRACE=1 prints every mutant's index before it is read.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>

#include "model/fa_heads_file.h"
#include "model/hf_export.h"
#include "model/hf_import.h"
#include "model/model.h"
#include "model/eval/niah_set.h"
#include "model/params.h"
#include "runtime/safetensors.h"
#include "runtime/token_file.h"
#include "tests/common/test_util.h"

namespace hydra::test {
namespace {

namespace fs = std::filesystem;
using Bytes = std::string;

Bytes read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), {});
}
void write_all(const std::string& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

int scale() {
  const char* s = std::getenv("HYDRA_FUZZ_SCALE");
  return s ? std::max(1, std::atoi(s)) : 1;
}

// A model small enough to read thousands of times: 1 layer, mixed FA/GDN heads.
ModelConfig fuzz_config(Arch arch) {
  ModelConfig c;
  c.arch = arch;
  c.vocab_size = 16;
  c.hidden_size = 8;
  c.num_layers = 1;
  c.num_heads = 2;
  c.num_kv_heads = 1;
  c.head_dim = 4;
  c.intermediate_size = 8;
  c.rope_theta = 10000;
  if (arch == Arch::hydrahead) c.fa_heads = {{1}};
  return c;
}

constexpr int64_t kInteresting[] = {0,
                                    1,
                                    -1,
                                    2,
                                    127,
                                    128,
                                    255,
                                    32767,
                                    65535,
                                    INT32_MAX,
                                    int64_t{1} << 31,
                                    int64_t{1} << 32,
                                    int64_t{1} << 48,
                                    int64_t{1} << 62,
                                    INT64_MAX,
                                    INT64_MIN};
const char* const kInterestingJson[] = {"1e300",
                                        "-48",
                                        "1e7",
                                        "0",
                                        "-1",
                                        "9223372036854775807",
                                        "18446744073709551615",
                                        "-9223372036854775808",
                                        "1.5",
                                        "\"x\"",
                                        "null",
                                        "[]",
                                        "{}",
                                        "true",
                                        "[-48]",
                                        "[[99]]",
                                        "4611686018427387904",
                                        "1e-300",
                                        "[1e300, 2]"};

// One mutant of `seed` for mutation index `i` (the generator is seeded by `stream` and `i`).
Bytes mutate_bytes(const Bytes& seed, uint64_t stream, int i) {
  std::mt19937_64 rng(stream * 1000003u + static_cast<uint64_t>(i));
  Bytes b = seed;
  switch (i % 3) {
    case 0:  // truncation
      b.resize(static_cast<size_t>(rng() % std::max<size_t>(1, seed.size())));
      break;
    case 1: {  // 1..8 bit flips
      const int flips = 1 + static_cast<int>(rng() % 8);
      for (int k = 0; k < flips && !b.empty(); ++k) b[rng() % b.size()] ^= static_cast<char>(1u << (rng() % 8));
      break;
    }
    default: {  // an interesting integer over 1, 2, 4 or 8 bytes
      const size_t width = size_t{1} << (rng() % 4);
      if (b.size() < width) break;
      const size_t at = (rng() % (b.size() - width + 1)) & ~(width - 1);
      const int64_t v = kInteresting[rng() % std::size(kInteresting)];
      for (size_t k = 0; k < width; ++k) b[at + k] = static_cast<char>((static_cast<uint64_t>(v) >> (8 * k)) & 0xff);
    }
  }
  return b;
}

// JSON text mutants: a value replaced by an interesting one, a span deleted or duplicated, or a
// byte-level mutation.
Bytes mutate_json(const Bytes& seed, uint64_t stream, int i) {
  std::mt19937_64 rng(stream * 1000003u + static_cast<uint64_t>(i) + 7);
  if (i % 4 == 3) return mutate_bytes(seed, stream, i / 4);
  Bytes b = seed;
  if (i % 4 == 2) {
    const size_t at = rng() % b.size(), len = 1 + rng() % 16;
    if (rng() % 2) {
      b.erase(at, len);
    } else {
      b.insert(at, b.substr(at, len));
    }
    return b;
  }
  // A value: the characters after a ':' or ',' or '[' up to the next ',', '}' or ']'.
  std::vector<size_t> starts;
  for (size_t k = 0; k < b.size(); ++k) {
    if (b[k] == ':' || b[k] == ',' || b[k] == '[') starts.push_back(k + 1);
  }
  if (starts.empty()) return b;
  const size_t start = starts[rng() % starts.size()];
  size_t end = start;
  int depth = 0;
  while (end < b.size() && (depth > 0 || (b[end] != ',' && b[end] != '}' && b[end] != ']'))) {
    depth += b[end] == '[' || b[end] == '{' ? 1 : b[end] == ']' || b[end] == '}' ? -1 : 0;
    ++end;
  }
  return b.substr(0, start) + kInterestingJson[rng() % std::size(kInterestingJson)] + b.substr(end);
}

struct Outcome {
  int ok = 0, user_errors = 0;
  std::vector<std::string> failures;
};

// Runs `read` on `count` mutants written to `path`; records what each raised.
Outcome fuzz(const std::string& path, const Bytes& seed, uint64_t stream, int count, bool json,
             const std::function<void()>& read) {
  Outcome out;
  const bool trace = std::getenv("HYDRA_FUZZ_TRACE") != nullptr;  // prints each mutant's index first (crashes)
  for (int i = 0; i < count * scale(); ++i) {
    if (trace) std::fprintf(stderr, "[ fuzz ] stream %llu mutant %d\n", static_cast<unsigned long long>(stream), i);
    write_all(path, json ? mutate_json(seed, stream, i) : mutate_bytes(seed, stream, i));
    try {
      read();
      ++out.ok;
    } catch (const UserError&) {
      ++out.user_errors;
    } catch (const std::exception& e) {
      if (out.failures.size() < 8)
        out.failures.push_back(fmt::format("mutant {} of stream {}: {}", i, stream, e.what()));
    }
  }
  return out;
}

void expect_clean(const Outcome& o, const char* what) {
  EXPECT_TRUE(o.failures.empty()) << what << ": " << o.failures.size() << "+ mutants ended with something other than a "
                                  << "UserError; first: " << (o.failures.empty() ? "" : o.failures.front());
  for (const std::string& f : o.failures) ADD_FAILURE() << what << ": " << f;
  EXPECT_GT(o.user_errors, 0) << what << ": no mutant was refused (is the fuzzer mutating anything?)";
  std::printf("[ fuzz ] %-14s %5d mutants: %5d read, %5d refused with a user error\n", what, o.ok + o.user_errors, o.ok,
              o.user_errors);
}

class FuzzReaders : public ::testing::Test {
 protected:
  TempDir dir_;
};

TEST_F(FuzzReaders, Checkpoint) {
  const ModelConfig c = fuzz_config(Arch::hydrahead);
  const std::string seed_path = dir_.file("seed.h5"), path = dir_.file("m.h5");
  write_model_checkpoint(seed_path, c, random_parameters(c, 1));
  const Bytes seed = read_all(seed_path);
  expect_clean(fuzz(path, seed, 1, 1500, false, [&] { read_model_checkpoint(path); }), "checkpoint");
}

TEST_F(FuzzReaders, CheckpointConfigJson) {
  // The config attribute's JSON, mutated as text, inside an otherwise valid checkpoint.
  const ModelConfig c = fuzz_config(Arch::hydrahead);
  const NamedTensors params = random_parameters(c, 2);
  const Bytes seed = config_to_json(c).dump();
  const std::string text = dir_.file("config.json"), path = dir_.file("m.h5");
  expect_clean(fuzz(text, seed, 2, 600, true,
                    [&] {
                      write_checkpoint(path, read_all(text), params);
                      read_model_checkpoint(path);
                    }),
               "config JSON");
}

TEST_F(FuzzReaders, TokenFile) {
  const std::string seed_path = dir_.file("seed.h5"), path = dir_.file("t.h5");
  std::vector<int32_t> ids(32);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i % 16);
  write_token_file(seed_path, ids);
  expect_clean(fuzz(path, read_all(seed_path), 3, 1500, false, [&] { read_token_file(path, 16); }), "token file");
}

TEST_F(FuzzReaders, EvalSet) {
  niah::EvalSet set;
  set.task = "single";
  for (int s = 0; s < 2; ++s) {
    niah::Sample sample;
    sample.length = 16;
    sample.depth = 50 * s;
    sample.index = 0;
    for (int t = 0; t < 16; ++t) sample.ids.push_back((t * 5 + s) % 16);
    sample.answer_start = 14;
    sample.answer_length = 2;
    sample.needle_position = 3;
    set.samples.push_back(sample);
  }
  const std::string seed_path = dir_.file("seed.h5"), path = dir_.file("s.h5");
  niah::write_eval_set(seed_path, set);
  expect_clean(fuzz(path, read_all(seed_path), 4, 1500, false, [&] { niah::read_eval_set(path, 16); }), "eval set");
}

TEST_F(FuzzReaders, HeadSetFile) {
  const ModelConfig teacher = fuzz_config(Arch::qwen3);
  FaHeadsFile f;
  f.fa_heads = {{0}};
  f.scores["composite"] = {{0.5, 0.25}};
  f.selection_json = R"({"budget": 1})";
  const std::string seed_path = dir_.file("seed.json"), path = dir_.file("heads.json");
  write_fa_heads_file(seed_path, teacher, f);
  expect_clean(fuzz(path, read_all(seed_path), 5, 1500, true,
                    [&] {
                      read_fa_heads_file(path, teacher);
                      resolve_fa_heads("uniform:1", teacher, path);
                    }),
               "head-set file");
}

// A safetensors file of the tiny teacher's tensors (F32), written by hand: length, JSON header, data.
Bytes safetensors_of(const NamedTensors& tensors) {
  nlohmann::json header = nlohmann::json::object();
  Bytes data;
  for (const auto& [name, t] : tensors) {
    std::vector<int64_t> shape(t.shape().begin(), t.shape().end());
    header[name] = {{"dtype", "F32"}, {"shape", shape}, {"data_offsets", {data.size(), data.size() + t.nbytes()}}};
    data.append(static_cast<const char*>(t.data()), t.nbytes());
  }
  header["__metadata__"] = {{"format", "pt"}};
  const Bytes h = header.dump();
  Bytes out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((static_cast<uint64_t>(h.size()) >> (8 * i)) & 0xff));
  return out + h + data;
}

TEST_F(FuzzReaders, Safetensors) {
  const ModelConfig c = fuzz_config(Arch::qwen3);
  const std::string path = dir_.file("model.safetensors");
  expect_clean(fuzz(path, safetensors_of(random_parameters(c, 3)), 6, 2000, false,
                    [&] {
                      const SafetensorsFile f(path);
                      for (const auto& [name, e] : f.entries()) f.read(name, DType::f32);
                    }),
               "safetensors");
}

TEST_F(FuzzReaders, HfCheckpointFolder) {
  const ModelConfig c = fuzz_config(Arch::qwen3);
  write_all(dir_.file("model.safetensors"), safetensors_of(random_parameters(c, 4)));
  const nlohmann::json hf = {{"model_type", "qwen3"},
                             {"vocab_size", 16},
                             {"hidden_size", 8},
                             {"num_hidden_layers", 1},
                             {"num_attention_heads", 2},
                             {"num_key_value_heads", 1},
                             {"head_dim", 4},
                             {"intermediate_size", 8},
                             {"rms_norm_eps", 1e-6},
                             {"rope_parameters", {{"rope_theta", 10000.0}, {"rope_type", "default"}}},
                             {"tie_word_embeddings", false},
                             {"hidden_act", "silu"}};
  const std::string folder = dir_.path().string();
  expect_clean(fuzz(dir_.file("config.json"), hf.dump(1), 7, 800, true, [&] { import_hf_checkpoint(folder); }),
               "HF config");
  // The sharded form: the index's weight_map mutated.
  nlohmann::json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", nlohmann::json::object()}};
  for (const ParamSpec& spec : parameter_specs(c)) index["weight_map"][spec.name] = "model.safetensors";
  write_all(dir_.file("config.json"), hf.dump(1));
  expect_clean(fuzz(dir_.file("model.safetensors.index.json"), index.dump(1), 8, 600, true,
                    [&] { import_hf_checkpoint(folder); }),
               "HF index");
}

// A hybrid's folder as `hydra export` writes it (model_type hydrahead): its config.json mutated.
TEST_F(FuzzReaders, HydraHeadExportFolder) {
  const ModelConfig c = fuzz_config(Arch::hydrahead);
  const std::string model = dir_.file("m.h5"), folder = dir_.file("hf");
  write_model_checkpoint(model, c, random_parameters(c, 5));
  export_hf_checkpoint(model, folder, {});
  const Bytes seed = read_all(folder + "/config.json");
  expect_clean(fuzz(folder + "/config.json", seed, 9, 800, true, [&] { import_hf_checkpoint(folder); }),
               "hydrahead config.json");
}

}  // namespace
}  // namespace hydra::test
