// hydra export (model/hf_export.h) as a user runs it: the folder's files and keys, bf16 rounding,
// sharding, export -> import bit for bit for teacher and hybrid in f32 and bf16, and bad folders
// and interrupted exports answered with one line and no partial output. The PyTorch side (the
// module in cluster/torch/ and transformers' Qwen3ForCausalLM on the same folders) is
// tests/cluster/torch_export_test.py; transformers alone opening the folders (trust_remote_code) is
// tests/cluster/hf_remote_code_test.py.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "model/hf_export.h"
#include "model/params.h"
#include "runtime/checkpoint.h"
#include "runtime/safetensors.h"
#include "tests/common/test_util.h"

namespace hydra::test {
namespace {

// Every tensor name of a Hugging Face Qwen3ForCausalLM with `layers` layers, from
// tests/fixtures/hf/qwen3_tensor_names.txt ({N}: each layer; no lm_head when tied).
std::set<std::string> hf_qwen3_names(int64_t layers, bool tied) {
  std::ifstream in(fixture_dir() + "/hf/qwen3_tensor_names.txt");
  EXPECT_TRUE(in.good()) << "the Qwen3 names fixture is missing";
  std::set<std::string> names;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#' || (tied && line == "lm_head.weight")) continue;
    const size_t at = line.find("{N}");
    if (at == std::string::npos) {
      names.insert(line);
      continue;
    }
    for (int64_t l = 0; l < layers; ++l) names.insert(line.substr(0, at) + std::to_string(l) + line.substr(at + 3));
  }
  return names;
}

namespace fs = std::filesystem;

void expect_one_line_error(const CommandResult& r, const std::string& needle) {
  expect_user_error(r, needle);
  EXPECT_EQ(r.output.rfind("hydra: error", 0), 0u) << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
}

nlohmann::json read_json(const fs::path& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

std::vector<std::string> entries_of(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// Every dataset of two checkpoints: same names, same stored dtype and shape, same bytes; same config.
void expect_identical_checkpoints(const std::string& a, const std::string& b) {
  const CheckpointReader ra(a), rb(b);
  EXPECT_EQ(nlohmann::json::parse(ra.config_json()), nlohmann::json::parse(rb.config_json()));
  ASSERT_EQ(ra.names(), rb.names());
  for (const std::string& name : ra.names()) {
    const H5File fa = H5File::open_read(a), fb = H5File::open_read(b);
    const Tensor ta = fa.read(name), tb = fb.read(name);
    ASSERT_EQ(ta.dtype(), tb.dtype()) << name;
    ASSERT_EQ(ta.shape_string(), tb.shape_string()) << name;
    EXPECT_EQ(std::memcmp(ta.data(), tb.data(), ta.nbytes()), 0) << name << " differs";
  }
}

class Export : public ::testing::Test {
 protected:
  // `preset` with random weights (seed 3) in `dtype`, through hydra init as a user makes one.
  std::string init(const std::string& preset, const std::string& dtype) {
    const std::string path = dir_.file(preset + "-" + dtype + ".h5");
    const CommandResult r = hydra("init --preset " + preset + " --weight-seed 3 --dtype " + dtype + " --out " + path);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return path;
  }
  TempDir dir_;
};

// export -> import for teacher and hybrid, f32 and bf16: every tensor's bits and the config.
TEST_F(Export, RoundTripIsBitIdentical) {
  for (const std::string preset : {"qwen3-tiny", "hydrahead-tiny"}) {
    for (const std::string dtype : {"f32", "bf16"}) {
      SCOPED_TRACE(preset + " " + dtype);
      const std::string model = init(preset, dtype), out = dir_.file(preset + "-" + dtype + "-hf");
      const CommandResult e = hydra("export --model " + model + " --out " + out);
      ASSERT_EQ(e.exit_code, 0) << e.output;
      EXPECT_NE(e.output.find(std::string("\"dtype\":\"") + (dtype == "bf16" ? "bfloat16" : "float32")), std::string::npos)
          << e.output;
      // generation_config.json always (at 6777ccb none without --tokenizer): {} when nothing is known, and
      // a warning that says so.
      const std::vector<std::string> files =
          preset == "qwen3-tiny"
              ? std::vector<std::string>{"config.json", "generation_config.json", "model.safetensors"}
              : std::vector<std::string>{"config.json", "generation_config.json", "hydrahead.py", "model.safetensors"};
      EXPECT_EQ(entries_of(out), files);
      EXPECT_EQ(read_json(fs::path(out) / "generation_config.json"), nlohmann::json::object());
      EXPECT_NE(e.output.find("generation_config.json names no eos_token_id (no --tokenizer)"), std::string::npos) << e.output;
      const std::string back = dir_.file(preset + "-" + dtype + "-back.h5");
      const CommandResult i = hydra("import --hf " + out + " --dtype " + dtype + " --out " + back);
      ASSERT_EQ(i.exit_code, 0) << i.output;
      expect_identical_checkpoints(model, back);
    }
  }
}

// The folder as transformers expects it: Qwen3 keys and names for a teacher, no lm_head when tied;
// the hybrid's own keys; the safetensors layout (aligned header, tensors back to back).
TEST_F(Export, TeacherFolderHasQwen3NamesAndKeys) {
  ModelConfig c = preset_config("qwen3-tiny");
  c.tie_word_embeddings = true;
  const std::string model = dir_.file("tied.h5"), out = dir_.file("tied-hf");
  write_model_checkpoint(model, c, random_parameters(c, 7));
  ASSERT_EQ(hydra("export --model " + model + " --out " + out).exit_code, 0);
  const nlohmann::json cfg = read_json(fs::path(out) / "config.json");
  EXPECT_EQ(cfg["model_type"], "qwen3");
  EXPECT_EQ(cfg["architectures"], nlohmann::json::array({"Qwen3ForCausalLM"}));
  EXPECT_EQ(cfg["torch_dtype"], "float32");
  EXPECT_EQ(cfg["tie_word_embeddings"], true);
  for (const char* key : {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                          "num_key_value_heads", "head_dim", "vocab_size", "rms_norm_eps", "rope_theta",
                          "max_position_embeddings", "hidden_act", "attention_bias"}) {
    EXPECT_TRUE(cfg.contains(key)) << key;
  }
  EXPECT_FALSE(cfg.contains("fa_heads"));
  EXPECT_EQ(cfg["rope_theta"].get<double>(), c.rope_theta);
  // transformers 5's keys beside the 4.x ones; no remote code for a teacher (transformers has Qwen3).
  EXPECT_EQ(cfg["dtype"], "float32");
  EXPECT_EQ(cfg["rope_parameters"], (nlohmann::json{{"rope_theta", c.rope_theta}, {"rope_type", "default"}}));
  EXPECT_FALSE(cfg.contains("auto_map"));
  EXPECT_FALSE(fs::exists(fs::path(out) / "hydrahead.py"));

  const std::string path = (fs::path(out) / "model.safetensors").string();
  const SafetensorsFile file(path);
  std::set<std::string> names;
  for (const auto& [name, entry] : file.entries()) names.insert(name);
  // The names a Hugging Face Qwen3 checkpoint has, from a hand-written fixture (not from
  // parameter_specs, which export and import share): a naming error common to both fails here.
  EXPECT_EQ(names, hf_qwen3_names(c.num_layers, c.tie_word_embeddings));
  EXPECT_FALSE(names.count("lm_head.weight"));
  EXPECT_TRUE(names.count("model.layers.1.self_attn.q_norm.weight"));
  // Raw layout: header length N, data from 8 + N (a multiple of 8), tensors contiguous, no holes.
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), {});
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<unsigned char>(bytes[static_cast<size_t>(i)]);
  EXPECT_EQ((8 + n) % 8, 0u);
  const nlohmann::json header = nlohmann::json::parse(bytes.substr(8, n));
  EXPECT_EQ(header["__metadata__"]["format"], "pt");
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& [name, e] : header.items()) {
    if (name != "__metadata__") ranges.emplace_back(e["data_offsets"][0], e["data_offsets"][1]);
  }
  std::sort(ranges.begin(), ranges.end());
  uint64_t at = 0;
  for (const auto& [b, e] : ranges) {
    EXPECT_EQ(b, at);
    at = e;
  }
  EXPECT_EQ(at, bytes.size() - 8 - n);
}

TEST_F(Export, HybridFolderCarriesHeadSetsAndGdnSettings) {
  const std::string model = init("hydrahead-tiny", "f32"), out = dir_.file("hybrid-hf");
  ASSERT_EQ(hydra("export --model " + model + " --out " + out + " --dtype bf16 --max-position-embeddings 1M").exit_code,
            0);
  const nlohmann::json cfg = read_json(fs::path(out) / "config.json");
  const ModelConfig c = preset_config("hydrahead-tiny");
  EXPECT_EQ(cfg["model_type"], "hydrahead");
  EXPECT_EQ(cfg["architectures"], nlohmann::json::array({"HydraHeadForCausalLM"}));
  EXPECT_EQ(cfg["hydrahead_version"], 1);
  EXPECT_EQ(cfg["fa_heads"], nlohmann::json(c.fa_heads));
  EXPECT_EQ(cfg["fa_log_base"].get<double>(), c.fa_log_base);
  EXPECT_EQ(cfg["conv_kernel"], c.conv_kernel);
  EXPECT_EQ(cfg["l2_norm_eps"].get<double>(), c.l2_norm_eps);
  EXPECT_EQ(cfg["torch_dtype"], "bfloat16");
  EXPECT_EQ(cfg["dtype"], "bfloat16");
  EXPECT_EQ(cfg["max_position_embeddings"], 1 << 20);
  // The modeling code for transformers' trust_remote_code: the source tree's PyTorch model, byte for
  // byte (the binary carries it), and auto_map naming its classes.
  EXPECT_EQ(cfg["auto_map"], (nlohmann::json{{"AutoConfig", "hydrahead.HydraHeadConfig"},
                                             {"AutoModelForCausalLM", "hydrahead.HydraHeadForCausalLM"}}));
  const auto contents = [](const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), {});
  };
  const std::string source = contents(fs::path(fixture_dir()) / ".." / ".." / "cluster" / "torch" / "hydrahead.py");
  EXPECT_GT(source.size(), 10000u);
  EXPECT_TRUE(contents(fs::path(out) / "hydrahead.py") == source) << "the folder's hydrahead.py is not cluster/torch's";
  const SafetensorsFile file((fs::path(out) / "model.safetensors").string());
  EXPECT_EQ(file.entries().at("model.layers.1.self_attn.gdn_q_conv.weight").dtype, "BF16");
  EXPECT_EQ(file.entries().at("model.layers.1.self_attn.gdn_q_conv.weight").shape, (std::vector<int64_t>{2 * 64, 4}));
  EXPECT_EQ(file.entries().at("model.layers.0.self_attn.fuse_norm.weight").shape, (std::vector<int64_t>{4, 64}));
}

// Each fusion variant, as hydra convert --fusion writes it: hydra info names it, the export carries
// it as hydrahead_fusion with the variant's tensors, and import gives the checkpoint back bit for
// bit; a folder without the key imports as scale_norm. An unknown name is refused in one line.
TEST_F(Export, FusionVariantsConvertExportAndImport) {
  const std::string teacher = init("qwen3-tiny", "f32");
  for (const ops::Fusion fusion : ops::kFusions) {
    const std::string name = ops::fusion_name(fusion);
    SCOPED_TRACE(name);
    const std::string model = dir_.file("s-" + name + ".h5"), out = dir_.file("s-" + name + "-hf");
    const CommandResult c = hydra("convert --teacher " + teacher + " --fa-heads uniform:1 --fusion " + name + " --out " + model);
    ASSERT_EQ(c.exit_code, 0) << c.output;
    EXPECT_NE(c.output.find("fusion " + name), std::string::npos) << c.output;
    const CommandResult info = hydra("info " + model);
    EXPECT_NE(info.output.find("fusion " + name), std::string::npos) << info.output;
    ASSERT_EQ(hydra("export --model " + model + " --out " + out).exit_code, 0);
    const nlohmann::json cfg = read_json(fs::path(out) / "config.json");
    EXPECT_EQ(cfg["hydrahead_fusion"], name);
    EXPECT_FALSE(cfg.contains("fusion"));
    const SafetensorsFile file((fs::path(out) / "model.safetensors").string());
    EXPECT_EQ(file.entries().count("model.layers.0.self_attn.fuse_gamma"), ops::fusion_has_gamma(fusion) ? 1u : 0u);
    EXPECT_EQ(file.entries().count("model.layers.0.self_attn.fuse_norm.weight"), ops::fusion_has_norm(fusion) ? 1u : 0u);
    if (ops::fusion_has_gate(fusion)) {
      EXPECT_EQ(file.entries().at("model.layers.0.self_attn.fuse_gate.weight").shape, (std::vector<int64_t>{4, 128}));
      EXPECT_EQ(file.entries().at("model.layers.1.self_attn.fuse_gate.bias").shape, (std::vector<int64_t>{4}));
    }
    const std::string back = dir_.file("s-" + name + "-back.h5");
    const CommandResult i = hydra("import --hf " + out + " --out " + back);
    ASSERT_EQ(i.exit_code, 0) << i.output;
    expect_identical_checkpoints(model, back);
    if (fusion == ops::Fusion::scale_norm) {  // written before the variants existed: no key
      nlohmann::json old = cfg;
      old.erase("hydrahead_fusion");
      std::ofstream(fs::path(out) / "config.json") << old.dump();
      const std::string older = dir_.file("s-older.h5");
      ASSERT_EQ(hydra("import --hf " + out + " --out " + older).exit_code, 0);
      expect_identical_checkpoints(model, older);
    }
    if (fusion == ops::Fusion::gate) {  // a gate folder that says scale_norm: its tensors do not match
      nlohmann::json wrong = cfg;
      wrong["hydrahead_fusion"] = "scale_norm";
      std::ofstream(fs::path(out) / "config.json") << wrong.dump();
      const CommandResult r = hydra("import --hf " + out + " --out " + dir_.file("wrong.h5"));
      EXPECT_EQ(r.exit_code, 2) << r.output;
      EXPECT_NE(r.output.find("self_attn.fuse_gate."), std::string::npos) << r.output;
      EXPECT_NE(r.output.find("(the config's fusion is scale_norm)"), std::string::npos) << r.output;
    }
  }
  const CommandResult bad = hydra("convert --teacher " + teacher + " --fa-heads uniform:1 --fusion gated --out " +
                                  dir_.file("bad.h5"));
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("--fusion: unknown fusion 'gated' (expected scale_norm, norm, scale, concat or gate)"),
            std::string::npos)
      << bad.output;
  EXPECT_FALSE(fs::exists(dir_.file("bad.h5")));
}

// f32 -> bf16 rounds to nearest, ties to even: values with known bf16 bits, then every tensor.
TEST_F(Export, Bf16RoundsToNearestEven) {
  const ModelConfig c = preset_config("qwen3-tiny");
  NamedTensors params = random_parameters(c, 5);
  float* w = params.at("model.norm.weight").data_as<float>();
  const uint32_t cases[][2] = {
      {0x3f808000u, 0x3f80u},  // 1 + 2^-8: a tie, to the even 1.0
      {0x3f818000u, 0x3f82u},  // 1 + 3·2^-8: a tie, to the even 1 + 2^-6
      {0x3f808001u, 0x3f81u},  // just above the tie: up
      {0xbf807fffu, 0xbf80u},  // just below the tie, negative: down in magnitude
  };
  for (int i = 0; i < 4; ++i) std::memcpy(&w[i], &cases[i][0], 4);
  const std::string model = dir_.file("f32.h5"), out = dir_.file("bf16-hf");
  write_model_checkpoint(model, c, params);
  ASSERT_EQ(hydra("export --model " + model + " --out " + out + " --dtype bf16").exit_code, 0);
  const SafetensorsFile file((fs::path(out) / "model.safetensors").string());
  const Tensor norm = file.read("model.norm.weight", DType::bf16);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(norm.data_as<bf16>()[i].bits, cases[i][1]) << "case " << i;
  for (const auto& [name, t] : params) {
    const Tensor got = file.read(name, DType::bf16);
    for (int64_t i = 0; i < t.numel(); ++i) {
      ASSERT_EQ(got.data_as<bf16>()[i].bits, float_to_bf16(t.data_as<float>()[i]).bits) << name << " element " << i;
    }
  }
}

TEST_F(Export, ShardsAboveTheSizeWithAnIndex) {
  const std::string model = init("hydrahead-tiny", "f32"), out = dir_.file("sharded-hf");
  const CommandResult e = hydra("export --model " + model + " --out " + out + " --max-shard-size 200K");
  ASSERT_EQ(e.exit_code, 0) << e.output;
  const nlohmann::json index = read_json(fs::path(out) / "model.safetensors.index.json");
  std::set<std::string> shards;
  uint64_t total = 0;
  for (const auto& [name, file] : index["weight_map"].items()) shards.insert(file.get<std::string>());
  ASSERT_GT(shards.size(), 2u);
  for (const std::string& s : shards) {
    EXPECT_EQ(s.find("-of-" + fmt::format("{:05d}", shards.size())), 11u) << s;
    const SafetensorsFile f((fs::path(out) / s).string());
    uint64_t bytes = 0;
    for (const auto& [name, entry] : f.entries()) {
      bytes += entry.end - entry.begin;
      EXPECT_EQ(index["weight_map"][name], s) << name;
    }
    EXPECT_TRUE(bytes <= 200 * 1024 || f.entries().size() == 1) << s << ": " << bytes << " bytes";
    total += bytes;
  }
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), total);
  EXPECT_EQ(index["weight_map"].size(), parameter_specs(preset_config("hydrahead-tiny")).size());
  EXPECT_FALSE(fs::exists(fs::path(out) / "model.safetensors"));
  const std::string back = dir_.file("sharded-back.h5");
  ASSERT_EQ(hydra("import --hf " + out + " --out " + back).exit_code, 0);
  expect_identical_checkpoints(model, back);
}

TEST_F(Export, CopiesTokenizerFiles) {
  const std::string model = init("qwen3-tiny", "f32"), tok = dir_.file("tok"), out = dir_.file("tok-hf");
  fs::create_directories(tok);
  std::ofstream(tok + "/tokenizer.json") << "{\"version\": \"1.0\"}";
  std::ofstream(tok + "/generation_config.json") << "{\"eos_token_id\": 3}";
  std::ofstream(tok + "/model.safetensors") << "not copied";
  ASSERT_EQ(hydra("export --model " + model + " --out " + out + " --tokenizer " + tok).exit_code, 0);
  EXPECT_EQ(entries_of(out),
            (std::vector<std::string>{"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"}));
  fs::remove(tok + "/tokenizer.json");
  expect_one_line_error(hydra("export --model " + model + " --out " + dir_.file("x") + " --tokenizer " + tok),
                        "no tokenizer.json, tokenizer_config.json or tokenizer.model in the tokenizer folder");
  EXPECT_FALSE(fs::exists(dir_.file("x")));
}

// The tokenizer's JSON files are copied as they are: one that is not a JSON object is refused before
// anything is written, even where tokenizer_config.json names the special tokens without it. At
// 6777ccb a tokenizer.json that was not JSON was copied into the export (exit 0).
TEST_F(Export, TokenizerFilesThatAreNotJsonAreRefused) {
  const std::string model = init("qwen3-tiny", "f32"), tok = dir_.file("tok");
  fs::create_directories(tok);
  std::ofstream(tok + "/tokenizer_config.json")
      << R"({"eos_token": "<e>", "added_tokens_decoder": {"3": {"content": "<e>", "special": true}}})";
  for (const char* text : {"{not json", "[1, 2]", ""}) {
    SCOPED_TRACE(text);
    std::ofstream(tok + "/tokenizer.json") << text;
    expect_one_line_error(hydra("export --model " + model + " --out " + dir_.file("x") + " --tokenizer " + tok),
                          tok + "/tokenizer.json: not a JSON object");
    EXPECT_FALSE(fs::exists(dir_.file("x")));
  }
  std::ofstream(tok + "/tokenizer.json") << R"({"version": "1.0"})";
  std::ofstream(tok + "/special_tokens_map.json") << "{\"eos_token\": ";
  expect_one_line_error(hydra("export --model " + model + " --out " + dir_.file("x") + " --tokenizer " + tok),
                        tok + "/special_tokens_map.json: not a JSON object");
  fs::remove(tok + "/special_tokens_map.json");
  EXPECT_EQ(hydra("export --model " + model + " --out " + dir_.file("x") + " --tokenizer " + tok).exit_code, 0);
}

// generation_config.json from --tokenizer: bos/eos/pad ids resolved through tokenizer_config.json's
// added_tokens_decoder, tokenizer.json's added tokens and its vocabulary; the folder's own
// generation_config.json kept and completed; tokens the tokenizer does not define and ids outside
// the model's vocabulary refused in one line before anything is written.
TEST_F(Export, GenerationConfigFromTheTokenizer) {
  const std::string model = init("hydrahead-tiny", "f32");
  const auto tokenizer = [&](const std::string& name, const nlohmann::json& config, const nlohmann::json& tok) {
    const fs::path dir = dir_.path() / name;
    fs::create_directories(dir);
    std::ofstream(dir / "tokenizer_config.json") << config.dump();
    std::ofstream(dir / "tokenizer.json") << tok.dump();
    return dir.string();
  };
  const nlohmann::json tok = {{"added_tokens", {{{"id", 2}, {"content", "</s>"}}}},
                              {"model", {{"type", "BPE"}, {"vocab", {{"<pad>", 0}, {"a", 3}, {"b", 4}}}}}};
  const nlohmann::json config = {
      {"bos_token", "<s>"},
      {"eos_token", {{"content", "</s>"}, {"__type", "AddedToken"}}},
      {"pad_token", "<pad>"},
      {"unk_token", nullptr},
      {"added_tokens_decoder", {{"1", {{"content", "<s>"}, {"special", true}}}}}};
  const auto exported = [&](const std::string& name, const std::string& dir) {
    const std::string out = dir_.file(name);
    const CommandResult r = hydra("export --model " + model + " --out " + out + " --tokenizer " + dir);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return out;
  };
  // bos from added_tokens_decoder, eos from tokenizer.json's added tokens, pad from the vocabulary.
  std::string out = exported("gen-hf", tokenizer("tok", config, tok));
  EXPECT_EQ(read_json(fs::path(out) / "generation_config.json"),
            (nlohmann::json{{"bos_token_id", 1}, {"eos_token_id", 2}, {"pad_token_id", 0}}));
  EXPECT_EQ(entries_of(out), (std::vector<std::string>{"config.json", "generation_config.json", "hydrahead.py",
                                                       "model.safetensors", "tokenizer.json", "tokenizer_config.json"}));
  // The folder's own file wins where it has a value; the rest is filled in.
  const std::string own = tokenizer("tok-own", config, tok);
  std::ofstream(fs::path(own) / "generation_config.json") << R"({"eos_token_id": [4, 2], "temperature": 0.6})";
  out = exported("gen-own-hf", own);
  EXPECT_EQ(read_json(fs::path(out) / "generation_config.json"),
            (nlohmann::json{{"bos_token_id", 1}, {"eos_token_id", {4, 2}}, {"pad_token_id", 0}, {"temperature", 0.6}}));
  // No special tokens named: the eos is the tokenizer's document separator (here </s>), as hydra
  // generate's default stop.
  out = exported("gen-none-hf", tokenizer("tok-none", {{"model_max_length", 512}}, tok));
  EXPECT_EQ(read_json(fs::path(out) / "generation_config.json"), (nlohmann::json{{"eos_token_id", 2}}));
  // Nothing at all: an empty generation_config.json, still written.
  nlohmann::json bare = tok;
  bare["added_tokens"] = nlohmann::json::array();
  out = exported("gen-bare-hf", tokenizer("tok-bare", {{"model_max_length", 512}}, bare));
  EXPECT_EQ(read_json(fs::path(out) / "generation_config.json"), nlohmann::json::object());

  nlohmann::json undefined = config;
  undefined["eos_token"] = "<|end|>";
  expect_one_line_error(hydra("export --model " + model + " --out " + dir_.file("x") + " --tokenizer " +
                              tokenizer("tok-undefined", undefined, tok)),
                        "tokenizer_config.json names eos_token '<|end|>', which neither its added_tokens_decoder nor "
                        "tokenizer.json defines");
  nlohmann::json bad_key = config;
  bad_key["added_tokens_decoder"] = {{"one", {{"content", "<s>"}}}};
  expect_one_line_error(hydra("export --model " + model + " --out " + dir_.file("x") + " --tokenizer " +
                              tokenizer("tok-bad-key", bad_key, tok)),
                        "tokenizer_config.json added_tokens_decoder key 'one' is not a token id");
  const std::string outside = tokenizer("tok-outside", config, tok);
  std::ofstream(fs::path(outside) / "generation_config.json") << R"({"eos_token_id": [2, 300]})";
  expect_one_line_error(hydra("export --model " + model + " --out " + dir_.file("x") + " --tokenizer " + outside),
                        "eos_token_id 300 is outside the model's vocabulary [0, 256)");
  std::ofstream(fs::path(outside) / "generation_config.json") << "{not json";
  expect_one_line_error(hydra("export --model " + model + " --out " + dir_.file("x") + " --tokenizer " + outside),
                        "generation_config.json: not valid JSON");
  EXPECT_FALSE(fs::exists(dir_.file("x")));
}

// Bad folders on import: each a one-line error naming the problem.
TEST_F(Export, ImportRefusesBadFolders) {
  const std::string model = init("hydrahead-tiny", "f32"), good = dir_.file("good-hf"), out = dir_.file("back.h5");
  ASSERT_EQ(hydra("export --model " + model + " --out " + good).exit_code, 0);
  const auto variant = [&](const std::string& name, const std::function<void(nlohmann::json&)>& edit) {
    const fs::path dir = dir_.path() / name;
    fs::create_directories(dir);
    fs::copy_file(fs::path(good) / "model.safetensors", dir / "model.safetensors");
    nlohmann::json cfg = read_json(fs::path(good) / "config.json");
    edit(cfg);
    std::ofstream(dir / "config.json") << cfg.dump();
    return dir.string();
  };
  expect_one_line_error(hydra("import --hf " + variant("layers", [](auto& j) { j["num_hidden_layers"] = 3; j["fa_heads"].push_back({0}); }) + " --out " + out),
                        "tensor 'model.layers.2.input_layernorm.weight' is not in the checkpoint");
  expect_one_line_error(hydra("import --hf " + variant("shape", [](auto& j) { j["fa_heads"][0] = {1, 2}; }) + " --out " + out),
                        "tensor 'model.layers.0.self_attn.k_proj.weight' has shape [64, 128], the config needs [128, 128]");
  expect_one_line_error(hydra("import --hf " + variant("type", [](auto& j) { j["model_type"] = "llama"; }) + " --out " + out),
                        "model_type 'llama' is not supported (hydra imports qwen3 and hydrahead folders)");
  expect_one_line_error(hydra("import --hf " + variant("newer", [](auto& j) { j["hydrahead_version"] = 2; }) + " --out " + out),
                        "hydrahead_version 2 is not supported");
  expect_one_line_error(hydra("import --hf " + variant("heads", [](auto& j) { j["fa_heads"][1] = {3, 9}; }) + " --out " + out),
                        "layer 1 names FA head 9, but heads are 0..3");
  expect_one_line_error(hydra("import --hf " + variant("noheads", [](auto& j) { j.erase("fa_heads"); }) + " --out " + out),
                        "fa_heads");
  // A hybrid's tensors under a teacher's config: the teacher's k_proj rows are missing.
  expect_one_line_error(hydra("import --hf " + variant("as-teacher", [](auto& j) { j["model_type"] = "qwen3"; }) + " --out " + out),
                        "tensor 'model.layers.0.self_attn.k_proj.weight' has shape [64, 128], the config needs [128, 128]");
  EXPECT_FALSE(fs::exists(out));
}

TEST_F(Export, RefusesBadInputBeforeWriting) {
  const std::string model = init("qwen3-tiny", "f32");
  const std::string taken = dir_.file("taken");
  fs::create_directories(taken);
  std::ofstream(taken + "/keep.txt") << "mine";
  expect_one_line_error(hydra("export --model " + model + " --out " + taken), "folder exists and is not empty");
  EXPECT_EQ(entries_of(taken), std::vector<std::string>{"keep.txt"});
  expect_one_line_error(hydra("export --model " + model + " --out " + dir_.file("o") + " --dtype fp8"),
                        "--dtype must be auto, f32 or bf16 (got 'fp8')");
  expect_one_line_error(hydra("export --model " + dir_.file("none.h5") + " --out " + dir_.file("o")),
                        "model file does not exist");
  expect_one_line_error(hydra("export --model " + model + " --out " + dir_.file("o") + " --max-shard-size 0"),
                        "--max-shard-size must be positive");
  expect_one_line_error(hydra("export --model " + model + " --out " + dir_.file("nodir/o")), "nodir");
  // Non-finite weights: refused (by name) unless allowed.
  const ModelConfig c = preset_config("qwen3-tiny");
  NamedTensors params = random_parameters(c, 2);
  params.at("model.layers.1.mlp.up_proj.weight").data_as<float>()[17] = std::nanf("");
  const std::string bad = dir_.file("nan.h5");
  write_model_checkpoint(bad, c, params);
  expect_one_line_error(hydra("export --model " + bad + " --out " + dir_.file("o")),
                        "tensor 'model.layers.1.mlp.up_proj.weight' holds NaN or Inf (first at element 17");
  EXPECT_FALSE(fs::exists(dir_.file("o")));
  ASSERT_EQ(hydra("export --model " + bad + " --out " + dir_.file("o") + " --allow-nonfinite").exit_code, 0);
  // An empty folder is taken (rename replaces it).
  fs::create_directories(dir_.file("empty"));
  ASSERT_EQ(hydra("export --model " + model + " --out " + dir_.file("empty") + "/").exit_code, 0);
  EXPECT_TRUE(fs::exists(dir_.file("empty") + "/model.safetensors"));
}

// An export that fails or is killed half way leaves no folder; its remains are swept by the next.
TEST_F(Export, InterruptedExportLeavesNothing) {
  const std::string model = init("hydrahead-tiny", "f32"), out = dir_.file("int-hf");
  const std::string args = "export --model " + model + " --out " + out + " --max-shard-size 100K";
  const CommandResult failed = run_command("HYDRA_INJECT_FAULT=0:save " + hydra_binary() + " " + args);
  EXPECT_EQ(failed.exit_code, 1) << failed.output;  // an internal error, as any failure mid-write
  EXPECT_NE(failed.output.find("injected fault at 'save'"), std::string::npos) << failed.output;
  EXPECT_FALSE(fs::exists(out));
  EXPECT_EQ(entries_of(dir_.path()), std::vector<std::string>{"hydrahead-tiny-f32.h5"});
  const CommandResult killed = run_command("HYDRA_INJECT_FAULT=0:kill@save " + hydra_binary() + " " + args);
  EXPECT_NE(killed.exit_code, 0);
  EXPECT_FALSE(fs::exists(out));
  ASSERT_EQ(entries_of(dir_.path()).size(), 2u);  // the killed run's temporary folder
  ASSERT_EQ(hydra(args).exit_code, 0);
  EXPECT_EQ(entries_of(dir_.path()), (std::vector<std::string>{"hydrahead-tiny-f32.h5", "int-hf"}));
}

}  // namespace
}  // namespace hydra::test
