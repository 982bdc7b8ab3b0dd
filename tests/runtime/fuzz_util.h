// The mutation fuzzer shared by the reader fuzz suites (fuzz_readers_test.cpp: every reader of user
// files; fuzz_state_test.cpp: training manifests, `latest` and the caches; hostile_hdf5_test.cpp:
// HDF5 files whose headers declare more than they hold). Mutants of a seed input: truncated, with
// random bits flipped, with an "interesting" integer (0, −1, 2^31, 2^62, 2^63 − 1, ...) written over
// 1/2/4/8 bytes at a random offset, and for JSON inputs with a value replaced by one that is too
// large, negative, fractional or of the wrong type, or a span deleted or duplicated. The only outcomes
// allowed are success and a hydra::UserError; anything else (an internal error, a JSON library
// exception, bad_alloc, a crash, a sanitizer report) fails the test, naming the mutant so that it can
// be replayed (same stream, same index).
//
// Deterministic: the mutants are a function of (stream, index) alone. HYDRA_FUZZ_SCALE multiplies the
// counts for a longer local run, HYDRA_FUZZ_TRACE=1 prints every mutant's index before it is read.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "runtime/error.h"

namespace hydra::test::fuzzing {

using Bytes = std::string;

inline void write_all(const std::string& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

inline int scale() {
  const char* s = std::getenv("HYDRA_FUZZ_SCALE");
  return s ? std::max(1, std::atoi(s)) : 1;
}

inline constexpr int64_t kInteresting[] = {0,
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
inline const char* const kInterestingJson[] = {"1e300",
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
inline Bytes mutate_bytes(const Bytes& seed, uint64_t stream, int i) {
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
inline Bytes mutate_json(const Bytes& seed, uint64_t stream, int i) {
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
inline Outcome fuzz(const std::string& path, const Bytes& seed, uint64_t stream, int count, bool json,
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

inline void expect_clean(const Outcome& o, const char* what) {
  EXPECT_TRUE(o.failures.empty()) << what << ": " << o.failures.size() << "+ mutants ended with something other than a "
                                  << "UserError; first: " << (o.failures.empty() ? "" : o.failures.front());
  for (const std::string& f : o.failures) ADD_FAILURE() << what << ": " << f;
  EXPECT_GT(o.user_errors, 0) << what << ": no mutant was refused (is the fuzzer mutating anything?)";
  std::printf("[ fuzz ] %-14s %5d mutants: %5d read, %5d refused with a user error\n", what, o.ok + o.user_errors, o.ok,
              o.user_errors);
}


}  // namespace hydra::test::fuzzing
