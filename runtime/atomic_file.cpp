#include "runtime/atomic_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "runtime/error.h"
#include "runtime/fault.h"
#include "runtime/log.h"

namespace hydra {
namespace fs = std::filesystem;

// ---- The registry of live temporaries -------------------------------------------------------------
// A fixed array, so the signal handler needs no allocation and no lock: a slot is claimed with a
// compare-and-swap (free -> filling), its path copied, then published (filling -> active); the
// handler only reads active slots.
namespace {

constexpr int kSlots = 64;
constexpr size_t kPathBytes = 4096;
enum SlotState : int { kFree = 0, kFilling = 1, kActive = 2 };

struct Slot {
  std::atomic<int> state{kFree};
  int kind = 0;  // ScopedTemporary::Kind
  char path[kPathBytes] = {};
};
Slot g_slots[kSlots];

// Removes a directory's entries and the directory itself with system calls only (no opendir, no
// allocation): async-signal-safe. Entries are removed while reading, so read again until empty.
void remove_flat_directory(const char* path) {
  for (int pass = 0; pass < 8; ++pass) {
    const int fd = ::open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) break;
    alignas(8) char buf[4096];
    bool removed = false;
    for (;;) {
      const long n = ::syscall(SYS_getdents64, fd, buf, sizeof(buf));
      if (n <= 0) break;
      for (long off = 0; off < n;) {
        // struct linux_dirent64: u64 ino, s64 off, u16 reclen, u8 type, char name[].
        unsigned short reclen = 0;
        std::memcpy(&reclen, buf + off + 16, sizeof(reclen));
        const char* name = buf + off + 19;
        if (std::strcmp(name, ".") != 0 && std::strcmp(name, "..") != 0 && ::unlinkat(fd, name, 0) == 0) removed = true;
        off += reclen;
      }
    }
    ::close(fd);
    if (!removed) break;
  }
  ::rmdir(path);
}

void remove_registered_temporaries() {
  // Files first: a registered directory may hold registered files.
  for (int kind : {static_cast<int>(ScopedTemporary::Kind::file), static_cast<int>(ScopedTemporary::Kind::directory)}) {
    for (Slot& s : g_slots) {
      if (s.state.load(std::memory_order_acquire) != kActive || s.kind != kind) continue;
      if (kind == static_cast<int>(ScopedTemporary::Kind::file)) {
        ::unlink(s.path);
      } else {
        remove_flat_directory(s.path);
      }
    }
  }
}

// The thread that installed the handlers (main()'s): the one that creates, writes and renames
// temporaries. 0: not installed.
std::atomic<long> g_main_thread{0};

long this_thread_id() { return ::syscall(SYS_gettid); }

// Runs on whichever thread the kernel picked. The cleanup runs on the main thread only: there it
// interrupts the code that creates temporaries, so none can be created (or registered) after the
// cleanup has looked — on another thread, the main thread would go on while the handler runs. So
// another thread forwards the signal to the main thread and returns (it runs on until the process
// ends). The handler stays installed until the cleanup is done: a second signal (timeout and scancel
// signal a process and then its group) reaches the same handler and is forwarded or merged, never
// the default action. At 2fc8691 the disposition was reset on entry (SA_RESETHAND), and a second
// SIGTERM taken by another thread killed the process before the temporary was removed.
extern "C" void cleanup_signal_handler(int sig) {
  const int saved_errno = errno;
  const long main_thread = g_main_thread.load(std::memory_order_relaxed);
  // tgkill fails when the main thread is gone (a forked child, a process ending): clean up here.
  if (main_thread != 0 && this_thread_id() != main_thread &&
      ::syscall(SYS_tgkill, static_cast<long>(::getpid()), main_thread, sig) == 0) {
    errno = saved_errno;
    return;
  }
  remove_registered_temporaries();
  // End as the signal would have: the default action, and the signal, blocked while this handler
  // runs, is delivered when it returns.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  ::sigaction(sig, &dfl, nullptr);
  ::raise(sig);
  errno = saved_errno;
}

// A zombie (killed, not yet reaped: a job launcher's children re-parented to an init that reaps
// late) still answers kill(pid, 0) but will never finish its write: /proc says 'Z' (or 'X').
bool process_alive(long pid) {
  if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!std::getline(stat, text)) return true;  // no /proc: trust kill()
  const size_t paren = text.rfind(") ");
  return paren == std::string::npos || paren + 2 >= text.size() || (text[paren + 2] != 'Z' && text[paren + 2] != 'X');
}

}  // namespace

ScopedTemporary::ScopedTemporary(const std::string& path, Kind kind) {
  HYDRA_ASSERT(path.size() < kPathBytes, "temporary path of {} bytes is too long to register", path.size());
  for (int i = 0; i < kSlots; ++i) {
    int expected = kFree;
    if (!g_slots[i].state.compare_exchange_strong(expected, kFilling, std::memory_order_acq_rel)) continue;
    std::memcpy(g_slots[i].path, path.c_str(), path.size() + 1);
    g_slots[i].kind = static_cast<int>(kind);
    g_slots[i].state.store(kActive, std::memory_order_release);
    slot_ = i;
    return;
  }
  HYDRA_ASSERT(false, "more than {} temporary files open at once", kSlots);
}

ScopedTemporary& ScopedTemporary::operator=(ScopedTemporary&& other) noexcept {
  if (this != &other) {
    release();
    slot_ = other.slot_;
    other.slot_ = -1;
  }
  return *this;
}

void ScopedTemporary::release() {
  if (slot_ < 0) return;
  g_slots[slot_].state.store(kFree, std::memory_order_release);
  slot_ = -1;
}

void install_cleanup_handler(int sig) {
  // Async-signal-safe (sigaction only): runtime/stop_request.cpp calls it from its handler. Every
  // signal that may end the process through the cleanup is blocked while one is handled on a thread:
  // on the main thread the cleanup is not re-entered, and the others wait, pending, until it has
  // ended the process.
  struct sigaction action {};
  action.sa_handler = cleanup_signal_handler;
  sigemptyset(&action.sa_mask);
  for (int s : {SIGTERM, SIGINT, SIGHUP, SIGUSR1}) sigaddset(&action.sa_mask, s);
  action.sa_flags = SA_RESTART;  // a thread that forwards the signal and returns goes on where it was
  sigaction(sig, &action, nullptr);
}

void install_cleanup_handlers() {
  g_main_thread.store(this_thread_id(), std::memory_order_relaxed);
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) install_cleanup_handler(sig);
}

std::vector<std::string> sweep_stale_temporaries(const std::string& directory, const std::string& name,
                                                 bool prefix_match) {
  std::vector<std::string> removed;
  std::error_code ec;
  fs::directory_iterator it(directory.empty() ? "." : directory, ec);
  if (ec) return removed;
  for (const fs::directory_entry& e : it) {
    const std::string file = e.path().filename().string();
    const size_t tmp = file.rfind(".tmp-");
    if (file.size() < 2 || file[0] != '.' || tmp == std::string::npos || tmp < 1) continue;
    const std::string base = file.substr(1, tmp - 1), pid_text = file.substr(tmp + 5);
    if (pid_text.empty() || pid_text.size() > 10) continue;
    if (pid_text.find_first_not_of("0123456789") != std::string::npos) continue;
    if (prefix_match ? base.rfind(name, 0) != 0 : base != name) continue;
    const long pid = std::stol(pid_text);
    if (pid == static_cast<long>(getpid()) || process_alive(pid)) continue;
    fs::remove_all(e.path(), ec);
    if (!ec) removed.push_back(e.path().string());
  }
  return removed;
}

std::string temporary_path_for(const std::string& destination) {
  const fs::path dest(destination);
  const fs::path dir = dest.has_parent_path() ? dest.parent_path() : fs::path(".");
  return (dir / fmt::format(".{}.tmp-{}", dest.filename().string(), static_cast<long>(getpid()))).string();
}

std::string destination_of(const std::string& path) {
  const fs::path p(path);
  const std::string name = p.filename().string();
  const size_t tmp = name.rfind(".tmp-");
  if (name.size() < 2 || name[0] != '.' || tmp == std::string::npos || tmp < 2) return path;
  return (p.parent_path() / name.substr(1, tmp - 1)).string();
}

// ---- AtomicFile -----------------------------------------------------------------------------------

AtomicFile::AtomicFile(std::string destination) : destination_(std::move(destination)) {
  const fs::path dest(destination_);
  const std::string dir = dest.has_parent_path() ? dest.parent_path().string() : ".";
  for (const std::string& base : {dest.filename().string(), dest.filename().string() + ".old"}) {
    for (const std::string& path : sweep_stale_temporaries(dir, base)) {
      log::info("removed {} (a temporary left by a process that no longer exists)", path);
    }
  }
  temp_ = temporary_path_for(destination_);
  registration_ = ScopedTemporary(temp_, ScopedTemporary::Kind::file);
  std::remove(temp_.c_str());
}

AtomicFile::~AtomicFile() {
  if (!committed_) std::remove(temp_.c_str());
}

void AtomicFile::commit() {
  maybe_inject_fault("commit");  // tests: an interruption between the write and the rename
  if (AtomicCommitGroup* group = AtomicCommitGroup::current()) {
    group->adopt(*this);
    return;
  }
  if (std::rename(temp_.c_str(), destination_.c_str()) != 0) {
    const int err = errno;
    std::remove(temp_.c_str());
    HYDRA_USER_FAIL("{}: cannot write ({})", destination_, std::strerror(err));
  }
  committed_ = true;
  registration_.release();
}

// ---- AtomicCommitGroup ----------------------------------------------------------------------------

namespace {
thread_local AtomicCommitGroup* g_group = nullptr;
}

AtomicCommitGroup::AtomicCommitGroup() {
  HYDRA_ASSERT(g_group == nullptr, "AtomicCommitGroups do not nest");
  g_group = this;
}

AtomicCommitGroup::~AtomicCommitGroup() {
  if (g_group == this) g_group = nullptr;
  if (committed_) return;
  for (Pending& p : pending_) std::remove(p.temp.c_str());
}

AtomicCommitGroup* AtomicCommitGroup::current() { return g_group; }

void AtomicCommitGroup::adopt(AtomicFile& file) {
  HYDRA_ASSERT(!committed_, "a file handed to a committed AtomicCommitGroup");
  pending_.push_back(Pending{file.destination_, file.temp_, std::move(file.registration_)});
  file.committed_ = true;  // the group owns the temporary now
}

void AtomicCommitGroup::commit() {
  if (g_group == this) g_group = nullptr;
  // Keep a hard link to every destination that exists, so a failed later rename can put it back.
  struct Backup {
    std::string path;
    bool exists = false;
    ScopedTemporary registration;
  };
  std::vector<Backup> backups(pending_.size());
  for (size_t i = 0; i < pending_.size(); ++i) {
    const std::string dest = pending_[i].destination;
    if (::access(dest.c_str(), F_OK) != 0) continue;
    backups[i].path = temporary_path_for(dest + ".old");
    backups[i].registration = ScopedTemporary(backups[i].path, ScopedTemporary::Kind::file);
    ::unlink(backups[i].path.c_str());
    backups[i].exists = ::link(dest.c_str(), backups[i].path.c_str()) == 0;
  }
  for (size_t i = 0; i < pending_.size(); ++i) {
    if (std::rename(pending_[i].temp.c_str(), pending_[i].destination.c_str()) == 0) continue;
    const int err = errno;
    for (size_t j = 0; j < i; ++j) {  // undo the renames already done
      if (backups[j].exists) {
        std::rename(backups[j].path.c_str(), pending_[j].destination.c_str());
      } else {
        std::remove(pending_[j].destination.c_str());
      }
    }
    for (size_t j = i; j < pending_.size(); ++j) std::remove(pending_[j].temp.c_str());
    for (const Backup& b : backups) {
      if (b.exists) std::remove(b.path.c_str());
    }
    committed_ = true;  // nothing left to remove
    HYDRA_USER_FAIL("{}: cannot write ({}); none of the {} outputs written with it were changed",
                    pending_[i].destination, std::strerror(err), pending_.size());
  }
  for (const Backup& b : backups) {
    if (b.exists) std::remove(b.path.c_str());
  }
  committed_ = true;
}

void write_text_atomically(const std::string& path, const std::string& text) {
  AtomicFile file(path);
  {
    std::ofstream out(file.temp_path(), std::ios::binary);
    out << text;
    out.flush();
    HYDRA_USER_CHECK(out.good(), "{}: writing failed (disk full or over a file size limit?)", path);
  }
  file.commit();
}

// ---- Checks ---------------------------------------------------------------------------------------

void require_readable_file(const std::string& path, const char* what) {
  std::error_code ec;
  HYDRA_USER_CHECK(!path.empty(), "no {} file given", what);
  HYDRA_USER_CHECK(fs::exists(path, ec), "{}: {} file does not exist", path, what);
  HYDRA_USER_CHECK(fs::is_regular_file(path, ec), "{}: {} is not a regular file", path, what);
  HYDRA_USER_CHECK(access(path.c_str(), R_OK) == 0, "{}: {} file is not readable ({})", path, what,
                   std::strerror(errno));
}

void require_writable_destination(const std::string& path, const char* what) {
  HYDRA_USER_CHECK(!path.empty(), "no {} path given", what);
  const fs::path p(path);
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  std::error_code ec;
  HYDRA_USER_CHECK(fs::is_directory(dir, ec), "{}: directory {} for the {} does not exist", path,
                   dir.string(), what);
  HYDRA_USER_CHECK(access(dir.c_str(), W_OK) == 0, "{}: directory {} for the {} is not writable", path,
                   dir.string(), what);
  HYDRA_USER_CHECK(!fs::is_directory(p, ec), "{}: {} path is a directory", path, what);
}

bool same_file(const std::string& a, const std::string& b) {
  std::error_code ec;
  return fs::equivalent(a, b, ec) && !ec;
}

void require_not_an_input(const std::string& path, const std::vector<std::string>& inputs, const char* flag) {
  for (const std::string& input : inputs) {
    HYDRA_USER_CHECK(input.empty() || !same_file(path, input),
                     "{} {} is {}, an input of this command: name another output (it would be replaced)", flag, path,
                     input == path ? "also read" : fmt::format("the same file as {}", input));
  }
}

bool is_plain_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

namespace {
// A name read from a file, for a message: control bytes (a NUL would cut the message) as \xNN, at most 200 bytes.
std::string printable(const std::string& name) {
  std::string out;
  for (const char c : name.substr(0, 200)) {
    const auto u = static_cast<unsigned char>(c);
    out += u < 0x20 || u == 0x7f ? fmt::format("\\x{:02x}", u) : std::string(1, c);
  }
  return name.size() > 200 ? out + "..." : out;
}
}  // namespace

std::string entry_inside(const std::string& folder, const std::string& name, const std::string& source,
                         const std::string& what) {
  HYDRA_USER_CHECK(is_plain_name(name), "{}: {} '{}' is not a plain name inside {} (a name read from a file never "
                   "leads outside its folder)", source, what, printable(name), folder);
  const fs::path path = fs::path(folder) / name;
  std::error_code ec;
  if (fs::is_symlink(path, ec)) {
    std::error_code ec_target, ec_home;
    const fs::path target = fs::canonical(path, ec_target), home = fs::canonical(folder, ec_home);
    HYDRA_USER_CHECK(!ec_target && !ec_home && target.parent_path() == home,
                     "{}: {} '{}' is a link to {}, outside {} (a name read from a file never leads outside its folder)",
                     source, what, name, ec_target ? fs::read_symlink(path, ec).string() : target.string(), folder);
  }
  return path.string();
}

void require_output_directory(const std::string& path, const char* what) {
  HYDRA_USER_CHECK(!path.empty(), "no {} given", what);
  const fs::path p(path);
  std::error_code ec;
  HYDRA_USER_CHECK(!fs::exists(p, ec) || fs::is_directory(p, ec), "{} {} is a file, not a directory", what, path);
  // The nearest ancestor that exists must be a writable directory (the rest is created).
  fs::path existing = p;
  while (!existing.empty() && !fs::exists(existing, ec)) existing = existing.parent_path();
  if (existing.empty()) existing = ".";
  HYDRA_USER_CHECK(fs::is_directory(existing, ec), "{} {} cannot be created: {} is a file", what, path,
                   existing.string());
  HYDRA_USER_CHECK(access(existing.c_str(), W_OK | X_OK) == 0, "{} {} cannot be written: {} ({})", what, path,
                   existing.string(), std::strerror(errno));
}

}  // namespace hydra
