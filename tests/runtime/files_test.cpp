// HDF5 checkpoints and safetensors: round trips, atomic writes, and the errors a user sees for
// bad files (missing, not HDF5, wrong format, newer version, truncated safetensors).
#include <hdf5.h>

#include <cstring>
#include <fstream>

#include "runtime/atomic_file.h"
#include "runtime/checkpoint.h"
#include "runtime/safetensors.h"
#include "runtime/token_file.h"
#include "tests/common/test_util.h"

namespace hydra::test {
namespace {

TEST(Checkpoint, RoundTripKeepsValuesTypesAndAttributes) {
  TempDir dir;
  NamedTensors tensors;
  tensors.emplace("a.weight", random_tensor({3, 5}, 1));
  tensors.emplace("b", to(random_tensor({7}, 2), Device::host, DType::bf16));
  Tensor ids = Tensor::empty({4}, DType::i64);
  for (int i = 0; i < 4; ++i) ids.data_as<int64_t>()[i] = int64_t{1} << (30 + i);
  tensors.emplace("ids", ids);
  // float64 (the training shards of the CPU's fp64 mode): stored as float64, not as int64 bits.
  tensors.emplace("wide", to(random_tensor({5}, 3), Device::host, DType::f64));
  write_checkpoint(dir.file("c.h5"), R"({"x": 1})", tensors);
  const CheckpointReader reader(dir.file("c.h5"));
  EXPECT_EQ(reader.config_json(), R"({"x": 1})");
  EXPECT_EQ(reader.names(), (std::vector<std::string>{"a.weight", "b", "ids", "wide"}));
  EXPECT_EQ(reader.info("b").dtype, DType::bf16);
  expect_close(reader.read("a.weight", DType::f32), tensors.at("a.weight"), 0.0, "f32 round trip");
  const Tensor b = reader.read("b", DType::bf16);
  for (int i = 0; i < 7; ++i) EXPECT_EQ(b.data_as<bf16>()[i].bits, tensors.at("b").data_as<bf16>()[i].bits);
  const H5File raw = H5File::open_read(dir.file("c.h5"));
  const Tensor ids_back = raw.read("ids");
  for (int i = 0; i < 4; ++i) EXPECT_EQ(ids_back.data_as<int64_t>()[i], ids.data_as<int64_t>()[i]);
  const Tensor wide = raw.read("wide");
  ASSERT_EQ(wide.dtype(), DType::f64);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(wide.data_as<double>()[i], tensors.at("wide").data_as<double>()[i]);
}

TEST(Checkpoint, FailedWriteLeavesExistingFileAndNoTemporary) {
  TempDir dir;
  const std::string path = dir.file("model.h5");
  NamedTensors good;
  good.emplace("w", random_tensor({2, 2}, 3));
  write_checkpoint(path, "{}", good);
  const auto size_before = std::filesystem::file_size(path);
  NamedTensors bad;
  bad.emplace("w", random_tensor({2, 2}, 4));
  bad.emplace("w/x", random_tensor({2}, 5));  // needs "w" to be a group: fails after "w" is written
  EXPECT_THROW(write_checkpoint(path, "{}", bad), Error);
  EXPECT_EQ(std::filesystem::file_size(path), size_before);
  expect_close(CheckpointReader(path).read("w", DType::f32), good.at("w"), 0.0, "old contents intact");
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    ++files;
    EXPECT_EQ(e.path().filename(), "model.h5");
  }
  EXPECT_EQ(files, 1);
}

TEST(Checkpoint, BadFilesGiveOneLineErrorsNamingTheFile) {
  TempDir dir;
  EXPECT_NE(error_of([&] { CheckpointReader r(dir.file("missing.h5")); }).find("missing.h5: HDF5 file does not exist"),
            std::string::npos);
  std::ofstream(dir.file("text.h5")) << "not hdf5 at all";
  EXPECT_NE(error_of([&] { CheckpointReader r(dir.file("text.h5")); }).find("text.h5: not an HDF5 file"), std::string::npos);
  {
    H5File f = H5File::create(dir.file("other.h5"));
    f.set_attribute("format", std::string("something-else"));
    f.close();
  }
  EXPECT_NE(error_of([&] { CheckpointReader r(dir.file("other.h5")); }).find("wrong format 'something-else'"),
            std::string::npos);
  {
    H5File f = H5File::create(dir.file("newer.h5"));
    f.set_attribute("format", std::string(kCheckpointFormat));
    f.set_attribute("format_version", int64_t{kCheckpointVersion + 1});
    f.set_attribute("config", std::string("{}"));
    f.close();
  }
  EXPECT_NE(error_of([&] { CheckpointReader r(dir.file("newer.h5")); }).find("is newer than this hydra understands"),
            std::string::npos);
  {
    H5File f = H5File::create(dir.file("version0.h5"));
    f.set_attribute("format", std::string(kCheckpointFormat));
    f.set_attribute("format_version", int64_t{0});
    f.set_attribute("config", std::string("{}"));
    f.close();
  }
  const std::string v0 = error_of([&] { CheckpointReader r(dir.file("version0.h5")); });
  EXPECT_NE(v0.find("format version 0 is not a version any hydra wrote"), std::string::npos) << v0;
  EXPECT_EQ(v0.find("newer"), std::string::npos) << v0;
  {
    H5File f = H5File::create(dir.file("plain.h5"));
    f.close();
  }
  EXPECT_NE(error_of([&] { CheckpointReader r(dir.file("plain.h5")); }).find("not a hydrahead checkpoint"),
            std::string::npos);
}

// Writes every string attribute of a checkpoint as h5py writes a Python str: a variable-length
// UTF-8 string, on the root (format, config) and on the bf16 dataset (dtype = "bfloat16").
void write_checkpoint_as_h5py(const std::string& path, const std::vector<uint16_t>& bits) {
  const hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(file, 0);
  const hid_t str = H5Tcopy(H5T_C_S1);
  H5Tset_size(str, H5T_VARIABLE);
  H5Tset_cset(str, H5T_CSET_UTF8);
  const hid_t scalar = H5Screate(H5S_SCALAR);
  auto put_string = [&](hid_t object, const char* name, const char* value) {
    const hid_t attr = H5Acreate2(object, name, str, scalar, H5P_DEFAULT, H5P_DEFAULT);
    ASSERT_GE(H5Awrite(attr, str, &value), 0);
    H5Aclose(attr);
  };
  put_string(file, "format", kCheckpointFormat);
  put_string(file, "config", "{}");
  const int64_t version = kCheckpointVersion;
  const hid_t version_attr = H5Acreate2(file, "format_version", H5T_STD_I64LE, scalar, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(version_attr, H5T_NATIVE_INT64, &version);
  H5Aclose(version_attr);
  const hsize_t n = bits.size();
  const hid_t space = H5Screate_simple(1, &n, nullptr);
  const hid_t dataset = H5Dcreate2(file, "w", H5T_STD_U16LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(H5Dwrite(dataset, H5T_NATIVE_UINT16, H5S_ALL, H5S_ALL, H5P_DEFAULT, bits.data()), 0);
  put_string(dataset, "dtype", "bfloat16");
  H5Dclose(dataset);
  H5Sclose(space);
  H5Sclose(scalar);
  H5Tclose(str);
  H5Fclose(file);
}

// At 2fc8691: the root attributes were read, but the dataset's variable-length
// `dtype` was not, and the bf16 tensor was refused ("unsupported element type (class 0, 2 bytes)").
TEST(Checkpoint, ReadsBf16WhoseDtypeAttributeIsAVariableLengthString) {
  TempDir dir;
  const std::vector<uint16_t> bits = {0x3f80, 0xbf80, 0x4049, 0x0001, 0x7f7f};
  write_checkpoint_as_h5py(dir.file("h5py.h5"), bits);
  const CheckpointReader reader(dir.file("h5py.h5"));
  EXPECT_EQ(reader.config_json(), "{}");
  ASSERT_EQ(reader.info("w").dtype, DType::bf16);
  const Tensor w = reader.read("w", DType::bf16);
  for (size_t i = 0; i < bits.size(); ++i) EXPECT_EQ(w.data_as<bf16>()[i].bits, bits[i]) << i;
}

void write_safetensors(const std::string& path, const std::string& header, size_t data_bytes) {
  std::ofstream out(path, std::ios::binary);
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
  out << header;
  for (size_t i = 0; i < data_bytes; ++i) out.put(static_cast<char>(i & 0x7f));
}

TEST(Safetensors, ReadsConvertsAndRejectsTruncation) {
  TempDir dir;
  // Two F16 values 1.0 (0x3c00) and -2.5 (0xc100), then one BF16 1.5 (0x3fc0).
  {
    std::ofstream out(dir.file("ok.safetensors"), std::ios::binary);
    const std::string header =
        R"({"h":{"dtype":"F16","shape":[2],"data_offsets":[0,4]},"b":{"dtype":"BF16","shape":[1,1],"data_offsets":[4,6]},"__metadata__":{"format":"pt"}})";
    const uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
    out << header;
    const unsigned char data[6] = {0x00, 0x3c, 0x00, 0xc1, 0xc0, 0x3f};
    out.write(reinterpret_cast<const char*>(data), 6);
  }
  const SafetensorsFile f(dir.file("ok.safetensors"));
  const Tensor h = f.read("h", DType::f32);
  EXPECT_EQ(h.data_as<float>()[0], 1.0f);
  EXPECT_EQ(h.data_as<float>()[1], -2.5f);
  EXPECT_EQ(f.read("b", DType::f32).data_as<float>()[0], 1.5f);
  EXPECT_EQ(half_to_float(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal

  write_safetensors(dir.file("short.safetensors"), R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 10);
  EXPECT_NE(error_of([&] { SafetensorsFile s(dir.file("short.safetensors")); }).find("truncated safetensors file: tensor 'w'"),
            std::string::npos);
  write_safetensors(dir.file("header.safetensors"), R"({"w":{"dtype":"F32",)", 0);
  EXPECT_NE(error_of([&] { SafetensorsFile s(dir.file("header.safetensors")); }).find("header is not JSON"),
            std::string::npos);
  std::ofstream(dir.file("tiny.safetensors")) << "abc";
  EXPECT_NE(error_of([&] { SafetensorsFile s(dir.file("tiny.safetensors")); }).find("truncated"), std::string::npos);
}

// The writer: what it writes the reader reads back bit for bit (a strided view included), the data
// section starts at a multiple of 8, and the bytes are laid out as the format says.
TEST(Safetensors, WriterRoundTripsAndAligns) {
  TempDir dir;
  const Tensor a = random_tensor({3, 5}, 11);
  const Tensor b = to(random_tensor({7}, 12), Device::host, DType::bf16);
  const Tensor c = random_tensor({4, 6}, 13);
  const int64_t shape_t[2] = {6, 4}, strides_t[2] = {1, 6};
  const TensorView c_t(c.data(), DType::f32, Device::host, shape_t, strides_t);  // c transposed: not contiguous
  const std::string path = dir.file("w.safetensors");
  {
    SafetensorsWriter w(path, {{"a", DType::f32, {3, 5}}, {"b", DType::bf16, {7}}, {"c_t", DType::f32, {6, 4}}},
                        {{"format", "pt"}});
    w.write(a);
    w.write(b);
    w.write(c_t);
    EXPECT_EQ(w.data_bytes(), 15u * 4 + 7 * 2 + 24 * 4);
    w.close();
  }
  const SafetensorsFile f(path);
  EXPECT_EQ(f.entries().at("b").dtype, "BF16");
  EXPECT_EQ(f.entries().at("b").begin, 60u);
  EXPECT_EQ(f.entries().at("c_t").shape, (std::vector<int64_t>{6, 4}));
  expect_close(f.read("a", DType::f32), a, 0.0, "f32");
  const Tensor rb = f.read("b", DType::bf16);
  for (int i = 0; i < 7; ++i) EXPECT_EQ(rb.data_as<bf16>()[i].bits, b.data_as<bf16>()[i].bits);
  expect_close(f.read("c_t", DType::f32), clone(c_t), 0.0, "strided view");
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), {});
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<unsigned char>(bytes[static_cast<size_t>(i)]);
  EXPECT_EQ((8 + n) % 8, 0u);
  EXPECT_EQ(bytes[8], '{');
  EXPECT_EQ(bytes.size(), 8 + n + 15 * 4 + 7 * 2 + 24 * 4);
  float first = 0;
  std::memcpy(&first, bytes.data() + 8 + n, 4);  // raw little-endian data right after the header
  EXPECT_EQ(first, a.data_as<float>()[0]);
}

TEST(TokenFile, ValidatesIdsAndShape) {
  TempDir dir;
  write_token_file(dir.file("t.h5"), {1, 2, 3});
  EXPECT_EQ(read_token_file(dir.file("t.h5"), 10), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_NE(error_of([&] { read_token_file(dir.file("t.h5"), 3); }).find("token id 3 at position 2 is outside the vocabulary [0, 3)"),
            std::string::npos);
  {
    H5File f = H5File::create(dir.file("empty.h5"));
    f.write("input_ids", Tensor::empty({0}, DType::i32));
    f.close();
  }
  EXPECT_NE(error_of([&] { read_token_file(dir.file("empty.h5"), 10); }).find("input is empty"), std::string::npos);
  {
    H5File f = H5File::create(dir.file("float.h5"));
    f.write("input_ids", random_tensor({4}, 1));
    f.close();
  }
  EXPECT_NE(error_of([&] { read_token_file(dir.file("float.h5"), 10); }).find("expected int32 or int64"), std::string::npos);
}

}  // namespace
}  // namespace hydra::test
