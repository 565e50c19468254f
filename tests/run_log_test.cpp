// RUNDIR/train.log: the lines rank 0 says, held until the log is attached,
// each begun there by the local time it was said.
#include "src/core/run_log.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

namespace mpiformer {
namespace {

TEST(RunLog, EveryLineOfTheLogBeginsWithItsTime) {
  const std::string path = (std::filesystem::path(::testing::TempDir()) /
                            ("run_log_test_" + std::to_string(::getpid()) + ".log"))
                               .string();
  std::FILE* sink = std::tmpfile();  // the stream the lines also go to
  ASSERT_NE(sink, nullptr);
  say(sink, "held before the log: %d\n", 1);
  attach_run_log(path);
  say(sink, "two lines ");
  say(sink, "said in parts\nand a %s\n", "second");
  detach_run_log();

  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  const std::regex stamp(R"(^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d (.*)$)");
  const std::vector<std::string> said = {"held before the log: 1", "two lines said in parts",
                                         "and a second"};
  ASSERT_EQ(lines.size(), said.size());
  for (size_t i = 0; i < said.size(); ++i) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(lines[i], m, stamp)) << lines[i];
    EXPECT_EQ(m[1].str(), said[i]);
  }
  // The stream itself gets the lines as said, without times.
  std::rewind(sink);
  char buf[256] = "";
  const size_t n = std::fread(buf, 1, sizeof buf - 1, sink);
  EXPECT_EQ(std::string(buf, n), "held before the log: 1\ntwo lines said in parts\nand a second\n");
  std::fclose(sink);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace mpiformer
