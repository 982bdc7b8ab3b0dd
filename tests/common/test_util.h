// Shared helpers for the GoogleTest suites: random inputs, error measures, temp dirs, and running
// the hydra binary. Tolerances are stated at each use with their reason.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/tensor.h"

namespace hydra {
class Model;
}  // namespace hydra

namespace hydra::test {

// GPU-vs-CPU tests: a device copy (bf16 unless said otherwise) and a host f32 copy.
Tensor gpu(const TensorView& host_f32, DType dtype = DType::bf16);
Tensor host(const TensorView& t);
// Small host index vectors (slots, lengths, positions).
Tensor int32_vector(const std::vector<int32_t>& v);

// n made-up token ids in [0, vocab): id i = (i·step + offset) mod vocab, for i, step, offset ≥ 0. The
// tests' prompts and windows: deterministic, and spread over the vocabulary when step is prime to it.
std::vector<int32_t> strided_ids(int64_t n, int64_t vocab, int64_t step, int64_t offset);
Tensor int64_vector(const std::vector<int64_t>& v);
// Logits [T, V] f32 of a full forward over `ids` on one process without a cache: what decode and
// generation are held to.
Tensor full_logits(const Model& model, const std::vector<int32_t>& ids);

// Host f32 tensor with N(0, scale²) entries drawn from `seed` (counter-based: reproducible).
Tensor random_tensor(std::initializer_list<int64_t> shape, uint64_t seed, float scale = 1.0f);
Tensor random_tensor(std::span<const int64_t> shape, uint64_t seed, float scale = 1.0f);
// Uniform in [lo, hi).
Tensor uniform_tensor(std::initializer_list<int64_t> shape, uint64_t seed, float lo, float hi);

// Number of NaN/Inf entries of a host f32 or f64 view (checked before any comparison).
int64_t count_non_finite(const TensorView& v);
// max |a − b| / max |b| over all entries (host f32 views of equal shape).
double max_rel_error(const TensorView& a, const TensorView& b);

// Fails the test (with `what`) if `actual` has non-finite values or differs from `expected` by more
// than `tolerance` in max_rel_error.
// ‖actual − expected‖₂ / ‖expected‖₂ over all elements (host f32/f64 views): the RMS-ratio
// measure of gradient comparisons.
double norm_rel_error(const TensorView& actual, const TensorView& expected);
void expect_close(const TensorView& actual, const TensorView& expected, double tolerance, const std::string& what);

// A fresh directory under the system temp dir, removed with everything in it at scope exit.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::filesystem::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
  double seconds = 0;
};
// Runs a shell command, capturing its output.
CommandResult run_command(const std::string& command);
// The bytes of a file ("" when it cannot be read).
std::string read_all(const std::string& path);
// Path of the built hydra binary (set by CMake; HYDRA_TEST_BINARY overrides it, to run the CLI
// tests against another build) and of the test fixtures.
std::string hydra_binary();
// `hydra ARGS` in one process, as a user types it.
CommandResult hydra(const std::string& args);
// A user error: exit 2, a "hydra: error" line, and `needle` in the output. (Under mpirun other
// ranks' lines may surround it; the single-process CLI tests check for exactly one line.)
void expect_user_error(const CommandResult& r, const std::string& needle);
std::string fixture_dir();
// The message of the UserError `f` throws, or "(no error)": for checks on user-facing errors.
std::string error_of(const std::function<void()>& f);

// Usable CUDA devices (0 in CPU-only builds or without a GPU).
int cuda_devices();
// GPU tests call this first: without a GPU they report SKIPPED (CTest: "Not Run"), never pass.
#define HYDRA_REQUIRE_GPU()                                                                        \
  do {                                                                                           \
    if (::hydra::test::cuda_devices() == 0) GTEST_SKIP() << "no CUDA device: GPU test skipped";  \
  } while (0)

// Host f32 copy of `t` rounded to bf16 (what a bf16 device tensor holds), and the device copy.
Tensor rounded_to_bf16(const TensorView& t);

// `mpirun` prefix for P ranks with the flags a root-run container needs (oversubscribe etc.).
std::string mpirun(int ranks);
// `args` on 2 ranks, rank r started in DIR/rR (files given by relative path are that rank's own:
// a different file behind the same path on each rank).
CommandResult hydra_per_rank_dirs(const TempDir& dir, const std::string& args);

}  // namespace hydra::test
