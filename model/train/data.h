// Training data (DESIGN.md §4): one or more HDF5 token files, each a 1-D `input_ids` stream. Each
// file is cut into windows of seq_len + 1 tokens (a sequence and its next-token targets),
// consecutive windows overlapping by one token (stride seq_len), never crossing a file boundary.
// The windows of all files are visited in an order fixed by the seed: epoch e is a permutation of
// every window drawn from (seed, e), so window n of the run is a pure function of (seed, n) and the
// position in the data is one integer (part of the training state).
//
// A file's loss_mask, answer spans and document offsets (runtime/token_file.h) travel with its
// windows: a window's flags say which of its targets count and which are retrieval answers, and the
// document boundaries that fall inside it stay (the target that would cross one does not count; a
// window's first token starts its first, possibly partial, document).
//
// A micro-batch of windows is packed into one sequence (pack_windows): each window a document of its
// own (with the boundaries inside it), so it runs exactly as if alone (DESIGN.md §3.6) while the
// GPU sees one long sequence instead of one launch sequence per window.
//
// Nothing is read whole: the window index (file, offset, counted targets: 4 bytes a window)
// is built from the files' shapes and, for masked or documented files, one streamed pass over
// loss_mask and document_offsets; a window's ids and flags are read when a step needs them
// (runtime/token_file.h TokenReader), and a rank reads only the token ranges its zigzag rows need
// (StepWindows), the next step's while the current one runs. A rank's memory is O(batch) plus the
// index and one epoch's order (12 bytes a window), whatever the corpus size.
#pragma once

#include <cstdint>
#include <future>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "parallel/layout.h"
#include "runtime/token_file.h"

namespace hydra::train {

// One window: seq_len + 1 tokens and their flags (flag i belongs to the target token i).
struct Window {
  std::vector<int32_t> ids;      // [seq_len + 1]
  std::vector<uint8_t> counted;  // [seq_len + 1], or empty: every target counts (boundary crossings already 0)
  std::vector<uint8_t> answer;   // [seq_len + 1], or empty: no answers marked
  std::vector<int64_t> document_starts;  // 0 and the documents starting in (0, seq_len), or empty: one document
  TargetFlags flags() const { return {counted, answer}; }
};

// Windows packed into one sequence of Σ seq_len tokens (global order), ready for SequenceLayout::rows_of.
struct PackedBatch {
  std::vector<int32_t> ids, targets;   // targets −1 where not counted
  std::vector<uint8_t> answer;         // empty when no window marks answers
  std::vector<int64_t> document_starts;
  int64_t counted = 0;
};
PackedBatch pack_windows(const std::vector<Window>& windows);

// Blends: `--data a.h5:0.7,b.h5,c.h5:0.1`, or of corpora: `--data web/:0.7,code/:0.3`. A corpus is
// one token file, or a folder of shards written by cluster/tokenize_text.py (the folder or its
// manifest.json, which lists the shards by plain file names inside that folder): its shards' windows
// are one pool. Without any weight every corpus's windows are pooled (one permutation of all of them
// per epoch, as above). With weights, window n of the run comes from the corpus whose share is
// furthest behind its weight (Megatron's blending: the corpus c maximising w_c·(n + 1) − drawn_c, the
// lowest index on a tie), so after every window each corpus's count is within one window of w_c·n:
// any 1,000 consecutive windows follow the weights within 0.2%. Each corpus visits its own windows in
// its own order, a permutation per epoch drawn from (seed, corpus, epoch), and starts its next epoch
// alone when it is exhausted. A corpus without a weight shares the weight the others leave
// (1 − Σ given) in proportion to its windows; weights that all are given are normalised. The draws of
// a run are a pure function of (seed, weights, the corpora's windows): the training state stores the
// windows drawn from every corpus (data.h DataPosition) and --resume checks them against the replay.
struct DataSource {
  std::string path;
  double weight = -1;  // −1: none given (a corpus's weight, on each of its files)
  // The file's content identity (runtime/token_identity.h), or "": with one, the window index of a
  // masked or documented file is cached (token_identity_cache_dir()/token-index/, keyed by the
  // identity and seq_len: equal contents give the same index, so an entry is never stale).
  std::string identity;
  // The corpus the file belongs to, as the list named it ("web/", "a.h5"); "" : the file itself.
  // Consecutive sources with one corpus name form that corpus.
  std::string corpus;
};
// "a.h5:0.7,b.h5,web/:0.2" (a suffix ":W" that parses as a number is the weight; the path may hold
// ':'); a folder or a .json manifest becomes one source per shard (corpus_shards), labelled with the
// item as given. UserError for a weight that is not a positive number, or a bad manifest.
std::vector<DataSource> parse_data_sources(const std::string& list, const char* flag);
// The shards of a corpus folder (its manifest.json) or of a manifest file, in manifest order. The
// manifest's "shards" are plain file names in the manifest's folder: an absolute path, a '/' or '\\',
// "." or ".." and a name that resolves (through a link) outside the folder are refused, naming the entry.
std::vector<std::string> corpus_shards(const std::string& path, const char* flag);
// The corpus names of `sources` in order (each once), and the files of each.
std::vector<std::pair<std::string, std::vector<std::string>>> corpora_of(const std::vector<DataSource>& sources);

// Token ranges [begin, end) of a window's seq_len + 1 positions.
using TokenRanges = std::vector<std::pair<int64_t, int64_t>>;

class TokenWindows {
 public:
  // UserError when a file is unreadable, has a loss_mask or document_offsets that is not valid, or
  // holds no whole window. Ids are checked (in [0, vocab)) where a window is read.
  TokenWindows(const std::vector<std::string>& files, int64_t seq_len, uint64_t seed, int64_t vocab);
  // A blend when some source has a weight (see above); `shuffle` false: each file in its own order
  // (evaluation sets).
  TokenWindows(const std::vector<DataSource>& sources, int64_t seq_len, uint64_t seed, int64_t vocab, bool shuffle = true);

  bool blended() const { return !weights_.empty(); }
  const std::vector<double>& weights() const { return weights_; }  // per corpus, normalised; empty unless blended
  int64_t files() const { return static_cast<int64_t>(files_.size()); }
  const std::string& path(int64_t f) const { return files_[static_cast<size_t>(f)].path(); }
  // Corpora (a file given alone is its own, named by its path), in the order given.
  int64_t corpora() const { return static_cast<int64_t>(corpus_names_.size()); }
  const std::string& corpus_name(int64_t c) const { return corpus_names_[static_cast<size_t>(c)]; }
  // Windows of the first n of the run drawn from each corpus (blends; pooled data: empty).
  std::vector<int64_t> drawn(int64_t n) const;
  // The i-th evaluation window: file order (pooled), or the blend's i-th draw.
  int64_t evaluation_index(int64_t i) const { return blended() ? index_of(i) : i; }

  int64_t seq_len() const { return seq_len_; }
  int64_t count() const { return windows_; }  // windows per epoch
  int64_t tokens() const;  // tokens in the files
  bool masked() const;     // some file has a loss_mask
  // Whether some file's window index came from the cache (runtime/token_identity.h load_window_index,
  // its entry's checksum verified) rather than a count of the file.
  bool index_from_cache() const { return index_from_cache_; }
  // Every read is a pread (no HDF5 call): windows may be read on another thread.
  bool reads_on_any_thread() const;
  // The n-th window of the run (n ≥ 0): seq_len + 1 tokens.
  Window window(int64_t n) const { return window_in_order(index_of(n)); }
  // The i-th window in file order (evaluation: the same windows every time).
  Window window_in_order(int64_t i) const;
  // The same with only the positions in `ranges` read (ids, mask, answers); the others hold 0.
  // document_starts are always whole (the layout of a packed batch needs them).
  Window window_in_order(int64_t i, const TokenRanges& ranges) const;
  // The file-order index of window n of the run (calling thread only: it caches an epoch's order).
  int64_t index_of(int64_t n) const;
  // Targets of window n of the run that count (seq_len without a mask): the step's global count,
  // which the gradient is divided by, is known on every rank before any forward runs.
  int64_t counted_targets(int64_t n) const { return counted_targets_in_order(index_of(n)); }
  int64_t counted_targets_in_order(int64_t i) const;

 private:
  int64_t file_of(int64_t i) const;
  int64_t seq_len_ = 0;
  uint64_t seed_ = 0;
  int64_t windows_ = 0;
  std::vector<TokenReader> files_;
  std::vector<int64_t> first_window_;  // [files + 1]: file f holds windows [first_window_[f], first_window_[f+1])
  std::vector<std::string> corpus_names_;
  std::vector<int64_t> corpus_first_;  // [corpora + 1]: corpus c holds windows [corpus_first_[c], corpus_first_[c+1])
  std::vector<int32_t> counted_;       // [windows], or empty: every window counts seq_len targets
  bool index_from_cache_ = false;
  void open(const std::vector<std::string>& files, int64_t vocab);
  void build_index(const std::vector<std::string>& identities);
  mutable int64_t cached_epoch_ = -1;
  mutable std::vector<int64_t> order_;  // the permutation of cached_epoch_
  // Blends: the normalised weights, the draws made so far (cursor_ windows, drawn_ of each corpus)
  // and the picks of the most recent ones (window base_ + j is recent_[j]), each corpus's order.
  int64_t corpus_window(int64_t c, int64_t k) const;  // the k-th window drawn from corpus c
  int64_t corpus_of(int64_t i) const;  // the corpus holding window i
  void advance_to(int64_t n) const;
  std::vector<double> weights_;
  bool shuffle_ = true;
  mutable int64_t cursor_ = 0, base_ = 0;
  mutable std::vector<int64_t> drawn_, recent_;
  mutable std::vector<int64_t> corpus_epoch_;
  mutable std::vector<std::vector<int64_t>> corpus_order_;
};

// The windows of a replica's steps, each window holding the rows this rank computes (the token
// ranges its zigzag segments of the packed micro-batch need, runtime/../parallel/layout.h), read
// one step ahead: take() returns a step's micro-batches and starts reading the next step's on a
// thread (when every file reads without HDF5; otherwise the next take reads on the caller).
class StepWindows {
 public:
  struct Shape {
    int64_t batch_seqs = 1, grad_accum = 1, replicas = 1, replica = 0;
    int sp = 1, sp_rank = 0;  // the sequence group: ranks per packed micro-batch, this rank's place
  };
  StepWindows(const TokenWindows& data, const Shape& shape);
  ~StepWindows();  // waits for a read in flight
  StepWindows(const StepWindows&) = delete;
  StepWindows& operator=(const StepWindows&) = delete;
  // Micro-batch m holds windows position + (m·batch_seqs + b)·replicas + replica, b < batch_seqs.
  // `next` ≥ 0: the position of the step after, read ahead.
  std::vector<std::vector<Window>> take(int64_t position, int64_t next);

 private:
  using Batches = std::vector<std::vector<Window>>;
  Batches read(const std::vector<int64_t>& indices) const;
  std::vector<int64_t> indices_of(int64_t position) const;
  const TokenWindows& data_;
  Shape shape_;
  std::vector<TokenRanges> ranges_;  // [batch_seqs]: what this rank reads of the k-th window of a micro-batch
  int64_t ahead_position_ = -1;
  std::future<Batches> ahead_;
};

}  // namespace hydra::train
