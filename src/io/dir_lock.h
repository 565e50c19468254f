// An exclusive lock on a directory, so that two processes never write one
// output directory at once (two `prepare` into one --out, two runs into one
// RUNDIR). It is flock(LOCK_EX | LOCK_NB) on DIR/.lock, which holds the
// holder's "host pid" so the refused process can name it. The kernel drops
// the lock when the holder exits, however it exits, so a crash leaves no
// stale lock: the next holder simply overwrites the file. A stop signal
// that ends a command at once (stop_cleanup.h) removes it as release does.
#pragma once

#include <string>

#include "src/io/stop_cleanup.h"

namespace mpiformer {

class DirLock {
 public:
  static constexpr const char* kFileName = ".lock";

  DirLock() = default;
  ~DirLock() { release(); }
  DirLock(DirLock&& other) noexcept;
  DirLock& operator=(DirLock&& other) noexcept;
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

  // Locks `dir`, which must exist. Returns "" when this object holds the lock
  // (or already did), else one line saying why not: "DIR is in use by
  // another process (host H, pid P; lock file DIR/.lock)", or
  // "DIR/.lock: cannot lock (reason)". Never blocks. A file system without
  // flock() (ENOLCK, ENOSYS, EOPNOTSUPP: some NFS and Lustre mounts) cannot
  // lock; then this returns "" and enforced() is false.
  std::string try_acquire(const std::string& dir);

  // Removes DIR/.lock and drops the lock; a no-op when none is held.
  void release();

  // Whether try_acquire succeeded and release has not run since.
  bool held() const { return held_; }
  // Whether the lock is a real flock (false on a file system without it).
  bool enforced() const { return fd_ >= 0; }
  // DIR/.lock of the last try_acquire.
  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  bool held_ = false;
  std::string path_;
  RemovedOnStop on_stop_;
};

}  // namespace mpiformer
