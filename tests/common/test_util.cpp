#include "tests/common/test_util.h"

#include <cstdlib>

#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <random>

#include "model/model.h"
#include "parallel/self_communicator.h"
#include "runtime/random.h"
#if HYDRA_CUDA
#include "runtime/cuda_memory.h"
#endif

namespace hydra::test {

Tensor gpu(const TensorView& host_f32, DType dtype) { return to(host_f32, Device::cuda, dtype); }
Tensor host(const TensorView& t) { return to(t, Device::host, DType::f32); }

std::vector<int32_t> strided_ids(int64_t n, int64_t vocab, int64_t step, int64_t offset) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = static_cast<int32_t>((i * step + offset) % vocab);
  return ids;
}

Tensor int32_vector(const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::i32);
  std::copy(v.begin(), v.end(), t.data_as<int32_t>());
  return t;
}

Tensor int64_vector(const std::vector<int64_t>& v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::i64);
  std::copy(v.begin(), v.end(), t.data_as<int64_t>());
  return t;
}

Tensor full_logits(const Model& model, const std::vector<int32_t>& ids) {
  SelfCommunicator self;
  const int64_t t = static_cast<int64_t>(ids.size());
  ForwardContext context{self, SequenceLayout::zigzag(t, 1, 0)};
  const Tensor hidden = model.forward(context, TensorView(const_cast<int32_t*>(ids.data()), DType::i32, Device::host, {t}));
  Tensor logits = Tensor::empty({t, model.config().vocab_size}, DType::f32);
  model.lm_head(logits, hidden);
  return logits;
}

Tensor random_tensor(std::span<const int64_t> shape, uint64_t seed, float scale) {
  Tensor t = Tensor::empty(shape, DType::f32);
  const RandomStream rng{seed, 0x7e57};
  float* p = t.data_as<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = scale * static_cast<float>(rng.normal(static_cast<uint64_t>(i)));
  return t;
}

Tensor random_tensor(std::initializer_list<int64_t> shape, uint64_t seed, float scale) {
  return random_tensor(std::span<const int64_t>(shape.begin(), shape.size()), seed, scale);
}

Tensor uniform_tensor(std::initializer_list<int64_t> shape, uint64_t seed, float lo, float hi) {
  Tensor t = Tensor::empty(shape, DType::f32);
  const RandomStream rng{seed, 0x0f0f};
  float* p = t.data_as<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = lo + (hi - lo) * static_cast<float>(rng.uniform(static_cast<uint64_t>(i)));
  return t;
}

namespace {
// Test output goes to pipes (tee, CI logs), where stdout is block-buffered: a test process that dies
// would take its last few kilobytes of printed measurements with it. Line buffering keeps every
// finished line. Runs during static initialisation, before anything is printed.
[[maybe_unused]] const bool line_buffered_stdout = std::setvbuf(stdout, nullptr, _IOLBF, 0) == 0;

// Visits every element of a host f32 or f64 view (any strides) in row-major order, as double. A
// device view or another dtype is a bug in the test: reading a device pointer on the host would
// crash the whole process, reading f64 storage as f32 would compare bit patterns.
template <class F>
void for_each_element(const TensorView& v, F&& f) {
  HYDRA_ASSERT(v.on_host() && (v.dtype() == DType::f32 || v.dtype() == DType::f64),
               "test helpers read host f32/f64 views; got {} {} on the {}", dtype_name(v.dtype()), v.shape_string(),
               v.on_host() ? "host" : "device");
  std::array<int64_t, kMaxRank> idx{};
  const bool f64 = v.dtype() == DType::f64;
  for (int64_t i = 0; i < v.numel(); ++i) {
    int64_t offset = 0;
    for (int d = 0; d < v.rank(); ++d) offset += idx[d] * v.stride(d);
    f(i, f64 ? static_cast<const double*>(v.data())[offset] : static_cast<double>(static_cast<const float*>(v.data())[offset]));
    for (int d = v.rank() - 1; d >= 0; --d) {
      if (++idx[d] < v.size(d)) break;
      idx[d] = 0;
    }
  }
}

std::vector<float> flatten(const TensorView& v) {
  std::vector<float> out(static_cast<size_t>(v.numel()));
  for_each_element(v, [&](int64_t i, double x) { out[static_cast<size_t>(i)] = static_cast<float>(x); });
  return out;
}
}  // namespace

int64_t count_non_finite(const TensorView& v) {
  int64_t n = 0;
  for_each_element(v, [&](int64_t, double x) { n += std::isfinite(x) ? 0 : 1; });
  return n;
}

double norm_rel_error(const TensorView& actual, const TensorView& expected) {
  HYDRA_ASSERT(actual.numel() == expected.numel(), "norm_rel_error of {} vs {} elements", actual.numel(), expected.numel());
  std::vector<double> a, e;
  for_each_element(actual, [&](int64_t, double x) { a.push_back(x); });
  for_each_element(expected, [&](int64_t, double x) { e.push_back(x); });
  double diff = 0, ref = 0;
  for (size_t i = 0; i < e.size(); ++i) {
    diff += (a[i] - e[i]) * (a[i] - e[i]);
    ref += e[i] * e[i];
  }
  return std::sqrt(diff / std::max(ref, 1e-300));
}

double max_rel_error(const TensorView& a, const TensorView& b) {
  const std::vector<float> x = flatten(a), y = flatten(b);
  double diff = 0, scale = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(x[i]) - y[i]));
    scale = std::max(scale, std::abs(static_cast<double>(y[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

void expect_close(const TensorView& actual, const TensorView& expected, double tolerance, const std::string& what) {
  ASSERT_EQ(actual.rank(), expected.rank()) << what;
  for (int d = 0; d < actual.rank(); ++d) ASSERT_EQ(actual.size(d), expected.size(d)) << what << " dim " << d;
  ASSERT_EQ(count_non_finite(actual), 0) << what << ": non-finite values";
  ASSERT_EQ(count_non_finite(expected), 0) << what << ": non-finite reference values";
  const double err = max_rel_error(actual, expected);
  EXPECT_LE(err, tolerance) << what << ": max relative error " << err;
}

TempDir::TempDir() {
  std::random_device rd;
  path_ = std::filesystem::temp_directory_path() / ("hydra-test-" + std::to_string(rd()) + std::to_string(rd()));
  std::filesystem::create_directories(path_);
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

CommandResult run_command(const std::string& command) {
  CommandResult r;
  const auto start = std::chrono::steady_clock::now();
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (!pipe) return r;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) r.output.append(buf.data(), n);
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "(no error)";
}

int cuda_devices() {
#if HYDRA_CUDA
  static const int count = cuda_device_count();
  return count;
#else
  return 0;
#endif
}

Tensor rounded_to_bf16(const TensorView& t) { return to(to(t, Device::host, DType::bf16), Device::host, DType::f32); }

std::string hydra_binary() {
  const char* other = std::getenv("HYDRA_TEST_BINARY");  // run the CLI tests against another build
  return other && *other ? other : HYDRA_BINARY;
}

CommandResult hydra(const std::string& args) { return run_command(hydra_binary() + " " + args); }

void expect_user_error(const CommandResult& r, const std::string& needle) {
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("hydra: error"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(needle), std::string::npos) << "expected '" << needle << "' in: " << r.output;
}

std::string fixture_dir() { return HYDRA_FIXTURE_DIR; }

std::string mpirun(int ranks) {
  return "env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 " HYDRA_MPIEXEC
         " --oversubscribe -np " + std::to_string(ranks) + " ";
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

CommandResult hydra_per_rank_dirs(const TempDir& dir, const std::string& args) {
  return run_command("timeout 120 " + mpirun(2) + "sh -c 'cd " + dir.path().string() +
                     "/r$OMPI_COMM_WORLD_RANK && exec " + hydra_binary() + " " + args + "'");
}

}  // namespace hydra::test
