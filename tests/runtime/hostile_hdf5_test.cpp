// HDF5 files whose headers declare more than they hold, or hold it elsewhere (issue 54: a 1.4 KB file
// declaring 2^40 chunked token ids made `hydra train` hash fill values until killed; 2^30 never-written
// ids trained as zeros; a weight stored chunked without data loaded as zeros; lzf-compressed ids were
// reported as a truncated file).
//
// Token files and checkpoint tensors are generated from a seed: declared length (1 … 4097, or 2^30,
// 2^40, 2^50, 2^50 + 1 elements), rank (1-D, 2-D, scalar), stored type (signed and unsigned, 1–8
// bytes, big-endian, float), layout (contiguous, chunked in chunks of 1 … 2n elements, compact),
// how much of it was written (all, none, a prefix), filters (gzip, shuffle, a filter this HDF5 cannot
// decode — "lzf", registered only while the file is written), and where its values live (this file,
// an external raw file, a virtual dataset mapping another file, an external link to another file).
// The oracle: a dataset whose every value is stored in the file itself reads back exactly (a prefix
// written into contiguous, compact or fully allocated chunked storage reads as the prefix and the
// stored zeros after it); anything else is a UserError — unwritten chunks, values in other files,
// undecodable filters, the wrong rank or type — and is raised from the dataset's header alone, so a
// file declaring 2^40 elements is refused at once (a regression that read it would run into the
// suite's timeout, not pass).
#include <hdf5.h>

#include <cstring>
#include <filesystem>
#include <random>

#include "model/model.h"
#include "model/params.h"
#include "runtime/token_file.h"
#include "runtime/token_identity.h"
#include "tests/common/test_util.h"

namespace hydra::test {
namespace {

namespace fs = std::filesystem;

// A filter with h5py's lzf id that copies its input: registered while a file is written with it,
// then unregistered, so the reader meets a filter its HDF5 cannot decode (as hydra does with h5py's lzf).
size_t pass_through(unsigned, size_t, const unsigned*, size_t nbytes, size_t*, void**) { return nbytes; }
constexpr H5Z_filter_t kFakeLzf = 32000;
const H5Z_class2_t kFakeLzfClass = {H5Z_CLASS_T_VERS, kFakeLzf, 1, 1, "lzf (test stand-in)", nullptr, nullptr,
                                    pass_through};

enum class Layout { contiguous, chunked, compact };
enum class Written { all, none, prefix };
enum class Store { here, external_file, virtual_dataset, external_link };
enum class Filter { none, gzip, shuffle_gzip, undecodable };

struct Spec {
  std::vector<hsize_t> dims;  // declared; {} is a scalar
  hid_t type = H5T_STD_I32LE;
  Layout layout = Layout::contiguous;
  hsize_t chunk = 1;
  Written written = Written::all;
  hsize_t prefix = 0;  // Written::prefix: elements [0, prefix) written
  Store store = Store::here;
  Filter filter = Filter::none;

  hsize_t n() const {
    hsize_t e = 1;
    for (hsize_t d : dims) e *= d;
    return e;
  }
  hsize_t written_elements() const { return written == Written::all ? n() : written == Written::none ? 0 : prefix; }
  std::string describe() const {
    std::string d;
    for (hsize_t x : dims) {
      if (!d.empty()) d += "x";
      d += std::to_string(x);
    }
    return fmt::format("dims [{}] type {} layout {} chunk {} written {} ({}) store {} filter {}", d,
                       H5Tget_size(type) * 8, static_cast<int>(layout), chunk, static_cast<int>(written),
                       written_elements(), static_cast<int>(store), static_cast<int>(filter));
  }
};

int64_t value_at(hsize_t i) { return static_cast<int64_t>((i * 7 + 3) % 16); }

bool is_integer(hid_t type) { return H5Tget_class(type) == H5T_INTEGER; }

// Whether every value of `s` lies in the file itself, readable: what the readers must accept.
bool holds_its_values(const Spec& s) {
  if (s.dims.size() != 1 || s.n() == 0 || s.n() > (hsize_t{1} << 50) || !is_integer(s.type)) return false;
  if (s.store != Store::here || s.filter == Filter::undecodable) return false;
  switch (s.layout) {
    case Layout::compact: return true;  // allocated when created
    case Layout::contiguous: return s.written_elements() > 0;  // allocated whole by the first write
    case Layout::chunked: {  // the chunks a write touched are allocated
      const hsize_t chunks = (s.n() + s.chunk - 1) / s.chunk;
      return (s.written_elements() + s.chunk - 1) / s.chunk == chunks;
    }
  }
  return false;
}

// Writes dataset `name` of `s` into the open file `file` (values value_at(i), as int64 in memory).
void write_dataset(hid_t file, const std::string& name, const Spec& s, const std::string& dir) {
  const hsize_t rank = s.dims.size();
  const hid_t space = rank == 0 ? H5Screate(H5S_SCALAR) : H5Screate_simple(static_cast<int>(rank), s.dims.data(), nullptr);
  const hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  if (s.layout == Layout::chunked && rank > 0) {
    std::vector<hsize_t> chunk(rank, 1);
    chunk[0] = s.chunk;
    H5Pset_chunk(dcpl, static_cast<int>(rank), chunk.data());
    if (s.filter == Filter::shuffle_gzip) H5Pset_shuffle(dcpl);
    if (s.filter == Filter::gzip || s.filter == Filter::shuffle_gzip) H5Pset_deflate(dcpl, 4);
    if (s.filter == Filter::undecodable) H5Pset_filter(dcpl, kFakeLzf, H5Z_FLAG_MANDATORY, 0, nullptr);
  } else if (s.layout == Layout::compact) {
    H5Pset_layout(dcpl, H5D_COMPACT);
  }
  const hsize_t bytes = s.n() * H5Tget_size(s.type);
  if (s.store == Store::external_file) {
    H5Pset_external(dcpl, (dir + "/" + name + ".raw").c_str(), 0, bytes);
  } else if (s.store == Store::virtual_dataset || s.store == Store::external_link) {
    // The values in another file, whole.
    const std::string other = dir + "/" + name + ".other.h5";
    const hid_t f2 = H5Fcreate(other.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    Spec here = s;
    here.store = Store::here;
    here.layout = Layout::contiguous;
    here.written = Written::all;
    here.filter = Filter::none;
    write_dataset(f2, "x", here, dir);
    H5Fclose(f2);
    if (s.store == Store::external_link) {
      H5Lcreate_external(other.c_str(), "x", file, name.c_str(), H5P_DEFAULT, H5P_DEFAULT);
      H5Pclose(dcpl);
      H5Sclose(space);
      return;
    }
    H5Pset_virtual(dcpl, space, other.c_str(), "x", space);
  }
  const hid_t d = H5Dcreate2(file, name.c_str(), s.type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  ASSERT_GE(d, 0) << s.describe();
  const hsize_t count = s.store == Store::virtual_dataset ? 0 : s.written_elements();
  if (count > 0) {
    std::vector<int64_t> values(static_cast<size_t>(count));
    for (hsize_t i = 0; i < count; ++i) values[i] = value_at(i);
    const hid_t memory = H5Screate_simple(1, &count, nullptr);
    const hid_t selected = H5Dget_space(d);
    if (rank == 0) {
      H5Sselect_all(selected);
    } else {
      const hsize_t start = 0;
      std::vector<hsize_t> starts(rank, 0), counts(s.dims);
      counts[0] = count / (s.n() / s.dims[0]);
      (void)start;
      H5Sselect_hyperslab(selected, H5S_SELECT_SET, starts.data(), nullptr, counts.data(), nullptr);
    }
    ASSERT_GE(H5Dwrite(d, H5T_NATIVE_INT64, memory, selected, H5P_DEFAULT, values.data()), 0) << s.describe();
    H5Sclose(selected);
    H5Sclose(memory);
  }
  H5Dclose(d);
  H5Pclose(dcpl);
  H5Sclose(space);
}

// A token file of `s` as `input_ids`.
void write_token_spec(const std::string& path, const Spec& s) {
  ASSERT_GE(H5Zregister(&kFakeLzfClass), 0);
  const hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  write_dataset(f, "input_ids", s, fs::path(path).parent_path().string());
  H5Fclose(f);
  ASSERT_GE(H5Zunregister(kFakeLzf), 0);
}

// A seeded hostile spec (see the file comment).
Spec random_spec(uint64_t seed) {
  std::mt19937_64 rng(seed * 7919 + 17);
  const auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  Spec s;
  const bool huge = pick(7) == 0;
  const hsize_t huge_sizes[] = {hsize_t{1} << 30, hsize_t{1} << 40, hsize_t{1} << 50, (hsize_t{1} << 50) + 1};
  const hsize_t small_sizes[] = {1, 7, 64, 1000, 4097};
  const hsize_t n = huge ? huge_sizes[pick(4)] : small_sizes[pick(5)];
  const size_t shape = pick(20);
  s.dims = shape == 0 ? std::vector<hsize_t>{} : shape == 1 && n % 2 == 0 && !huge ? std::vector<hsize_t>{2, n / 2}
                                                                                : std::vector<hsize_t>{n};
  const hid_t types[] = {H5T_STD_I32LE, H5T_STD_I64LE, H5T_STD_U8LE, H5T_STD_U16BE, H5T_STD_I16LE, H5T_STD_U64LE,
                         H5T_STD_I32BE, H5T_IEEE_F32LE};
  s.type = types[pick(8)];
  s.layout = huge ? (pick(4) == 0 ? Layout::contiguous : Layout::chunked)
                  : static_cast<Layout>(pick(s.n() * 8 <= 60000 && !s.dims.empty() ? 3 : 2));
  if (s.dims.empty() && s.layout == Layout::chunked) s.layout = Layout::contiguous;  // a scalar has no chunks
  s.chunk = 1 + rng() % (huge ? (hsize_t{1} << 20) : std::max<hsize_t>(1, 2 * n));
  if (s.layout == Layout::chunked && s.dims.size() == 2) s.chunk = std::min<hsize_t>(s.chunk, s.dims[0]);
  if (s.layout == Layout::chunked && !s.dims.empty()) s.chunk = std::min<hsize_t>(s.chunk, s.dims[0]);
  // Never write much of a huge dataset (a sparse file of terabytes): none, or a prefix of chunked storage.
  s.written = huge ? (s.layout == Layout::chunked && pick(2) ? Written::prefix : Written::none)
                   : static_cast<Written>(pick(3));
  s.prefix = s.written != Written::prefix ? 0 : huge ? std::min<hsize_t>(1 + rng() % 4096, s.chunk * 3) : 1 + rng() % n;
  if (s.dims.size() != 1 && s.written == Written::prefix) s.written = Written::all;  // whole rows only
  if (!huge && s.layout == Layout::contiguous && pick(8) == 0) {
    s.store = Store::external_file;
  } else if (!huge && pick(10) == 0) {
    s.store = pick(2) ? Store::virtual_dataset : Store::external_link;
  }
  if (s.layout == Layout::chunked) s.filter = static_cast<Filter>(pick(4));
  if (s.store == Store::virtual_dataset) s.layout = Layout::contiguous, s.filter = Filter::none;
  return s;
}

// Reads the token file every way hydra does; returns "" or the first wrong value found.
// (The oracle's values are made after the reader opened the file: a file declaring 2^40 ids must be
// refused from its header before anything that large exists.) For contiguous storage written in part,
// the bytes after the prefix are whatever the file holds there: only the prefix is compared, and the
// rest may be refused for its values (an id outside the vocabulary).
std::string read_tokens_every_way(const std::string& path, const Spec& s) {
  const hsize_t n = s.n();
  const TokenReader reader(path, 16);
  if (reader.length() != static_cast<int64_t>(n)) return fmt::format("length {}", reader.length());
  if (n > (hsize_t{1} << 20)) return fmt::format("a reader opened {} declared ids", n);
  const bool undefined_tail = s.layout == Layout::contiguous && s.written == Written::prefix;
  std::vector<int32_t> expected(static_cast<size_t>(n), 0);
  for (hsize_t i = 0; i < s.written_elements(); ++i) expected[i] = static_cast<int32_t>(value_at(i));
  std::vector<int32_t> ids(static_cast<size_t>(n));
  reader.read_ids(0, ids);
  if (undefined_tail) std::copy(ids.begin() + static_cast<std::ptrdiff_t>(s.prefix), ids.end(),
                                expected.begin() + static_cast<std::ptrdiff_t>(s.prefix));
  if (ids != expected) return "TokenReader's ids";
  if (read_token_file(path, 16) != expected) return "read_token_file's ids";
  const TokenFileIdentity id = compute_token_file_identity(path);
  if (id.tokens != static_cast<int64_t>(n)) return "the identity's token count";
  token_file_sample(path);
  return "";
}

TEST(HostileHdf5, TokenFilesReadExactlyOrAreRefused) {
  TempDir dir;
  int read = 0, refused = 0;
  for (uint64_t seed = 0; seed < 400; ++seed) {
    const Spec s = random_spec(seed);
    const std::string sub = dir.file(std::to_string(seed));
    fs::create_directories(sub);
    const std::string path = sub + "/t.h5";
    write_token_spec(path, s);
    const bool valid = holds_its_values(s);
    std::string outcome;
    try {
      outcome = read_tokens_every_way(path, s);
      outcome = outcome.empty() ? "read" : "wrong " + outcome;
    } catch (const UserError& e) {
      outcome = std::string("refused: ") + e.what();
    } catch (const std::exception& e) {
      outcome = std::string("failed: ") + e.what();
    }
    const bool either = s.layout == Layout::contiguous && s.written == Written::prefix;  // the tail's bytes decide
    if (valid && !(either && outcome.rfind("refused: ", 0) == 0)) {
      EXPECT_EQ(outcome, "read") << "seed " << seed << ": " << s.describe();
      read += outcome == "read";
    } else {
      EXPECT_EQ(outcome.rfind("refused: ", 0), 0u) << "seed " << seed << ": " << s.describe() << ": " << outcome;
      refused += outcome.rfind("refused: ", 0) == 0;
    }
  }
  std::printf("[ hostile ] 400 token files: %d read exactly, %d refused\n", read, refused);
  EXPECT_GT(read, 50);
  EXPECT_GT(refused, 100);
}

// The probe's files by name: the message says what is wrong, from the header alone.
TEST(HostileHdf5, TheProbesFilesAreRefusedNamingTheProblem) {
  TempDir dir;
  struct Case {
    std::string name;
    Spec spec;
    std::string needle;
  };
  Spec chunked40{.dims = {hsize_t{1} << 40}, .layout = Layout::chunked, .chunk = 1024, .written = Written::none};
  Spec chunked30{.dims = {hsize_t{1} << 30}, .layout = Layout::chunked, .chunk = 4096, .written = Written::none};
  Spec partial{.dims = {4096}, .layout = Layout::chunked, .chunk = 256, .written = Written::prefix, .prefix = 300};
  Spec lzf{.dims = {64}, .layout = Layout::chunked, .chunk = 16, .filter = Filter::undecodable};
  Spec external{.dims = {64}, .store = Store::external_file};
  Spec vds{.dims = {64}, .store = Store::virtual_dataset};
  Spec link{.dims = {64}, .store = Store::external_link};
  const std::vector<Case> cases = {
      {"2^40 chunked ids never written", chunked40, "holds 0 of its 1073741824 chunks"},
      {"2^30 chunked ids never written", chunked30, "holds 0 of its 262144 chunks"},
      {"chunks after the 2nd never written", partial, "holds 2 of its 16 chunks"},
      {"lzf-compressed ids", lzf, "filter 32000"},
      {"values in an external raw file", external, "keeps its values in other files"},
      {"a virtual dataset", vds, "is a virtual dataset"},
      {"an external link", link, "is a link to another file"}};
  for (const Case& c : cases) {
    const std::string path = dir.file(std::to_string(&c - cases.data()) + ".h5");
    write_token_spec(path, c.spec);
    const std::string error = error_of([&] { TokenReader(path, 16); });
    EXPECT_NE(error.find(c.needle), std::string::npos) << c.name << ": " << error;
    EXPECT_NE(error.find(path), std::string::npos) << c.name << ": " << error;
    if (c.spec.filter == Filter::undecodable) {
      EXPECT_EQ(error.find("truncated"), std::string::npos) << error;
    }
    EXPECT_NE(error_of([&] { compute_token_file_identity(path); }), "(no error)") << c.name;
    EXPECT_NE(error_of([&] { token_file_length(path); }), "(no error)") << c.name;
  }
}

// A checkpoint tensor stored every way: read exactly, or refused.
TEST(HostileHdf5, CheckpointTensorsReadExactlyOrAreRefused) {
  TempDir dir;
  ModelConfig c = preset_config("qwen3-tiny");
  const NamedTensors params = random_parameters(c, 5);
  const std::string victim = "model.norm.weight";  // [hidden]
  const int64_t hidden = params.at(victim).numel();
  int read = 0, refused = 0;
  for (uint64_t seed = 0; seed < 120; ++seed) {
    Spec s = random_spec(seed + 1000);
    s.dims = {static_cast<hsize_t>(hidden)};
    s.type = seed % 3 == 0 ? H5T_IEEE_F32LE : seed % 3 == 1 ? H5T_IEEE_F32BE : H5T_IEEE_F64LE;
    if (s.layout == Layout::chunked) s.chunk = 1 + seed % static_cast<uint64_t>(hidden);
    if (s.written == Written::prefix) s.prefix = 1 + seed % static_cast<uint64_t>(hidden);
    if (s.store == Store::virtual_dataset) s.layout = Layout::contiguous;
    const std::string path = dir.file(fmt::format("m{}.h5", seed));
    write_model_checkpoint(path, c, params);
    ASSERT_GE(H5Zregister(&kFakeLzfClass), 0);
    const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(H5Ldelete(f, victim.c_str(), H5P_DEFAULT), 0);
    fs::create_directories(dir.file(fmt::format("m{}", seed)));
    write_dataset(f, victim, s, dir.file(fmt::format("m{}", seed)));
    H5Fclose(f);
    ASSERT_GE(H5Zunregister(kFakeLzf), 0);
    Spec as_float = s;
    as_float.type = H5T_STD_I32LE;  // holds_its_values asks for an integer type; the tensor is a float
    const bool valid = holds_its_values(as_float) && s.type != H5T_IEEE_F64LE;  // f64 is not a weight type
    std::string outcome;
    try {
      const LoadedCheckpoint loaded = read_model_checkpoint(path);
      const float* v = loaded.params.at(victim).data_as<float>();
      outcome = "read";
      const bool undefined_tail = s.layout == Layout::contiguous && s.written == Written::prefix;
      for (int64_t i = 0; i < hidden; ++i) {
        if (undefined_tail && static_cast<hsize_t>(i) >= s.prefix) continue;  // the file's bytes there
        const float want = static_cast<hsize_t>(i) < s.written_elements() ? static_cast<float>(value_at(i)) : 0.0f;
        if (v[i] != want) outcome = fmt::format("wrong value {} at {}, expected {}", v[i], i, want);
      }
    } catch (const UserError& e) {
      outcome = std::string("refused: ") + e.what();
    } catch (const std::exception& e) {
      outcome = std::string("failed: ") + e.what();
    }
    // A contiguous tensor written in part holds the file's old bytes after the prefix: NaN there is refused.
    const bool either = s.layout == Layout::contiguous && s.written == Written::prefix;
    if (valid && !(either && outcome.rfind("refused: ", 0) == 0)) {
      EXPECT_EQ(outcome, "read") << "seed " << seed << ": " << s.describe();
      read += outcome == "read";
    } else {
      EXPECT_EQ(outcome.rfind("refused: ", 0), 0u) << "seed " << seed << ": " << s.describe() << ": " << outcome;
      refused += outcome.rfind("refused: ", 0) == 0;
    }
  }
  std::printf("[ hostile ] 120 checkpoints: %d read exactly, %d refused\n", read, refused);
  EXPECT_GT(read, 10);
  EXPECT_GT(refused, 10);
}

}  // namespace
}  // namespace hydra::test
