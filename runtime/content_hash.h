// Content fingerprints: a fast 64-bit hash (xxHash XXH3, ~10+ GB/s per core, so hashing a model or
// a token file costs little next to reading it) of a file's bytes or a tensor's values. Used where
// the same path may hold other bytes: the ranks of a job compare their inputs' fingerprints before
// the first collective (a stale copy on one node), --resume compares them with those stored in the
// training state, and state.h5 stores one per dataset to detect damage (DESIGN.md §4).
// Not a cryptographic hash: it detects accidents, not an adversary.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "runtime/tensor.h"

namespace hydra {

uint64_t hash_bytes(const void* data, size_t size);
// The bytes of a host tensor in row-major order (its dtype's bytes; a strided view is made contiguous first).
uint64_t hash_tensor(const TensorView& tensor);
// The bytes of a file, read in blocks; a UserError naming the file if it cannot be read.
uint64_t hash_file(const std::string& path);
// 16 lowercase hex digits.
std::string hash_hex(uint64_t hash);

}  // namespace hydra
