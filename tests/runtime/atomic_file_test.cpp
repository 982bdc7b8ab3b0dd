// Writes that appear whole or not at all (runtime/atomic_file.h): several outputs committed
// together, a failed rename in the middle of a group undone, stale temporaries swept by the pattern
// and the liveness of their process only, and temporaries removed by SIGTERM in a child process.
#include "runtime/atomic_file.h"

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <vector>

#include "tests/common/test_util.h"

namespace hydra::test {
namespace {

namespace fs = std::filesystem;

void write_through(AtomicFile& f, const std::string& text) { std::ofstream(f.temp_path()) << text; }

int entries(const fs::path& dir) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir)) n += e.is_regular_file() || e.is_directory() ? 1 : 0;
  return n;
}

TEST(AtomicCommitGroup, CommitsEveryFileTogether) {
  TempDir dir;
  {
    AtomicCommitGroup group;
    AtomicFile a(dir.file("a.json")), b(dir.file("b.h5"));
    write_through(a, "A");
    write_through(b, "B");
    a.commit();
    EXPECT_FALSE(fs::exists(dir.file("a.json"))) << "inside a group, commit() only hands the file over";
    b.commit();
    group.commit();
  }
  EXPECT_EQ(read_all(dir.file("a.json")), "A");
  EXPECT_EQ(read_all(dir.file("b.h5")), "B");
  EXPECT_EQ(entries(dir.path()), 2);
}

TEST(AtomicCommitGroup, AnExceptionBeforeTheGroupCommitsChangesNothing) {
  TempDir dir;
  std::ofstream(dir.file("a.json")) << "old";
  try {
    AtomicCommitGroup group;
    AtomicFile a(dir.file("a.json"));
    write_through(a, "new");
    a.commit();
    AtomicFile b(dir.file("b.h5"));
    throw UserError("the second write failed");
  } catch (const UserError&) {
  }
  EXPECT_EQ(read_all(dir.file("a.json")), "old");
  EXPECT_FALSE(fs::exists(dir.file("b.h5")));
  EXPECT_EQ(entries(dir.path()), 1) << "no temporary may be left";
}

TEST(AtomicCommitGroup, AFailedRenameRestoresTheFilesAlreadyReplaced) {
  TempDir dir;
  std::ofstream(dir.file("a.json")) << "old a";
  std::string error;
  {
    AtomicCommitGroup group;
    AtomicFile a(dir.file("a.json")), b(dir.file("b.h5")), c(dir.file("c.txt"));
    write_through(a, "new a");
    write_through(b, "new b");
    write_through(c, "new c");
    a.commit();
    b.commit();
    c.commit();
    // b.h5 becomes a non-empty directory: renaming a file over it fails (EISDIR) after a.json was replaced.
    fs::create_directories(dir.path() / "b.h5" / "x");
    error = error_of([&] { group.commit(); });
  }
  EXPECT_NE(error.find("b.h5: cannot write"), std::string::npos) << error;
  EXPECT_NE(error.find("none of the 3 outputs written with it were changed"), std::string::npos) << error;
  EXPECT_EQ(read_all(dir.file("a.json")), "old a");
  EXPECT_FALSE(fs::exists(dir.file("c.txt")));
  EXPECT_EQ(entries(dir.path()), 2) << "a.json and the directory b.h5, no temporary or backup";
}

TEST(SweepStaleTemporaries, RemovesOnlyThePatternOfDeadProcesses) {
  TempDir dir;
  // PIDs above Linux's largest (2^22) are never alive; the parent of this test is.
  const std::string dead = "4999999", alive = std::to_string(getppid());
  for (const std::string& name :
       std::vector<std::string>{".m.h5.tmp-" + dead, ".m.h5.tmp-" + alive, ".other.h5.tmp-" + dead, ".m.h5.tmp-x",
                                "m.h5.tmp-" + dead, ".m.h5.old.tmp-" + dead}) {
    std::ofstream(dir.file(name)) << "x";
  }
  fs::create_directories(dir.path() / (".step-000003.tmp-" + dead) / "sub");
  const std::vector<std::string> removed = sweep_stale_temporaries(dir.path().string(), "m.h5");
  ASSERT_EQ(removed.size(), 1u);
  EXPECT_EQ(fs::path(removed[0]).filename(), ".m.h5.tmp-" + dead);
  EXPECT_TRUE(fs::exists(dir.file(".m.h5.tmp-" + alive)));
  EXPECT_TRUE(fs::exists(dir.file(".other.h5.tmp-" + dead)));
  EXPECT_TRUE(fs::exists(dir.file(".m.h5.old.tmp-" + dead)));
  // The trainer's pattern: any `.step-*.tmp-PID`, a directory with everything in it.
  EXPECT_EQ(sweep_stale_temporaries(dir.path().string(), "step-", true).size(), 1u);
  EXPECT_FALSE(fs::exists(dir.path() / (".step-000003.tmp-" + dead)));
  // A new AtomicFile sweeps its destination's pattern (and its group backups') by itself.
  { AtomicFile f(dir.file("m.h5")); }
  EXPECT_FALSE(fs::exists(dir.file(".m.h5.old.tmp-" + dead)));
}

// A child process writes through an AtomicFile (and a registered temporary directory) and is ended
// by SIGTERM before committing: the handler removes both, and the child still dies of SIGTERM.
TEST(CleanupHandlers, SigtermRemovesRegisteredTemporaries) {
  TempDir dir;
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    install_cleanup_handlers();
    AtomicFile f(dir.file("model.h5"));
    std::ofstream(f.temp_path()) << "partial";
    const std::string step = dir.file(".step-000001.tmp-" + std::to_string(getpid()));
    fs::create_directories(step);
    ScopedTemporary registration(step, ScopedTemporary::Kind::directory);
    std::ofstream(step + "/model.h5") << "partial";
    raise(SIGTERM);
    _exit(0);  // not reached
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status)) << "status " << status;
  EXPECT_EQ(WTERMSIG(status), SIGTERM);
  EXPECT_EQ(entries(dir.path()), 0) << "the temporary file and directory must be gone";
}

TEST(WriteTextAtomically, ReplacesWholeOrNotAtAll) {
  TempDir dir;
  write_text_atomically(dir.file("latest"), "step-000002\n");
  EXPECT_EQ(read_all(dir.file("latest")), "step-000002\n");
  EXPECT_NE(error_of([&] { write_text_atomically(dir.file("missing/latest"), "x"); }).find("writing failed"),
            std::string::npos);
}

// A name read from a file of a folder (a manifest's shard, `latest`) stays inside that folder.
TEST(EntryInside, PlainNamesOnlyAndNoLinksOut) {
  TempDir dir;
  namespace fs = std::filesystem;
  fs::create_directories(dir.file("run"));
  fs::create_directories(dir.file("other"));
  std::ofstream(dir.file("run/a.h5")) << "a";
  std::ofstream(dir.file("other/b.h5")) << "b";
  const std::string run = dir.file("run");
  EXPECT_EQ(entry_inside(run, "a.h5", "m.json", "shard"), dir.file("run/a.h5"));
  EXPECT_EQ(entry_inside(run, "absent.h5", "m.json", "shard"), dir.file("run/absent.h5"));  // the reader says it is missing
  for (const std::string& name : std::vector<std::string>{"", ".", "..", "../other/b.h5", dir.file("other/b.h5"), "x/../a.h5",
                                 std::string("a.h5\0", 5)}) {
    EXPECT_NE(error_of([&] { entry_inside(run, name, "m.json", "shard"); }).find("is not a plain name inside"),
              std::string::npos) << "'" << name << "'";
  }
  fs::create_symlink("a.h5", dir.file("run/inside.h5"));
  EXPECT_EQ(entry_inside(run, "inside.h5", "m.json", "shard"), dir.file("run/inside.h5"));
  fs::create_symlink(dir.file("other/b.h5"), dir.file("run/outside.h5"));
  EXPECT_NE(error_of([&] { entry_inside(run, "outside.h5", "m.json", "shard"); }).find("is a link to " + fs::canonical(dir.file("other/b.h5")).string()),
            std::string::npos);
  fs::create_symlink("../other/absent.h5", dir.file("run/dangling.h5"));
  EXPECT_NE(error_of([&] { entry_inside(run, "dangling.h5", "m.json", "shard"); }).find("outside"), std::string::npos);
}

}  // namespace
}  // namespace hydra::test
