// Starting this program again, as itself (kernels/cpu/program_restart.h).
#include "kernels/cpu/program_restart.h"

#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <vector>

namespace mpiformer {

namespace {

constexpr const char* kSelf = "/proc/self/exe";
constexpr const char* kDeleted = " (deleted)";
// /proc/PID/comm's length, less its terminating zero (the kernel's TASK_COMM_LEN).
constexpr size_t kProcessNameLength = 15;

bool same_file(const std::string& a, const std::string& b) {
  struct stat sa {};
  struct stat sb {};
  return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

}  // namespace

std::string running_binary_path() {
  std::vector<char> buffer(4096);
  for (;;) {
    const ssize_t length = ::readlink(kSelf, buffer.data(), buffer.size());
    if (length < 0) return "";
    if (static_cast<size_t>(length) < buffer.size()) return std::string(buffer.data(), length);
    buffer.resize(buffer.size() * 2);
  }
}

std::string process_name_of(const std::string& path) {
  std::string name = path.substr(path.rfind('/') + 1);
  const std::string deleted(kDeleted);
  if (name.size() > deleted.size() &&
      name.compare(name.size() - deleted.size(), deleted.size(), deleted) == 0)
    name.resize(name.size() - deleted.size());
  return name.substr(0, kProcessNameLength);
}

std::string restart_target(const std::string& path, bool still_the_running_binary) {
  return !path.empty() && path.front() == '/' && still_the_running_binary ? path : kSelf;
}

void restart_program(char** argv) {
  const std::string path = running_binary_path();
  const std::string target = restart_target(path, same_file(path, kSelf));
  ::execv(target.c_str(), argv);
}

void keep_process_name() {
  const std::string name = process_name_of(running_binary_path());
  char current[kProcessNameLength + 1] = {};
  if (name.empty() || ::prctl(PR_GET_NAME, current) != 0 || name == current) return;
  ::prctl(PR_SET_NAME, name.c_str());
}

}  // namespace mpiformer
