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
// The cache: a verified identity is kept in the cache folder (set_token_identity_cache_dir; hydra sets
// $HYDRA_CACHE_DIR, default $XDG_CACHE_HOME/hydra, else ~/.cache/hydra, at start, launch/cli.cpp)
// under token-identity/<XXH3 of the absolute path>.json, with the file's size,
// inode, device, mtime and ctime (nanoseconds). It is reused only when all five equal the file's
// now: any write, copy, rename over or touch of the file changes its ctime (which no user call can
// set back), so a stale entry is never used; the identity is then computed again (and cached).
// An unwritable cache directory only costs the pass on every start (a warning says so).
// A cache never changes what trains: each entry carries an XXH3 of its own fields (the window index:
// of its key and counts), and an entry that does not verify — damaged, cut, edited, replaced by a
// folder or a link to a non-file, of another kind — is ignored and computed again, never an error.
// (The checksum finds damage and stray writes; it is not a signature. The trainer still compares
// each step's counted targets with the index and names a cached index that disagrees.)
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace hydra {

struct TokenFileIdentity {
  std::string fingerprint;  // the text above
  int64_t tokens = 0;
  int64_t min_id = 0, max_id = 0;
};

// One streamed pass over the file (UserError naming the file when it cannot be read). With
// `window_seq_len` > 0 and a masked or documented file, the same pass counts the targets of every
// window of that length (runtime/token_file.h count_window_targets) into `window_index`: a first
// start reads the file once for both.
TokenFileIdentity compute_token_file_identity(const std::string& path, int64_t window_seq_len = 0,
                                              std::vector<int32_t>* window_index = nullptr);

// The datasets whose fields differ between two fingerprints, comma-separated ("" when equal).
std::string token_identity_difference(const std::string& a, const std::string& b);

// The cached identity when the cache entry is fresh (see above), else computed and cached.
// `reused`: whether the cache answered. With `window_seq_len` > 0, a computed identity's pass also
// builds the window index of that length for a masked or documented file and caches it (below), so
// the data loader finds it there instead of reading the mask again.
TokenFileIdentity token_file_identity(const std::string& path, bool* reused = nullptr, int64_t window_seq_len = 0);

// The window index cache: counted targets per window of a file's windows of `seq_len` tokens, under
// token_identity_cache_dir()/token-index/, keyed by the content identity and seq_len (equal contents
// give the same index, so an entry is never stale): the int32 counts, then the XXH3 of the key and
// the counts (8 bytes, little-endian). An entry of another size, whose checksum does not verify, or
// with a count outside [0, seq_len] is ignored (nullopt: the caller counts again).
std::optional<std::vector<int32_t>> load_window_index(const std::string& identity, int64_t seq_len, int64_t windows);
// Written atomically; an unwritable cache is a warning (the next start counts again).
void store_window_index(const std::string& identity, int64_t seq_len, const std::vector<int32_t>& index,
                        const std::string& file_for_messages);

// A cheap check that two copies hold the same data (each rank of a job computes it on its own copy,
// and the ranks compare): the datasets' types and lengths and XXH3 of 16 windows of 4096 tokens
// (ids and mask) spread over the file, its first and last. Reads ~0.4 MB whatever the file's size.
std::string token_file_sample(const std::string& path);

// XXH3 of a file's bytes (runtime/content_hash.h hash_file: what the model and teacher are bound to),
// cached like the identity above (token_identity_cache_dir()/file-hash/, the same five-field stamp),
// so a repeated start or a --resume does not read a large model once more per rank to hash it.
uint64_t cached_file_hash(const std::string& path, bool* reused = nullptr);

// The folder of the cache (created on demand), set once at start by the launcher, which reads the
// environment (launch/cli.cpp); empty, as it is until set (a library caller's), caches nothing: the
// identity is computed and the window index counted on every call.
void set_token_identity_cache_dir(std::string dir);
const std::string& token_identity_cache_dir();

}  // namespace hydra
