// Output files appear whole or not at all, and temporaries never outlive the process that made them.
//
// AtomicFile hands out a temporary path in the destination's directory (same filesystem, so the
// final rename is atomic): `.NAME.tmp-PID`. commit() renames it over the destination. If the object
// dies without commit() (an exception, a failed write), the temporary is removed and the destination
// is left exactly as it was: a failed `hydra convert --out model.h5` never destroys an existing model.h5.
//
// Interruptions. Every live temporary is listed in a fixed, lock-free registry (ScopedTemporary);
// install_cleanup_handlers() makes SIGTERM, SIGINT and SIGHUP (a Slurm time limit, Ctrl-C, a closed
// terminal) unlink them — async-signal-safe: only unlink/rmdir on paths stored beforehand — and then
// re-raise the signal with its default action, so the exit status still says which signal ended the
// process. The cleanup runs on the thread that installed the handlers (main's, which creates the
// temporaries; another thread that takes the signal forwards it there), and the handlers stay in
// force until it is done, so a second signal never ends the process half-way. A kill -9 cannot be caught: the next AtomicFile for the same destination sweeps the
// directory for `.NAME.tmp-PID` left by processes that no longer exist on this host (only that
// name's pattern, only in that directory; a live PID is never touched).
//
// Several outputs of one command (eval-niah's JSON lines and HDF5 copy, select-heads' heads.json and
// heads.h5) are committed together by an AtomicCommitGroup: while one is open on the stack, commit()
// of an AtomicFile only hands its temporary to the group; the group's commit() renames them all,
// restoring the previous destinations if a later rename fails, and a group that dies uncommitted
// removes every temporary. So the set appears whole or not at all.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace hydra {

// Registers `path` (a file, or a flat directory whose entries are removed with it) for removal
// when a cleanup signal arrives; unregistered by release() or the destructor. At most 64 at a time
// (an internal error beyond that); paths up to 4095 bytes.
class ScopedTemporary {
 public:
  enum class Kind { file, directory };
  ScopedTemporary() = default;
  ScopedTemporary(const std::string& path, Kind kind);
  ~ScopedTemporary() { release(); }
  ScopedTemporary(ScopedTemporary&& other) noexcept : slot_(other.slot_) { other.slot_ = -1; }
  ScopedTemporary& operator=(ScopedTemporary&& other) noexcept;
  ScopedTemporary(const ScopedTemporary&) = delete;
  ScopedTemporary& operator=(const ScopedTemporary&) = delete;
  void release();

 private:
  int slot_ = -1;
};

// SIGTERM, SIGINT, SIGHUP: remove the registered temporaries, then end as the signal would have.
// Called once by main() (after MPI_Init, so these handlers are the ones in force), on the thread
// that creates temporaries: the cleanup runs there (without this call, on whichever thread).
void install_cleanup_handlers();
// The same for one signal (async-signal-safe: runtime/stop_request.cpp calls it from its handler).
void install_cleanup_handler(int sig);

// Removes `.BASE.tmp-PID` entries of `directory` (files, or directories with everything in them)
// whose PID is not a live process on this host. BASE is `name`, or with `prefix_match` any name
// starting with `name` (the trainer's `.step-NNNNNN.tmp-PID`). Returns the paths removed.
std::vector<std::string> sweep_stale_temporaries(const std::string& directory, const std::string& name,
                                                 bool prefix_match = false);

// `.BASE.tmp-PID` of this process for `destination` (same directory).
std::string temporary_path_for(const std::string& destination);
// The destination a `.BASE.tmp-PID` path stands for (DIR/BASE), or `path` itself: for messages.
std::string destination_of(const std::string& path);

class AtomicCommitGroup;

class AtomicFile {
 public:
  explicit AtomicFile(std::string destination);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  const std::string& temp_path() const { return temp_; }
  const std::string& destination() const { return destination_; }
  // Renames the temporary over the destination (UserError naming it if that fails), or inside an
  // AtomicCommitGroup hands it to the group, which renames it with the others.
  void commit();

 private:
  friend class AtomicCommitGroup;
  std::string destination_;
  std::string temp_;
  ScopedTemporary registration_;
  bool committed_ = false;
};

// See the file comment. Groups do not nest; one per thread at a time.
class AtomicCommitGroup {
 public:
  AtomicCommitGroup();
  ~AtomicCommitGroup();
  AtomicCommitGroup(const AtomicCommitGroup&) = delete;
  AtomicCommitGroup& operator=(const AtomicCommitGroup&) = delete;
  // Renames every handed-over temporary to its destination, in order. If one rename fails, the
  // destinations already replaced get their previous contents back (or are removed if they did not
  // exist), every temporary is removed, and a UserError names the file that failed.
  void commit();

  // The open group of this thread (nullptr: none). Used by AtomicFile::commit().
  static AtomicCommitGroup* current();
  void adopt(AtomicFile& file);

 private:
  struct Pending {
    std::string destination, temp;
    ScopedTemporary registration;
  };
  std::vector<Pending> pending_;
  bool committed_ = false;
};

// Writes `text` to `path` through an AtomicFile; a failed write (disk full) is a UserError and leaves
// the old file (the trainer's `latest` pointer must never be left empty).
void write_text_atomically(const std::string& path, const std::string& text);

// Fails with a UserError naming `path` if it does not exist or cannot be read.
void require_readable_file(const std::string& path, const char* what);
// Fails with a UserError if the directory that would hold `path` does not exist or is not writable.
void require_writable_destination(const std::string& path, const char* what);
// Whether two paths name the same file (one file under two spellings, links included); false when
// either does not exist. An output that is also an input would replace what the command reads.
bool same_file(const std::string& a, const std::string& b);
// Fails with a UserError if output `path` is one of `inputs` (empty entries ignored): the output
// would replace a file the command reads.
void require_not_an_input(const std::string& path, const std::vector<std::string>& inputs, const char* flag);
// Whether `name` is a plain file name: not empty, not "." or "..", without '/' or NUL.
bool is_plain_name(const std::string& name);
// `folder`/`name` for a name read from a file that belongs to `folder` (`source`: that file, for
// messages; `what`: the entry, e.g. "shard 2's file"), when `name` is a plain name and the entry, if
// it is a symbolic link, resolves inside `folder`; a UserError naming `source`, `what` and the name
// otherwise. A file never makes hydra read outside the folder it belongs to.
std::string entry_inside(const std::string& folder, const std::string& name, const std::string& source,
                         const std::string& what);
// Fails with a UserError if directory `path` could not be used for output: it is a file, lies under
// a file, or its nearest existing ancestor is not writable (a read-only filesystem included).
void require_output_directory(const std::string& path, const char* what);

}  // namespace hydra
