// Staged outputs (src/io/atomic_file.h) and the stop handler that removes
// unfinished files (src/io/stop_cleanup.h): the previous file survives
// anything short of commit(), and a stop signal exits 128 + its number
// with the registered files gone.
#include "src/io/atomic_file.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

#include "src/core/own_file.h"
#include "src/io/stop_cleanup.h"

namespace mpiformer {
namespace {

namespace fs = std::filesystem;

class StagedFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("staged-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  static std::string read(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    return text.str();
  }
  static void write(const std::string& path, const std::string& text) {
    std::ofstream(path, std::ios::binary) << text;
  }
  // The number of entries of the directory: no temporary is left over.
  size_t entries() const {
    size_t n = 0;
    for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir_)) ++n;
    return n;
  }

  fs::path dir_;
};

// A pid that certainly ran and is gone: a child that was waited for.
pid_t dead_pid() {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ::waitpid(child, nullptr, 0);
  return child;
}

// Runs `body` in a child process; its exit status (or 128 + a signal).
template <class Fn>
int in_child(Fn&& body) {
  const pid_t child = ::fork();
  if (child == 0) {
    body();
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST_F(StagedFiles, ReplacesThePreviousFileOnlyOnCommit) {
  const std::string out = path("hyp.txt");
  write(out, "old\n");
  StagedTextFile staged(out);
  staged.write("new 1\n");
  staged.write("new 2\n");
  EXPECT_EQ(read(out), "old\n");
  EXPECT_TRUE(fs::exists(temporary_name(out)));
  staged.commit();
  EXPECT_EQ(read(out), "new 1\nnew 2\n");
  EXPECT_EQ(entries(), 1u);
}

TEST_F(StagedFiles, AnUncommittedFileLeavesThePreviousOneAndNoTemporary) {
  const std::string out = path("hyp.txt");
  write(out, "old\n");
  {
    StagedTextFile staged(out);
    staged.write("half of it\n");
  }
  EXPECT_EQ(read(out), "old\n");
  EXPECT_EQ(entries(), 1u);
  { StagedTextFile never(path("absent.txt")); }
  EXPECT_FALSE(fs::exists(path("absent.txt")));
  EXPECT_EQ(entries(), 1u);
}

TEST_F(StagedFiles, ADeviceIsWrittenInPlaceAndALinkIsReplaced) {
  StagedTextFile null("/dev/null");
  null.write("nothing\n");
  null.commit();
  struct stat info {};
  ASSERT_EQ(::stat("/dev/null", &info), 0);
  EXPECT_TRUE(S_ISCHR(info.st_mode));

  // A link to a file is replaced, its target left alone: in a shared
  // directory another user may have planted it.
  write(path("target.txt"), "old\n");
  fs::create_symlink("target.txt", path("link.txt"));
  StagedTextFile replaced(path("link.txt"));
  replaced.write("new\n");
  replaced.commit();
  EXPECT_FALSE(fs::is_symlink(path("link.txt")));
  EXPECT_EQ(read(path("link.txt")), "new\n");
  EXPECT_EQ(read(path("target.txt")), "old\n");
}

// The run directory's files are never written through a link, nor opened
// when a FIFO stands in their place (which would block).
TEST_F(StagedFiles, RunFilesRefuseLinksAndFifos) {
  write(path("victim.txt"), "keep\n");
  fs::create_symlink(path("victim.txt"), temporary_name(path("latest")));
  write_file_atomically(path("latest"), "step_1.h5\n");
  EXPECT_EQ(read(path("victim.txt")), "keep\n");
  EXPECT_EQ(read(path("latest")), "step_1.h5\n");

  fs::create_symlink(path("victim.txt"), path("train.log"));
  std::string why;
  EXPECT_EQ(open_regular_file(path("train.log"), O_WRONLY | O_APPEND, &why), -1);
  EXPECT_NE(why.find("is a symbolic link"), std::string::npos) << why;
  ASSERT_EQ(::mkfifo(path("fifo").c_str(), 0644), 0);
  EXPECT_EQ(open_regular_file(path("fifo"), O_WRONLY, &why), -1);  // at once, no reader needed
  EXPECT_NE(why.find("FIFO"), std::string::npos) << why;
  EXPECT_EQ(read(path("victim.txt")), "keep\n");
}

// Disk set aside beyond the end shows in the blocks, not the size, and goes
// back on release; a file size limit (ulimit -f) refuses it.
TEST_F(StagedFiles, SpaceIsSetAsideAndGivenBack) {
  const std::string file = path("data.bin");
  write(file, std::string(1000, 'x'));
  const auto blocks = [&] {
    struct stat info {};
    EXPECT_EQ(::stat(file.c_str(), &info), 0);
    return static_cast<uint64_t>(info.st_blocks) * 512;
  };
  ASSERT_EQ(reserve_file_space(file, 8u << 20), 0);
  EXPECT_EQ(fs::file_size(file), 1000u);
  if (blocks() < (8u << 20)) GTEST_SKIP() << "this file system sets nothing aside (no fallocate)";
  release_reserved_space(file);
  EXPECT_LT(blocks(), 1u << 20);
  EXPECT_EQ(read(file), std::string(1000, 'x'));

  EXPECT_EQ(in_child([&] {
              struct rlimit limit {
                1u << 20, 1u << 20
              };
              ::setrlimit(RLIMIT_FSIZE, &limit);
              ::_exit(file_size_limit() == (1u << 20) && reserve_file_space(file, 2u << 20) == EFBIG
                          ? 0
                          : 1);
            }),
            0);
  EXPECT_EQ(reserve_file_space(path("missing.bin"), 10), ENOENT);
}

TEST_F(StagedFiles, AFileThatCannotBeCreatedIsNamed) {
  const std::string out = path("missing/hyp.txt");
  try {
    StagedTextFile staged(out);
    FAIL() << "created " << out;
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(out + ": cannot create"), std::string::npos) << e.what();
  }
}

TEST(AbandonedTemporary, OnlyThoseOfAProcessThatIsGone) {
  std::string final_name;
  const std::string dead = std::to_string(dead_pid());
  EXPECT_TRUE(abandoned_temporary("train-00000.h5.tmp-" + dead, &final_name));
  EXPECT_EQ(final_name, "train-00000.h5");
  EXPECT_FALSE(abandoned_temporary("x.txt.tmp-" + std::to_string(::getpid()), &final_name));
  EXPECT_FALSE(abandoned_temporary("x.txt.tmp-1", &final_name));  // init runs
  EXPECT_FALSE(abandoned_temporary("x.txt.tmp-12ab", &final_name));
  EXPECT_FALSE(abandoned_temporary("x.txt.tmp-", &final_name));
  EXPECT_FALSE(abandoned_temporary(".tmp-" + dead, &final_name));
  EXPECT_FALSE(abandoned_temporary("x.txt", &final_name));
}

// What older versions left (NAME.tmp) is told apart from today's names.
TEST(AbandonedTemporary, TheOlderNamesAreKnown) {
  EXPECT_TRUE(older_temporary("step_00000010.h5.tmp"));
  EXPECT_FALSE(older_temporary(".tmp"));
  EXPECT_FALSE(older_temporary("step_00000010.h5"));
  EXPECT_FALSE(older_temporary(temporary_name("step_00000010.h5")));
  EXPECT_EQ(temporary_name("a.h5").rfind("a.h5.tmp-", 0), 0u);
}

// On a shared file system two nodes' writers may have the same pid: the
// name carries the host, and a pid is looked up only on its own host.
TEST(AbandonedTemporary, TheHostNamesWhereThePidIsLookedUp) {
  const std::string here = host_in_file_names();
  const std::string me = std::to_string(::getpid());
  EXPECT_EQ(temporary_name("shards/train-00000.h5"),
            "shards/train-00000.h5.tmp-" + here + "-" + me);
  std::string final_name;
  EXPECT_FALSE(abandoned_temporary("x.txt.tmp-" + here + "-" + me, &final_name));
  EXPECT_FALSE(abandoned_temporary("x.txt.tmp-" + here + "-1", &final_name));
  EXPECT_TRUE(
      abandoned_temporary("x.txt.tmp-" + here + "-" + std::to_string(dead_pid()), &final_name));
  EXPECT_EQ(final_name, "x.txt");
  // Another node's, whatever runs here under its pid.
  final_name.clear();
  EXPECT_TRUE(abandoned_temporary("train-00001.h5.tmp-gpu-node-07" + here + "-" + me, &final_name));
  EXPECT_EQ(final_name, "train-00001.h5");
  EXPECT_FALSE(abandoned_temporary("x.txt.tmp--" + me, &final_name));
  EXPECT_FALSE(abandoned_temporary("x.txt.tmp-node2-", &final_name));
  EXPECT_FALSE(abandoned_temporary("x.txt.tmp-node2-12ab", &final_name));
}

// A rank killed after its mpirun exited is a zombie where nothing reaps
// orphans: ended, so its temporaries are abandoned; a child that still runs
// keeps its own.
TEST(AbandonedTemporary, AZombieHasEndedARunningChildHasNot) {
  const pid_t running = ::fork();
  ASSERT_GE(running, 0);
  if (running == 0) {
    ::pause();
    ::_exit(0);
  }
  const pid_t zombie = ::fork();
  ASSERT_GE(zombie, 0);
  if (zombie == 0) ::_exit(0);
  siginfo_t info{};
  ASSERT_EQ(::waitid(P_PID, static_cast<id_t>(zombie), &info, WEXITED | WNOWAIT), 0);  // not reaped
  std::string final_name;
  EXPECT_TRUE(abandoned_temporary("tok.txt.tmp-" + std::to_string(zombie), &final_name));
  EXPECT_EQ(final_name, "tok.txt");
  EXPECT_FALSE(abandoned_temporary("tok.txt.tmp-" + std::to_string(running), &final_name));
  ::kill(running, SIGKILL);
  ::waitpid(running, nullptr, 0);
  ::waitpid(zombie, nullptr, 0);
}

TEST_F(StagedFiles, AStopRemovesTheUnfinishedFilesAndExitsWith128PlusTheSignal) {
  const std::string out = path("hyp.txt");
  write(out, "old\n");
  const std::string made = path("made");
  const int status = in_child([&] {
    const ExitOnStop stop("", "");  // silent
    fs::create_directory(made);
    const RemovedOnStop directory(made, true);
    StagedTextFile staged(made + "/part.txt");
    StagedTextFile other(out);
    other.write("half\n");
    ::raise(SIGTERM);
  });
  EXPECT_EQ(status, 128 + SIGTERM);
  EXPECT_EQ(read(out), "old\n");
  EXPECT_FALSE(fs::exists(made));
  EXPECT_EQ(entries(), 1u);

  EXPECT_EQ(in_child([] {
              const ExitOnStop stop("", "");
              ::raise(SIGHUP);
            }),
            128 + SIGHUP);
}

TEST_F(StagedFiles, AfterFinishAStopChangesNothing) {
  const std::string out = path("hyp.txt");
  const int status = in_child([&] {
    const ExitOnStop stop("", "");
    StagedTextFile staged(out);
    staged.write("all of it\n");
    ExitOnStop::finish();
    ::raise(SIGTERM);
    staged.commit();
  });
  EXPECT_EQ(status, 0);
  EXPECT_EQ(read(out), "all of it\n");
}

TEST(ExitOnStop, AnIgnoredHangUpStaysIgnored) {
  const int status = in_child([] {
    ::signal(SIGHUP, SIG_IGN);  // nohup
    const ExitOnStop stop("", "");
    ::raise(SIGHUP);
  });
  EXPECT_EQ(status, 0);
}

}  // namespace
}  // namespace mpiformer
