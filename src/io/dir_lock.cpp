#include "src/io/dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>
#include <utility>

#include "src/core/own_file.h"

namespace mpiformer {
namespace {

std::string os_error(int err) {
  return std::strerror(err);
}

// "host H, pid P" from the lock file of another process. Its holder writes
// the line right after locking, so an empty file is given a moment to fill.
std::string read_holder(int fd) {
  std::string text;
  for (int attempt = 0; attempt < 20 && text.empty(); ++attempt) {
    if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    char buf[256];
    const ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
    if (n > 0) text.assign(buf, static_cast<size_t>(n));
  }
  text = text.substr(0, text.find('\n'));
  const size_t space = text.rfind(' ');
  const bool printable = std::all_of(text.begin(), text.end(), [](char c) {
    return std::isprint(static_cast<unsigned char>(c)) != 0;
  });
  if (!printable || space == std::string::npos || space == 0 || space + 1 == text.size()) {
    return "its host and pid are not recorded";
  }
  return "host " + text.substr(0, space) + ", pid " + text.substr(space + 1);
}

std::string holder_line() {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') std::strcpy(host, "unknown");
  return std::string(host) + " " + std::to_string(::getpid()) + "\n";
}

}  // namespace

DirLock::DirLock(DirLock&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      held_(std::exchange(other.held_, false)),
      path_(std::move(other.path_)),
      on_stop_(std::move(other.on_stop_)) {}

DirLock& DirLock::operator=(DirLock&& other) noexcept {
  if (this != &other) {
    release();
    fd_ = std::exchange(other.fd_, -1);
    held_ = std::exchange(other.held_, false);
    path_ = std::move(other.path_);
    on_stop_ = std::move(other.on_stop_);
  }
  return *this;
}

std::string DirLock::try_acquire(const std::string& dir) {
  if (held_) return "";
  path_ = (std::filesystem::path(dir) / kFileName).string();
  // A holder removes the file when it releases, so the file this process
  // opened and locked may no longer be the one at the path; a lock on it
  // would exclude nobody. Such a lock is dropped and the new file tried.
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::string why;
    const int fd = open_regular_file(path_, O_RDWR | O_CREAT, &why);
    if (fd < 0) return path_ + ": " + why;
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      if (err == EWOULDBLOCK) {
        const std::string holder = read_holder(fd);
        ::close(fd);
        return dir + " is in use by another process (" + holder + "; lock file " + path_ + ")";
      }
      if (err == ENOLCK || err == ENOSYS || err == EOPNOTSUPP) {
        // No flock here: nothing can be enforced, but the file still says
        // who writes, and release() removes it.
        if (::ftruncate(fd, 0) == 0) {
          const std::string line = holder_line();
          [[maybe_unused]] const ssize_t n = ::pwrite(fd, line.data(), line.size(), 0);
        }
        ::close(fd);
        held_ = true;
        on_stop_ = RemovedOnStop(path_);
        return "";
      }
      ::close(fd);
      return path_ + ": cannot lock (" + os_error(err) + ")";
    }
    struct stat opened {
    }, named{};
    if (::fstat(fd, &opened) == 0 && ::stat(path_.c_str(), &named) == 0 &&
        opened.st_dev == named.st_dev && opened.st_ino == named.st_ino) {
      const std::string line = holder_line();
      if (::ftruncate(fd, 0) != 0 ||
          ::pwrite(fd, line.data(), line.size(), 0) != static_cast<ssize_t>(line.size())) {
        const int err = errno;
        ::unlink(path_.c_str());
        ::close(fd);
        return path_ + ": cannot write (" + os_error(err) + ")";
      }
      fd_ = fd;
      held_ = true;
      on_stop_ = RemovedOnStop(path_);
      return "";
    }
    ::close(fd);
  }
  return path_ + ": cannot lock (the file is replaced as fast as it is opened)";
}

void DirLock::release() {
  if (!held_) return;
  on_stop_.forget();
  // Removed while still locked: a process waiting on this file finds it
  // gone once it gets the lock, and tries the path again.
  ::unlink(path_.c_str());
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  held_ = false;
}

}  // namespace mpiformer
