// The hydra binary as a user meets it: --help everywhere, and bad input answered with one line
// "hydra: error: ..." naming the problem and the file, exit code 2, no crash, and no output file
// left behind.
#include <filesystem>
#include <fstream>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "model/model.h"
#include "model/params.h"
#include "runtime/checkpoint.h"
#include "runtime/token_file.h"
#include "tests/common/test_util.h"

namespace hydra::test {
namespace {

namespace fs = std::filesystem;

// A single process's user error: exactly one line of output, "hydra: error ..." with `needle`.
void expect_one_line_error(const CommandResult& r, const std::string& needle) {
  expect_user_error(r, needle);
  EXPECT_EQ(r.output.rfind("hydra: error", 0), 0u) << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
}

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = dir_.file("tiny.h5");
    const ModelConfig c = preset_config("hydrahead-tiny");
    write_model_checkpoint(model_, c, random_parameters(c, 1));
    tokens_ = dir_.file("tokens.h5");
    write_token_file(tokens_, {1, 5, 9, 200, 3, 7, 0, 255});
  }
  TempDir dir_;
  std::string model_, tokens_;
};

TEST_F(Cli, HelpForEveryCommand) {
  const CommandResult top = hydra("--help");
  EXPECT_EQ(top.exit_code, 0);
  for (const char* cmd : {"init", "import", "export", "info", "forward", "convert"}) {
    EXPECT_NE(top.output.find(cmd), std::string::npos) << cmd;
    const CommandResult r = hydra(std::string(cmd) + " --help");
    EXPECT_EQ(r.exit_code, 0) << cmd << ": " << r.output;
    EXPECT_NE(r.output.find("usage: hydra " + std::string(cmd)), std::string::npos) << r.output;
  }
}

TEST_F(Cli, InitInfoForwardWork) {
  const std::string out = dir_.file("init.h5");
  ASSERT_EQ(hydra("init --preset qwen3-tiny --weight-seed 5 --out " + out).exit_code, 0);
  const CommandResult info = hydra("info " + out + " --tensors");
  EXPECT_EQ(info.exit_code, 0) << info.output;
  EXPECT_NE(info.output.find("qwen3: 2 layers, D=128"), std::string::npos) << info.output;
  EXPECT_NE(info.output.find(": Qwen3 teacher (hydrahead-checkpoint v1)"), std::string::npos) << info.output;
  EXPECT_NE(info.output.find("model.layers.1.mlp.down_proj.weight"), std::string::npos);
  const CommandResult fwd = hydra("forward --model " + model_ + " --input " + tokens_ + " --output " + dir_.file("logits.h5"));
  EXPECT_EQ(fwd.exit_code, 0) << fwd.output;
  EXPECT_NE(fwd.output.find("\"tokens\":8"), std::string::npos) << fwd.output;
  EXPECT_TRUE(fs::exists(dir_.file("logits.h5")));
}

TEST_F(Cli, UnknownCommandFlagAndPreset) {
  expect_one_line_error(hydra("frobnicate"), "unknown command 'frobnicate'");
  expect_one_line_error(hydra("forward --modle x.h5"), "unrecognised option '--modle'");
  // A stray word (here a path without its flag) is refused, not ignored.
  const std::string stray = dir_.file("stray.h5");
  expect_one_line_error(hydra("init --preset qwen3-tiny " + model_ + " --out " + stray), "too many positional options");
  EXPECT_FALSE(fs::exists(stray));
  const std::string out = dir_.file("never.h5");
  expect_one_line_error(hydra("init --preset qwen9 --out " + out), "unknown preset 'qwen9'");
  EXPECT_FALSE(fs::exists(out));
}

TEST_F(Cli, MissingUnreadableAndNonHdf5Files) {
  const std::string out = dir_.file("out.h5");
  expect_one_line_error(hydra("forward --model " + dir_.file("nope.h5") + " --seq-len 8 --output " + out),
                    dir_.file("nope.h5") + ": model file does not exist");
  std::ofstream(dir_.file("junk.h5")) << "junk";
  expect_one_line_error(hydra("forward --model " + dir_.file("junk.h5") + " --seq-len 8 --output " + out),
                    dir_.file("junk.h5") + ": not an HDF5 file");
  expect_one_line_error(hydra("info " + dir_.file("junk.h5")), "not an HDF5 file");
  if (getuid() != 0) {  // root reads anything; the permission check only means something for users
    fs::permissions(model_, fs::perms::none);
    expect_one_line_error(hydra("forward --model " + model_ + " --seq-len 8"), "not readable");
  }
  EXPECT_FALSE(fs::exists(out));
}

TEST_F(Cli, WrongFormatAndNewerVersion) {
  {
    H5File f = H5File::create(dir_.file("newer.h5"));
    f.set_attribute("format", std::string(kCheckpointFormat));
    f.set_attribute("format_version", int64_t{99});
    f.set_attribute("config", std::string("{}"));
    f.close();
  }
  expect_one_line_error(hydra("forward --model " + dir_.file("newer.h5") + " --seq-len 8"), "format version 99 is newer");
  expect_one_line_error(hydra("forward --model " + tokens_ + " --seq-len 8"), "not a hydrahead checkpoint");
}

TEST_F(Cli, BadTokensLeaveNoOutput) {
  const std::string out = dir_.file("logits.h5");
  write_token_file(dir_.file("big.h5"), {1, 2, 256});
  expect_one_line_error(hydra("forward --model " + model_ + " --input " + dir_.file("big.h5") + " --output " + out),
                    "big.h5: token id 256 at position 2 is outside the vocabulary [0, 256)");
  {
    H5File f = H5File::create(dir_.file("empty.h5"));
    f.write("input_ids", Tensor::empty({0}, DType::i64));
    f.close();
  }
  expect_one_line_error(hydra("forward --model " + model_ + " --input " + dir_.file("empty.h5") + " --output " + out),
                    "empty.h5: input is empty");
  EXPECT_FALSE(fs::exists(out));
  for (const auto& e : fs::directory_iterator(dir_.path())) {
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
  }
}

TEST_F(Cli, ImportErrorsNameTheFile) {
  const std::string out = dir_.file("imported.h5");
  const std::string src = fixture_dir() + "/hf/gqa_untied";
  // A truncated copy of the safetensors file.
  const std::string bad = dir_.file("truncated");
  fs::create_directories(bad);
  fs::copy_file(src + "/config.json", bad + "/config.json");
  {
    std::ifstream in(src + "/model.safetensors", std::ios::binary);
    std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream(bad + "/model.safetensors", std::ios::binary) << data.substr(0, data.size() - 1000);
  }
  expect_one_line_error(hydra("import --hf " + bad + " --out " + out), "model.safetensors: truncated safetensors file");
  // A config whose shape disagrees with the tensors.
  const std::string wrong = dir_.file("wrong");
  fs::create_directories(wrong);
  fs::copy_file(src + "/model.safetensors", wrong + "/model.safetensors");
  {
    std::ifstream in(src + "/config.json");
    std::string cfg((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    cfg.replace(cfg.find("\"intermediate_size\": 80"), 23, "\"intermediate_size\": 96");
    std::ofstream(wrong + "/config.json") << cfg;
  }
  expect_one_line_error(hydra("import --hf " + wrong + " --out " + out), "has shape [80, 48], the config needs [96, 48]");
  expect_one_line_error(hydra("import --hf " + dir_.file("none") + " --out " + out), "not a directory");
  EXPECT_FALSE(fs::exists(out));
  ASSERT_EQ(hydra("import --hf " + src + " --out " + out).exit_code, 0);
  EXPECT_TRUE(fs::exists(out));
}

TEST_F(Cli, ConvertChecksTeacherSpecAndCalibration) {
  const std::string teacher = dir_.file("teacher.h5"), out = dir_.file("student.h5");
  ASSERT_EQ(hydra("init --preset qwen3-tiny --weight-seed 2 --out " + teacher).exit_code, 0);
  expect_one_line_error(hydra("convert --teacher " + model_ + " --fa-heads uniform:1 --out " + out),
                    "is a hydrahead model; convert needs a Qwen3-shaped teacher");
  expect_one_line_error(hydra("convert --teacher " + teacher + " --fa-heads uniform:5 --out " + out),
                    "a budget of 5 FA heads per layer is not in 0..4");
  expect_one_line_error(hydra("convert --teacher " + teacher + " --fa-heads file:" + dir_.file("none.json") + " --out " + out),
                    "none.json: FA head set file does not exist");
  write_token_file(dir_.file("calib.h5"), {3, 1, 4, 1, 5, 9, 2, 6, 999});
  expect_one_line_error(hydra("convert --teacher " + teacher + " --fa-heads uniform:1 --calib " + dir_.file("calib.h5") + " --out " + out),
                    "calib.h5: token id 999 at position 8 is outside the vocabulary [0, 256)");
  EXPECT_FALSE(fs::exists(out));
  // Calibrated conversion gives the same gammas on 1 and 3 ranks.
  std::vector<int32_t> calib(120);
  for (size_t i = 0; i < calib.size(); ++i) calib[i] = static_cast<int32_t>((i * 13 + 5) % 256);
  write_token_file(dir_.file("calib.h5"), calib);
  const std::string args = " convert --teacher " + teacher + " --fa-heads layerwise:2 --calib " + dir_.file("calib.h5") + " --out ";
  ASSERT_EQ(hydra(args + dir_.file("s1.h5")).exit_code, 0);
  const CommandResult r3 = run_command(mpirun(3) + hydra_binary() + args + dir_.file("s3.h5"));
  ASSERT_EQ(r3.exit_code, 0) << r3.output;
  const CheckpointReader a(dir_.file("s1.h5")), b(dir_.file("s3.h5"));
  for (const char* g : {"model.layers.0.self_attn.fuse_gamma", "model.layers.1.self_attn.fuse_gamma"}) {
    expect_close(b.read(g, DType::f32), a.read(g, DType::f32), 1e-5, g);
    EXPECT_GT(a.read(g, DType::f32).data_as<float>()[0], 0.0f);
    EXPECT_NE(a.read(g, DType::f32).data_as<float>()[0], 1.0f);
  }
}

// Models for any vocabulary: a preset's shape with --vocab N, or an HF config.json / hydra config
// with --config (at 6777ccb a 1,000-id tokenizer's tokens were refused: "ids 5..998 outside [0, 256)").
TEST_F(Cli, ModelsForAnyVocabulary) {
  const std::string wide = dir_.file("wide.h5");
  ASSERT_EQ(hydra("init --preset hydrahead-tiny --vocab 1000 --out " + wide).exit_code, 0);
  EXPECT_NE(hydra("info " + wide).output.find("vocab 1000"), std::string::npos);
  write_token_file(dir_.file("wide-tokens.h5"), {5, 998, 17, 640, 3, 999, 0, 512});
  const CommandResult f = hydra("forward --model " + wide + " --input " + dir_.file("wide-tokens.h5"));
  EXPECT_EQ(f.exit_code, 0) << f.output;
  // The same shape and weights from the preset flags of any command: the same NLL.
  const CommandResult p = hydra("forward --preset hydrahead-tiny --vocab 1000 --input " + dir_.file("wide-tokens.h5"));
  ASSERT_EQ(p.exit_code, 0) << p.output;
  EXPECT_NE(p.output.find("\"model\":\"preset hydrahead-tiny (vocabulary 1000, weight seed 0)\""), std::string::npos) << p.output;
  const auto nll = [](const std::string& out) { return out.substr(out.find("\"mean_nll\""), 30); };
  EXPECT_EQ(nll(f.output), nll(p.output));
  // An HF Qwen3 config.json (transformers' keys, its defaults where absent) and hydra's own config.
  std::ofstream(dir_.file("config.json")) << R"({"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"],
      "vocab_size": 300, "hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
      "head_dim": 32, "intermediate_size": 96, "rope_theta": 10000, "tie_word_embeddings": true})";
  const std::string hf = dir_.file("hf.h5");
  ASSERT_EQ(hydra("init --config " + dir_.file("config.json") + " --vocab 320 --out " + hf).exit_code, 0);
  const CommandResult info = hydra("info " + hf);
  EXPECT_NE(info.output.find("qwen3: 1 layers, D=64, H=2, G=1, d=32, MLP 96, vocab 320, tied embeddings"), std::string::npos)
      << info.output;
  std::ofstream(dir_.file("own.json")) << config_to_json(preset_config("hydrahead-tiny")).dump();
  const CommandResult own = hydra("forward --config " + dir_.file("own.json") + " --seq-len 16");
  EXPECT_EQ(own.exit_code, 0) << own.output;
  expect_one_line_error(hydra("forward --model " + wide + " --vocab 300 --seq-len 8"), "--vocab goes with --preset or --config");
  expect_one_line_error(hydra("init --preset qwen3-tiny --config " + dir_.file("config.json") + " --out " + dir_.file("x.h5")),
                        "give one of --preset NAME or --config FILE.json");
  expect_one_line_error(hydra("forward --preset qwen3-tiny --vocab -3 --seq-len 8"), "--vocab must be a vocabulary size");
  std::ofstream(dir_.file("bad.json")) << R"({"model_type": "llama"})";
  expect_one_line_error(hydra("init --config " + dir_.file("bad.json") + " --out " + dir_.file("x.h5")), "bad.json");
  EXPECT_FALSE(fs::exists(dir_.file("x.h5")));
}

// forward's NLL line says which targets count: documents alone are not "the input's loss_mask"
// (6777ccb said so for a file with document_offsets and no loss_mask).
TEST_F(Cli, ForwardNamesWhatTheTargetsAre) {
  std::vector<int32_t> ids(24);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i * 7 % 256);
  write_token_data(dir_.file("docs.h5"), ids, {}, {0, 10, 18, 24});
  const CommandResult r = hydra("forward --model " + model_ + " --input " + dir_.file("docs.h5"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("over 21 targets (within its 3 documents: no target across a document boundary)"), std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("loss_mask"), std::string::npos) << r.output;
  std::vector<uint8_t> mask(24, 1);
  mask[5] = 0;
  write_token_data(dir_.file("masked.h5"), ids, mask, {0, 10, 18, 24});
  const CommandResult m = hydra("forward --model " + model_ + " --input " + dir_.file("masked.h5"));
  EXPECT_NE(m.output.find("over 20 targets (the input's loss_mask, within its 3 documents"), std::string::npos) << m.output;
}

// train --help says what a checkpoint holds now (step-N/ with manifest.json and the ranks' shards;
// 6777ccb still said state.h5), and --data takes corpus folders.
TEST_F(Cli, TrainHelpIsCurrent) {
  const CommandResult r = hydra("train --help");
  ASSERT_EQ(r.exit_code, 0);
  std::string text;  // the help's words, without boost's line wrapping
  for (const char c : r.output) {
    if (!std::isspace(static_cast<unsigned char>(c))) text += c;
    else if (!text.empty() && text.back() != ' ') text += ' ';
  }
  EXPECT_EQ(text.find("state.h5"), std::string::npos) << text;
  EXPECT_NE(text.find("manifest.json), the 'latest' pointer"), std::string::npos) << text;
  EXPECT_NE(text.find("folders of shards from cluster/tokenize_text.py"), std::string::npos) << text;
}

// convert --calib in windows of --calib-seq-len, at most --calib-tokens, with progress per window.
TEST_F(Cli, ConvertCalibratesInWindows) {
  const std::string teacher = dir_.file("teacher.h5");
  ASSERT_EQ(hydra("init --preset qwen3-tiny --weight-seed 2 --out " + teacher).exit_code, 0);
  std::vector<int32_t> calib(1000);
  for (size_t i = 0; i < calib.size(); ++i) calib[i] = static_cast<int32_t>((i * 13 + 5) % 256);
  write_token_data(dir_.file("calib.h5"), calib, {}, {0, 300, 1000});
  const CommandResult r = hydra("convert --teacher " + teacher + " --fa-heads uniform:1 --calib " + dir_.file("calib.h5") +
                                " --calib-seq-len 128 --calib-tokens 600 --device cpu --out " + dir_.file("s.h5"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("calibrating gamma over 512 tokens of " + dir_.file("calib.h5") + " in 4 window(s) of 128 on 1 "
                          "rank(s) (cpu)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("convert: teacher window 4/4"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("gamma from 512 calibration tokens"), std::string::npos) << r.output;
  expect_one_line_error(hydra("convert --teacher " + teacher + " --fa-heads uniform:1 --calib " + dir_.file("calib.h5") +
                              " --calib-seq-len 0 --out " + dir_.file("t.h5")), "--calib-seq-len must be at least 1");
}

}  // namespace
}  // namespace hydra::test
