#include "src/io/atomic_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <stdexcept>

#include "src/core/own_file.h"

namespace mpiformer {

namespace {

namespace fs = std::filesystem;

[[noreturn]] void fail(const std::string& path, const std::string& what, int error) {
  throw std::runtime_error(path + ": " + what + " (" + std::strerror(error) + ")");
}

std::string parent_dir(const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? "." : parent.string();
}

// Whether process `pid` has ended but not been reaped (state Z or X in
// /proc/PID/stat, after the parenthesised command name).
bool ended(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const size_t name_end = line.rfind(')');
  if (name_end == std::string::npos || name_end + 2 >= line.size()) return false;
  const char state = line[name_end + 2];
  return state == 'Z' || state == 'X';
}

}  // namespace

std::string host_in_file_names() {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') return "unknown";
  std::string name(host);
  for (char& c : name) {
    const bool kept =
        std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '.' || c == '_' || c == '-';
    if (!kept) c = '_';
  }
  return name;
}

void fsync_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, "cannot open to fsync", errno);
  const int rc = ::fsync(fd);
  const int saved = errno;
  ::close(fd);
  if (rc != 0) fail(path, "cannot fsync", saved);
}

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail(dir, "cannot open the directory to fsync", errno);
  const int rc = ::fsync(fd);
  const int saved = errno;
  ::close(fd);
  if (rc != 0 && saved != EINVAL) fail(dir, "cannot fsync the directory", saved);
}

void commit_file(const std::string& tmp, const std::string& path) {
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int saved = errno;
    std::error_code ec;
    fs::remove(tmp, ec);
    fail(path, "cannot rename the temporary file into place", saved);
  }
  fsync_dir(parent_dir(path));
}

int reserve_file_space(const std::string& path, uint64_t bytes) {
  if (bytes > file_size_limit()) return EFBIG;
  const int fd = ::open(path.c_str(), O_WRONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return errno;
  struct stat info {};
  int err = ::fstat(fd, &info) == 0 ? 0 : errno;
  if (err == 0 && bytes > 0 &&
      ::fallocate(fd, FALLOC_FL_KEEP_SIZE, info.st_size, static_cast<off_t>(bytes)) != 0) {
    err = errno == EOPNOTSUPP || errno == ENOSYS ? 0 : errno;
  }
  ::close(fd);
  return err;
}

void release_reserved_space(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return;
  struct stat info {};
  // tmpfs frees blocks past the end when they are punched out, ext4 and XFS
  // when the file is cut to its own size; each ignores the other's way.
  if (::fstat(fd, &info) == 0) {
    ::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, info.st_size,
                std::numeric_limits<off_t>::max() - info.st_size);
    if (::ftruncate(fd, info.st_size) != 0) {
      // Nothing lost: the blocks go with the file.
    }
  }
  ::close(fd);
}

uint64_t file_size_limit() {
  struct rlimit limit {};
  if (::getrlimit(RLIMIT_FSIZE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return UINT64_MAX;
  return static_cast<uint64_t>(limit.rlim_cur);
}

void write_file_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = temporary_name(path);
  std::string why;
  const int fd = create_new_file(tmp, &why);
  if (fd < 0) throw std::runtime_error(tmp + ": " + why);
  size_t done = 0;
  bool ok = true;
  while (ok && done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    if (ok) done += static_cast<size_t>(n);
  }
  ok = ok && ::fsync(fd) == 0;
  const int saved = errno;
  ok = ::close(fd) == 0 && ok;
  if (!ok) {
    std::error_code ec;
    fs::remove(tmp, ec);
    fail(tmp, "cannot write", saved);
  }
  commit_file(tmp, path);
}

std::string temporary_name(const std::string& path) {
  return path + ".tmp-" + host_in_file_names() + "-" + std::to_string(::getpid());
}

bool older_temporary(const std::string& name) {
  const std::string suffix = ".tmp";
  return name.size() > suffix.size() &&
         name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool abandoned_temporary(const std::string& name, std::string* final_name) {
  const size_t at = name.rfind(".tmp-");
  if (at == std::string::npos || at == 0) return false;
  // HOST-PID, or PID alone as written before hosts were named (this host's).
  const std::string tail = name.substr(at + 5);
  const size_t dash = tail.rfind('-');
  const std::string host = dash == std::string::npos ? "" : tail.substr(0, dash);
  const std::string digits = dash == std::string::npos ? tail : tail.substr(dash + 1);
  if (digits.empty() || digits.size() > 9 ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return false;
  }
  if (dash != std::string::npos) {
    if (host.empty()) return false;
    if (host != host_in_file_names()) {  // another node's: see the header
      *final_name = name.substr(0, at);
      return true;
    }
  }
  // Only a process that is certainly gone: one that runs, even as another
  // user (EPERM), keeps its files. A zombie has ended: a rank killed after
  // its mpirun exited stays one where nothing reaps orphans (PID 1 of a
  // container that is not an init).
  const pid_t pid = static_cast<pid_t>(std::stol(digits));
  if (pid <= 0 || pid == ::getpid()) return false;
  if ((::kill(pid, 0) == 0 || errno != ESRCH) && !ended(pid)) return false;
  *final_name = name.substr(0, at);
  return true;
}

StagedTextFile::StagedTextFile(const std::string& path) : path_(path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) == 0 && !S_ISREG(info.st_mode)) {
    // A device or a FIFO the user named (/dev/null, a named pipe, a shell's
    // /dev/fd/N) has no content to keep and cannot be renamed onto: written
    // in place.
    fd_ = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd_ < 0) fail(path_, "cannot open", errno);
    return;
  }
  // A symbolic link is replaced by the file, never written through: in a
  // shared directory another user may have planted it.
  temporary_ = temporary_name(path_);
  on_stop_ = RemovedOnStop(temporary_);
  std::string why;
  fd_ = create_new_file(temporary_, &why);
  if (fd_ < 0) {
    temporary_.clear();
    throw std::runtime_error(path_ + ": " + why);
  }
}

StagedTextFile::~StagedTextFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!temporary_.empty()) ::unlink(temporary_.c_str());
}

void StagedTextFile::write(const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd_, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail(path_, "cannot write", n < 0 ? errno : EIO);
    done += static_cast<size_t>(n);
  }
}

void StagedTextFile::commit() {
  if (temporary_.empty()) {  // written in place
    const bool closed = ::close(fd_) == 0;
    fd_ = -1;
    if (!closed) fail(path_, "cannot write", errno);
    return;
  }
  const bool synced = ::fsync(fd_) == 0;
  const int sync_error = errno;
  const bool closed = ::close(fd_) == 0;
  const int close_error = errno;
  fd_ = -1;
  if (!synced || !closed) fail(path_, "cannot write", synced ? close_error : sync_error);
  commit_file(temporary_, path_);
  temporary_.clear();
  on_stop_.forget();
}

}  // namespace mpiformer
