// LD_PRELOAD shim of the write-fault tests (e2e.faults_write_space): a
// device error in the middle of a write. Writes to a file whose path holds
// MPIFORMER_EIO_MATCH fail with EIO once MPIFORMER_EIO_AFTER bytes (0 by
// default) have gone to such files, in the process of rank MPIFORMER_EIO_RANK
// (Open MPI's OMPI_COMM_WORLD_RANK, 0 outside mpirun; every rank when
// unset). A tmpfs cannot make EIO; HDF5's sec2 driver and Open MPI's MPI-IO
// both write through these calls.
#include <dlfcn.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

std::atomic<long long> written{0};

// Whether this process is the rank the fault is for.
bool this_rank() {
  const char* wanted = std::getenv("MPIFORMER_EIO_RANK");
  if (!wanted || !*wanted) return true;
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  return std::strcmp(wanted, rank && *rank ? rank : "0") == 0;
}

// Whether a write of `bytes` to `fd` fails: its file matches and the bytes
// already written to matching files reached the limit.
bool fails(int fd, size_t bytes) {
  const char* match = std::getenv("MPIFORMER_EIO_MATCH");
  if (!match || !*match || !this_rank()) return false;
  char link[64], path[PATH_MAX];
  std::snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  const ssize_t n = readlink(link, path, sizeof path - 1);
  if (n <= 0) return false;
  path[n] = '\0';
  if (!std::strstr(path, match)) return false;
  const char* after = std::getenv("MPIFORMER_EIO_AFTER");
  const long long limit = after ? std::atoll(after) : 0;
  if (written.load() >= limit) return true;
  written += static_cast<long long>(bytes);
  return false;
}

template <class Fn>
Fn next(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_NEXT, name));
}

size_t iov_bytes(const struct iovec* iov, int count) {
  size_t bytes = 0;
  for (int i = 0; i < count; ++i) bytes += iov[i].iov_len;
  return bytes;
}

}  // namespace

extern "C" {

ssize_t write(int fd, const void* buf, size_t n) {
  static auto real = next<ssize_t (*)(int, const void*, size_t)>("write");
  if (fails(fd, n)) return errno = EIO, -1;
  return real(fd, buf, n);
}

ssize_t pwrite(int fd, const void* buf, size_t n, off_t at) {
  static auto real = next<ssize_t (*)(int, const void*, size_t, off_t)>("pwrite");
  if (fails(fd, n)) return errno = EIO, -1;
  return real(fd, buf, n, at);
}

ssize_t pwrite64(int fd, const void* buf, size_t n, off64_t at) {
  static auto real = next<ssize_t (*)(int, const void*, size_t, off64_t)>("pwrite64");
  if (fails(fd, n)) return errno = EIO, -1;
  return real(fd, buf, n, at);
}

ssize_t writev(int fd, const struct iovec* iov, int count) {
  static auto real = next<ssize_t (*)(int, const struct iovec*, int)>("writev");
  if (fails(fd, iov_bytes(iov, count))) return errno = EIO, -1;
  return real(fd, iov, count);
}

ssize_t pwritev(int fd, const struct iovec* iov, int count, off_t at) {
  static auto real = next<ssize_t (*)(int, const struct iovec*, int, off_t)>("pwritev");
  if (fails(fd, iov_bytes(iov, count))) return errno = EIO, -1;
  return real(fd, iov, count, at);
}

ssize_t pwritev64(int fd, const struct iovec* iov, int count, off64_t at) {
  static auto real = next<ssize_t (*)(int, const struct iovec*, int, off64_t)>("pwritev64");
  if (fails(fd, iov_bytes(iov, count))) return errno = EIO, -1;
  return real(fd, iov, count, at);
}

}  // extern "C"
