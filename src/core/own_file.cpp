#include "src/core/own_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace mpiformer {
namespace {

// What follows "PATH: " for a failed open of a file to write.
std::string open_failure(int err, const char* verb) {
  if (err == ELOOP) return "is a symbolic link, which mpiformer does not write through (remove it)";
  if (err == ENXIO) return "is a FIFO or a socket, not a regular file (remove it)";
  return std::string("cannot ") + verb + " (" + std::strerror(err) + ")";
}

}  // namespace

int open_regular_file(const std::string& path, int flags, std::string* why) {
  // O_NONBLOCK: a FIFO without a reader fails at once (ENXIO) instead of
  // waiting for one; a regular file ignores it.
  const int fd = ::open(path.c_str(), flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
  if (fd < 0) {
    *why = open_failure(errno, (flags & O_CREAT) != 0 ? "create" : "open");
    return -1;
  }
  struct stat info {};
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    ::close(fd);
    *why = "not a regular file (a FIFO, socket or device; remove it)";
    return -1;
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

int create_new_file(const std::string& path, std::string* why) {
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    *why = open_failure(errno, "replace");
    return -1;
  }
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) *why = open_failure(errno, "create");
  return fd;
}

}  // namespace mpiformer
