// Starting this program again as itself (kernels/cpu/program_restart.h):
// the name the kernel gives the new process, what is executed, and the
// name set back after a start through /proc/self/exe.
#include "kernels/cpu/program_restart.h"

#include <gtest/gtest.h>
#include <sys/prctl.h>

#include <fstream>
#include <string>

namespace mpiformer {
namespace {

std::string own_process_name() {
  std::ifstream comm("/proc/self/comm");
  std::string name;
  std::getline(comm, name);
  return name;
}

TEST(ProgramRestart, TheProcessIsNamedAfterThePathsLastComponent) {
  EXPECT_EQ(process_name_of("/opt/mpiformer/bin/mpiformer"), "mpiformer");
  EXPECT_EQ(process_name_of("mpiformer"), "mpiformer");
  EXPECT_EQ(process_name_of("/scratch/run 1/mpiformer"), "mpiformer");
}

TEST(ProgramRestart, ARemovedBinaryKeepsItsName) {
  EXPECT_EQ(process_name_of("/home/u/build/mpiformer (deleted)"), "mpiformer");
}

TEST(ProgramRestart, TheNameIsCutToFifteenCharacters) {
  EXPECT_EQ(process_name_of("/usr/bin/mpiformer-with-a-long-name"), "mpiformer-with-");
  EXPECT_EQ(process_name_of("/usr/bin/mpiformer-with-a-long-name (deleted)"), "mpiformer-with-");
}

TEST(ProgramRestart, TheRunningBinarysOwnPathIsExecutedWhileItHoldsIt) {
  EXPECT_EQ(restart_target("/opt/bin/mpiformer", true), "/opt/bin/mpiformer");
}

TEST(ProgramRestart, AReplacedOrUnreadablePathFallsBackToTheRunningBinary) {
  EXPECT_EQ(restart_target("/opt/bin/mpiformer", false), "/proc/self/exe");
  EXPECT_EQ(restart_target("/opt/bin/mpiformer (deleted)", false), "/proc/self/exe");
  EXPECT_EQ(restart_target("", true), "/proc/self/exe");
  EXPECT_EQ(restart_target("bin/mpiformer", true), "/proc/self/exe");
}

TEST(ProgramRestart, TheRunningBinarysPathNamesThisProcess) {
  const std::string path = running_binary_path();
  ASSERT_FALSE(path.empty());
  EXPECT_EQ(path.front(), '/') << path;
  EXPECT_EQ(process_name_of(path), own_process_name()) << path;
}

TEST(ProgramRestart, TheNameLostToProcSelfExeIsSetBack) {
  const std::string name = own_process_name();
  ASSERT_EQ(::prctl(PR_SET_NAME, "exe"), 0);
  ASSERT_EQ(own_process_name(), "exe");
  keep_process_name();
  EXPECT_EQ(own_process_name(), process_name_of(running_binary_path()));
  EXPECT_EQ(own_process_name(), name);
}

}  // namespace
}  // namespace mpiformer
