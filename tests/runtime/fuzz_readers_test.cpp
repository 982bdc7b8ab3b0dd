// Seeded mutation fuzzing of every reader of user files: checkpoints (HDF5, and the config JSON inside
// them), token files, NIAH eval sets, FA head-set files, safetensors files and HF checkpoint folders
// (config.json). Each reader gets a small valid input written here and a fixed number of mutants of
// it (tests/runtime/fuzz_util.h says which, and what outcomes are allowed: success or a UserError).
// Bounded: the counts below keep the whole suite under a minute on 2 cores in a sanitizer build.
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
#include "tests/runtime/fuzz_util.h"

namespace hydra::test {
namespace {

namespace fs = std::filesystem;
using namespace fuzzing;

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
