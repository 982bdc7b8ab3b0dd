// Model-level checks: presets, deterministic init, config JSON, HF config variants, checkpoint
// validation, and finite deterministic forwards of HydraHead and layer-wise hybrids.
#include <nlohmann/json.hpp>

#include "model/hf_import.h"
#include "model/params.h"
#include "parallel/self_communicator.h"
#include "tests/common/test_util.h"

namespace hydra::test {
namespace {

std::vector<int32_t> some_ids(int64_t n, int64_t vocab) { return strided_ids(n, vocab, 2654435761, 0); }

TEST(Presets, AllValidateAndUnknownOnesAreListed) {
  for (const std::string& name : preset_names()) EXPECT_NO_THROW(preset_config(name).validate()) << name;
  const ModelConfig big = preset_config("hydrahead-1.7b");
  EXPECT_EQ(big.num_layers, 28);
  EXPECT_EQ(big.hidden_size, 2048);
  EXPECT_EQ(big.vocab_size, 151936);
  EXPECT_TRUE(big.tie_word_embeddings);
  for (int64_t l = 0; l < big.num_layers; ++l) EXPECT_EQ(big.fa_heads_of(l), (std::vector<int>{0, 1}));
  const ModelConfig tiny = preset_config("hydrahead-tiny");
  for (int64_t l = 0; l < tiny.num_layers; ++l) {
    EXPECT_FALSE(tiny.fa_heads_of(l).empty());
    EXPECT_FALSE(tiny.gdn_heads_of(l).empty());
  }
  EXPECT_NE(error_of([] { preset_config("qwen9-huge"); }).find("unknown preset 'qwen9-huge' (known presets: qwen3-tiny"),
            std::string::npos);
}

// Qwen3-4B and -8B (the sharded-state shapes): the published sizes (4.02B tied, 8.19B untied, from their config.json
// shapes), and the hydraheads built from them keep one FA head in 8 per layer, as hydrahead-1.7b.
TEST(Presets, FourAndEightBillionShapes) {
  EXPECT_NEAR(static_cast<double>(parameter_count(preset_config("qwen3-4b"))), 4.022e9, 0.005e9);
  EXPECT_NEAR(static_cast<double>(parameter_count(preset_config("qwen3-8b"))), 8.191e9, 0.005e9);
  EXPECT_TRUE(preset_config("qwen3-4b").tie_word_embeddings);
  EXPECT_FALSE(preset_config("qwen3-8b").tie_word_embeddings);
  for (const std::string name : {"hydrahead-4b", "hydrahead-8b"}) {
    const ModelConfig c = preset_config(name);
    EXPECT_EQ(c.num_layers, 36) << name;
    EXPECT_EQ(c.num_heads, 32) << name;
    for (int64_t l = 0; l < c.num_layers; ++l) EXPECT_EQ(c.fa_heads_of(l), (std::vector<int>{0, 1, 2, 3})) << name;
  }
}

// The language teacher of issue 58: 8 layers of 16 query heads in 4 KV groups, RoPE, 50-150M parameters,
// the corpus tokenizer's 16384 ids; its CPU stand-in keeps the vocabulary and the KV groups.
TEST(Presets, LanguageTeacherShape) {
  const ModelConfig c = preset_config("qwen3-text");
  EXPECT_EQ(c.arch, Arch::qwen3);
  EXPECT_EQ(c.num_layers, 8);
  EXPECT_EQ(c.num_heads, 16);
  EXPECT_EQ(c.num_kv_heads, 4);
  EXPECT_EQ(c.vocab_size, 16384);
  EXPECT_GT(c.rope_theta, 0.0);
  const int64_t n = parameter_count(c);
  EXPECT_GE(n, 50'000'000);
  EXPECT_LE(n, 150'000'000);
  EXPECT_EQ(n, 78'657'280);  // 2·16384·768 + 8·(768·(1024 + 2·256) + 1024·768 + 3·768·2048 + 2·768 + 2·64) + 768
  const ModelConfig cpu = preset_config("qwen3-text-cpu");
  EXPECT_EQ(cpu.vocab_size, c.vocab_size);
  EXPECT_EQ(cpu.num_kv_heads, c.num_kv_heads);
  EXPECT_LT(cpu.num_heads, c.num_heads);
}

TEST(Params, InitIsSeededAndOrderIndependent) {
  const ModelConfig c = preset_config("hydrahead-tiny");
  const NamedTensors a = random_parameters(c, 7), b = random_parameters(c, 7), other = random_parameters(c, 8);
  const auto specs = parameter_specs(c);
  for (const ParamSpec& spec : specs) {
    expect_close(a.at(spec.name), b.at(spec.name), 0.0, spec.name);
    Tensor alone = Tensor::empty(spec.shape, DType::f32);
    init_parameter(spec, 7, alone);
    expect_close(alone, a.at(spec.name), 0.0, spec.name + " alone");
  }
  EXPECT_GT(max_rel_error(a.at("model.embed_tokens.weight"), other.at("model.embed_tokens.weight")), 0.1);
  // A_log within ln[1, 16], dt_bias = softplus⁻¹(dt) with dt in [1e-3, 0.1].
  const Tensor& alog = a.at("model.layers.0.self_attn.gdn_A_log");
  const Tensor& dtb = a.at("model.layers.0.self_attn.gdn_dt_bias");
  for (int64_t i = 0; i < alog.numel(); ++i) {
    EXPECT_GE(alog.data_as<float>()[i], 0.0f);
    EXPECT_LE(alog.data_as<float>()[i], std::log(16.0f) + 1e-6f);
    const float dt = std::log1p(std::exp(dtb.data_as<float>()[i]));
    EXPECT_GE(dt, 1e-3f * 0.999f);
    EXPECT_LE(dt, 0.1f * 1.001f);
  }
}

TEST(Config, JsonRoundTripAndValidation) {
  const ModelConfig c = preset_config("hydrahead-tiny");
  const ModelConfig back = config_from_json(config_to_json(c), "test");
  EXPECT_EQ(config_to_json(back).dump(), config_to_json(c).dump());
  nlohmann::json bad = config_to_json(c);
  bad["fa_heads"][1] = {2, 9};
  EXPECT_NE(error_of([&] { config_from_json(bad, "m.h5"); }).find("m.h5: config: layer 1 names FA head 9, but heads are 0..3"),
            std::string::npos);
  bad = config_to_json(c);
  bad["num_attention_heads"] = 5;
  EXPECT_NE(error_of([&] { config_from_json(bad, "m.h5"); }).find("not a multiple"), std::string::npos);
}

// The fusion variant travels in the config ("fusion"); a config without it (older files) is
// scale_norm; an unknown name or a teacher with a fusion is refused by name; a teacher's JSON has
// no key.
TEST(Config, FusionRoundTripsAndDefaultsToScaleNorm) {
  for (const ops::Fusion fusion : ops::kFusions) {
    ModelConfig c = preset_config("hydrahead-tiny");
    c.fusion = fusion;
    const nlohmann::json j = config_to_json(c);
    EXPECT_EQ(j.at("fusion"), ops::fusion_name(fusion));
    EXPECT_EQ(config_from_json(j, "test").fusion, fusion);
    EXPECT_NE(c.summary().find(std::string("fusion ") + ops::fusion_name(fusion)), std::string::npos) << c.summary();
  }
  nlohmann::json j = config_to_json(preset_config("hydrahead-tiny"));
  j.erase("fusion");
  EXPECT_EQ(config_from_json(j, "old.h5").fusion, ops::Fusion::scale_norm);
  j["fusion"] = "gating";
  EXPECT_EQ(error_of([&] { config_from_json(j, "m.h5"); }),
            "m.h5: config: unknown fusion 'gating' (expected scale_norm, norm, scale, concat or gate)");
  j["fusion"] = 3;
  EXPECT_EQ(error_of([&] { config_from_json(j, "m.h5"); }), "m.h5: fusion is not a string");
  EXPECT_FALSE(config_to_json(preset_config("qwen3-tiny")).contains("fusion"));
  ModelConfig teacher = preset_config("qwen3-tiny");
  teacher.fusion = ops::Fusion::gate;
  EXPECT_NE(error_of([&] { teacher.validate(); }).find("a qwen3 teacher has no fusion"), std::string::npos);
}

TEST(HfConfig, AcceptsOldAndNewTransformersLayouts) {
  const nlohmann::json old_style = {{"model_type", "qwen3"}, {"vocab_size", 100}, {"hidden_size", 64},
                                    {"num_hidden_layers", 2}, {"num_attention_heads", 4}, {"num_key_value_heads", 2},
                                    {"intermediate_size", 96}, {"rope_theta", 1000000.0}, {"torch_dtype", "bfloat16"},
                                    {"rope_scaling", nullptr}, {"tie_word_embeddings", true}};
  const ModelConfig a = config_from_hf_json(old_style, "config.json");
  EXPECT_EQ(a.head_dim, 16);  // hidden / heads when head_dim is absent
  EXPECT_EQ(a.rope_theta, 1e6);
  EXPECT_TRUE(a.tie_word_embeddings);
  nlohmann::json new_style = old_style;
  new_style.erase("rope_theta");
  new_style["rope_parameters"] = {{"rope_theta", 5000.0}, {"rope_type", "default"}};
  new_style["head_dim"] = 32;
  new_style.erase("num_key_value_heads");
  const ModelConfig b = config_from_hf_json(new_style, "config.json");
  EXPECT_EQ(b.rope_theta, 5000.0);
  EXPECT_EQ(b.head_dim, 32);
  EXPECT_EQ(b.num_kv_heads, 4);  // defaults to MHA
  nlohmann::json bad = old_style;
  bad["model_type"] = "llama";
  EXPECT_NE(error_of([&] { config_from_hf_json(bad, "c.json"); }).find("model_type 'llama' is not supported"), std::string::npos);
  bad = old_style;
  bad["attention_bias"] = true;
  EXPECT_NE(error_of([&] { config_from_hf_json(bad, "c.json"); }).find("attention_bias"), std::string::npos);
  bad = old_style;
  bad["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  EXPECT_NE(error_of([&] { config_from_hf_json(bad, "c.json"); }).find("RoPE type 'yarn'"), std::string::npos);
  bad = old_style;
  bad.erase("hidden_size");
  EXPECT_NE(error_of([&] { config_from_hf_json(bad, "c.json"); }).find("missing or malformed"), std::string::npos);
}

TEST(ModelCheckpoint, ShapeAndTypeMismatchesAreNamed) {
  TempDir dir;
  const ModelConfig c = preset_config("qwen3-tiny");
  NamedTensors params = random_parameters(c, 1);
  write_model_checkpoint(dir.file("ok.h5"), c, params);
  EXPECT_NO_THROW(read_model_checkpoint(dir.file("ok.h5")));
  NamedTensors wrong = params;
  wrong["model.norm.weight"] = random_tensor({c.hidden_size + 1}, 2);
  write_checkpoint(dir.file("shape.h5"), config_to_json(c).dump(), wrong);
  EXPECT_NE(error_of([&] { read_model_checkpoint(dir.file("shape.h5")); })
                .find("shape.h5: tensor 'model.norm.weight' has shape [129], the config needs [128]"),
            std::string::npos);
  wrong = params;
  wrong["model.norm.weight"] = Tensor::zeros({c.hidden_size}, DType::i32);
  write_checkpoint(dir.file("type.h5"), config_to_json(c).dump(), wrong);
  EXPECT_NE(error_of([&] { read_model_checkpoint(dir.file("type.h5")); }).find("is int32, expected float32 or bfloat16"),
            std::string::npos);
  wrong = params;
  wrong.erase("lm_head.weight");
  write_checkpoint(dir.file("missing.h5"), config_to_json(c).dump(), wrong);
  EXPECT_NE(error_of([&] { read_model_checkpoint(dir.file("missing.h5")); }).find("tensor 'lm_head.weight' is missing"),
            std::string::npos);
}

TEST(Forward, HydraAndLayerwiseHybridsAreFiniteAndDeterministic) {
  ModelConfig hybrid = preset_config("qwen3-tiny");
  hybrid.arch = Arch::hydrahead;
  hybrid.num_layers = 4;
  hybrid.fa_heads = {{0, 1, 2, 3}, {}, {}, {0, 1, 2, 3}};  // all-FA and all-GDN layers
  for (const ModelConfig& c : {preset_config("hydrahead-tiny"), hybrid}) {
    const Model model(c, random_parameters(c, 11));
    const std::vector<int32_t> ids = some_ids(77, c.vocab_size);
    const Tensor a = full_logits(model, ids), b = full_logits(model, ids);
    EXPECT_EQ(count_non_finite(a), 0);
    EXPECT_EQ(max_rel_error(a, b), 0.0) << "forward must be deterministic";
    // Causality: changing the last token leaves every earlier position's logits unchanged.
    std::vector<int32_t> changed = ids;
    changed.back() = (changed.back() + 1) % static_cast<int32_t>(c.vocab_size);
    const Tensor d = full_logits(model, changed);
    EXPECT_EQ(max_rel_error(d.view().narrow(0, 0, 76), a.view().narrow(0, 0, 76)), 0.0);
    EXPECT_GT(max_rel_error(d.view().narrow(0, 76, 1), a.view().narrow(0, 76, 1)), 1e-4);
  }
}

}  // namespace
}  // namespace hydra::test
