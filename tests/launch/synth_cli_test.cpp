// hydra synth as a user runs it: the file `hydra train` reads, the same bytes for the same flags,
// the summary line, and bad flags refused with a message before anything is written.
#include <filesystem>
#include <sstream>

#include <nlohmann/json.hpp>

#include "model/train/synth.h"
#include "runtime/hdf5_file.h"
#include "runtime/token_file.h"
#include "tests/common/test_util.h"

namespace hydra::test {
namespace {

CommandResult hydra(const std::string& args) { return run_command(hydra_binary() + " synth " + args); }

// The last output line that is a JSON object.
nlohmann::json last_json_line(const std::string& output) {
  std::string last;
  std::stringstream in(output);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.front() == '{') last = line;
  }
  return nlohmann::json::parse(last);
}

TEST(SynthCli, WritesTheStreamTheLibraryMakes) {
  const TempDir dir;
  const std::string flags = "--task lm:0.5,mqar:0.25,single:0.25 --tokens 20K --seq-len 256 --vocab 512 --seed 3";
  const CommandResult a = hydra(flags + " --out " + dir.file("a.h5"));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const CommandResult b = hydra(flags + " --out " + dir.file("b.h5"));
  ASSERT_EQ(b.exit_code, 0) << b.output;
  const std::vector<int32_t> ids = read_token_file(dir.file("a.h5"), 512);
  EXPECT_EQ(ids, read_token_file(dir.file("b.h5"), 512));
  // 20K / 256 = 80 documents: 40 lm, 20 mqar, 20 single.
  const nlohmann::json j = last_json_line(a.output);
  EXPECT_EQ(j.at("documents").get<int64_t>(), 80);
  EXPECT_EQ(j.at("tokens").get<int64_t>(), 80 * 256 + 1);
  EXPECT_EQ(j.at("documents_per_kind").at("lm").get<int64_t>(), 40);
  EXPECT_EQ(j.at("documents_per_kind").at("mqar").get<int64_t>(), 20);
  EXPECT_EQ(j.at("documents_per_kind").at("single").get<int64_t>(), 20);
  synth::SynthConfig c;
  c.mixture = synth::parse_mixture("lm:0.5,mqar:0.25,single:0.25");
  c.documents = 80;
  c.seq_len = 256;
  c.vocab_size = 512;
  c.seed = 3;
  EXPECT_EQ(ids, synth::generate_stream(c).ids);
  const H5File f = H5File::open_read(dir.file("a.h5"));
  EXPECT_EQ(nlohmann::json::parse(f.string_attribute("config")).at("mqar").at("pairs").get<int64_t>(), 8);
  // Another seed, another stream.
  ASSERT_EQ(hydra("--task lm:0.5,mqar:0.25,single:0.25 --tokens 20K --seq-len 256 --vocab 512 --seed 4 --out " +
                  dir.file("c.h5")).exit_code, 0);
  EXPECT_NE(ids, read_token_file(dir.file("c.h5"), 512));
}

// The file says how it was made: the RULER families' knobs reach its config attribute.
TEST(SynthCli, ConfigRecordsTheRulerKnobs) {
  const TempDir dir;
  const CommandResult r = hydra(
      "--task multiquery,vartrack,cwe,fwe --tokens 2K --seq-len 128 --vocab 256 --key-length 1 --queries 2 --chains 2 "
      "--hops 1 --common-words 3 --common-freq 6 --uncommon-freq 2 --zipf-alpha 1.5 --fwe-words 20 --top-words 2 --out " +
      dir.file("r.h5"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json c =
      nlohmann::json::parse(H5File::open_read(dir.file("r.h5")).string_attribute("config")).at("retrieval");
  EXPECT_EQ(c.at("key_length").get<int64_t>(), 1);
  EXPECT_EQ(c.at("queries").get<int64_t>(), 2);
  EXPECT_EQ(c.at("chains").get<int64_t>(), 2);
  EXPECT_EQ(c.at("hops").get<int64_t>(), 1);
  EXPECT_EQ(c.at("common_words").get<int64_t>(), 3);
  EXPECT_EQ(c.at("common_freq").get<int64_t>(), 6);
  EXPECT_EQ(c.at("uncommon_freq").get<int64_t>(), 2);
  EXPECT_EQ(c.at("zipf_alpha").get<double>(), 1.5);
  EXPECT_EQ(c.at("fwe_words").get<int64_t>(), 20);
  EXPECT_EQ(c.at("top_words").get<int64_t>(), 2);
}

TEST(SynthCli, RefusesBadFlags) {
  const TempDir dir;
  const auto refused = [&](const std::string& flags, const std::string& needle) {
    const CommandResult r = hydra(flags + " --out " + dir.file("x.h5"));
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find(needle), std::string::npos) << "expected '" << needle << "' in: " << r.output;
    EXPECT_FALSE(std::filesystem::exists(dir.file("x.h5")));
  };
  refused("--task lm:1,bogus:1 --tokens 1K --seq-len 64 --vocab 128", "unknown synth task 'bogus'");
  refused("--task mqar --tokens 1K --seq-len 32 --vocab 128", "too short for mqar");
  refused("--task lm --tokens 10 --seq-len 64 --vocab 128", "at least one document");
  refused("--task single --tokens 1K --seq-len 64 --vocab 16", "too small for NIAH");
  refused("--task lm --tokens 1K --seq-len 64 --vocab 128 --value-length 3..x", "--value-length");
}

}  // namespace
}  // namespace hydra::test
