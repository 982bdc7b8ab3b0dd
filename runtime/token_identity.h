// The content identity of a token file: what a training run is bound to is the tokens
// and their flags, not the file's bytes. HDF5 writes object timestamps and layout choices into a
// file, so the same data written twice (the same command and seed) differs in a few bytes; an XXH3
// of the bytes made --resume refuse it and a node with its own copy fail the ranks' agreement.
//
// The fingerprint names, in this order, each dataset a run reads — input_ids, loss_mask,
// document_offsets, answer_start, answer_length —, absent or with its stored integer type and length
// and an XXH3 (runtime/content_hash.h) of its values (ids as int32, the mask as uint8, offsets and
// spans as int64, little-endian):
//   "v1; input_ids:int32:500000000 1f0c…; loss_mask:uint8:500000000 9a3e…; document_offsets:absent; …"
// Two files with equal datasets agree whatever else they hold, and a mismatch names the datasets. Computing it reads the file once (streamed, bounded memory); it also yields the ids'
// range, so a vocabulary check costs nothing afterwards.
//
// The cache: a verified identity is kept in $HYDRA_CACHE_DIR (default $XDG_CACHE_HOME/hydra, else
// ~/.cache/hydra) under token-identity/<XXH3 of the absolute path>.json, with the file's size,
// inode, device, mtime and ctime (nanoseconds). It is reused only when all five equal the file's
// now: any write, copy, rename over or touch of the file changes its ctime (which no user call can
// set back), so a stale entry is never used; the identity is then computed again (and cached).
// An unwritable cache directory only costs the pass on every start (a warning says so).
#pragma once

#include <cstdint>
#include <string>

namespace hydra {

struct TokenFileIdentity {
  std::string fingerprint;  // the text above
  int64_t tokens = 0;
  int64_t min_id = 0, max_id = 0;
};

// One streamed pass over the file (UserError naming the file when it cannot be read).
TokenFileIdentity compute_token_file_identity(const std::string& path);

// The datasets whose fields differ between two fingerprints, comma-separated ("" when equal).
std::string token_identity_difference(const std::string& a, const std::string& b);

// The cached identity when the cache entry is fresh (see above), else computed and cached.
// `reused`: whether the cache answered.
TokenFileIdentity token_file_identity(const std::string& path, bool* reused = nullptr);

// A cheap check that two copies hold the same data (each rank of a job computes it on its own copy,
// and the ranks compare): the datasets' types and lengths and XXH3 of 16 windows of 4096 tokens
// (ids and mask) spread over the file, its first and last. Reads ~0.4 MB whatever the file's size.
std::string token_file_sample(const std::string& path);

// The directory of the cache (created on demand).
std::string token_identity_cache_dir();

}  // namespace hydra
