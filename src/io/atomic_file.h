// Durable, atomic file writes: a reader sees the old file or the new one,
// never half of one, even after a crash or a full disk. Every fault throws
// std::runtime_error "PATH: what is wrong (reason)"; nothing half-written is
// left behind.
#pragma once

#include <cstdint>
#include <string>

#include "src/io/stop_cleanup.h"

namespace mpiformer {

// Flushes a written file's data to stable storage.
void fsync_file(const std::string& path);

// Makes a rename in `dir` durable. File systems that cannot fsync a
// directory (EINVAL) order renames themselves, so that is not a fault.
void fsync_dir(const std::string& dir);

// Moves a complete, fsync'ed `tmp` onto `path` and makes the move durable;
// removes `tmp` when the move fails.
void commit_file(const std::string& tmp, const std::string& path);

// Sets aside `bytes` of disk beyond the end of the existing file `path`
// (fallocate, keeping its size), so that writing them later cannot meet a
// full disk or a quota half-way: a collective writer cannot leave a write
// that failed on one rank (its ranks would wait on each other for ever).
// Returns 0, or the errno why not (ENOSPC, EDQUOT, EFBIG: beyond the file
// size limit of `ulimit -f`). A file system without fallocate (EOPNOTSUPP)
// sets nothing aside and returns 0.
int reserve_file_space(const std::string& path, uint64_t bytes);

// Gives back the disk reserve_file_space set aside beyond the end of the
// file; a file system that cannot punch holes keeps it until the file goes.
void release_reserved_space(const std::string& path);

// The largest file this process may write (ulimit -f), or UINT64_MAX.
uint64_t file_size_limit();

// Writes `text` to `path`: PATH.tmp, fsync, rename, fsync of the directory.
void write_file_atomically(const std::string& path, const std::string& text);

// This host's name as it stands in temporary_name (gethostname, any
// character but letters, digits, '.', '_' and '-' as '_').
std::string host_in_file_names();

// PATH.tmp-HOST-PID: where this process writes PATH until it is complete.
// The host keeps the writers of two nodes apart on a shared file system
// (their pids may be equal), and the pid lets a later process on the same
// host tell a temporary of a writer that was killed from one still being
// written.
std::string temporary_name(const std::string& path);

// Whether `name` (a file name, no directory) is a temporary_name of a
// writer that no longer runs; if so, *final_name is the name it stood for.
// A writer of this host (or a PATH.tmp-PID of older versions) is looked
// up by its pid. One of another host cannot be looked up from here and
// counts as gone: call this only under a lock that every writer of such
// files holds while it runs (prepare's output directory lock).
bool abandoned_temporary(const std::string& name, std::string* final_name);

// Whether `name` is a NAME.tmp, the temporary of versions before
// temporary_name: its writer cannot be looked up.
bool older_temporary(const std::string& name);

// A text file written piece by piece under temporary_name(path) and renamed
// onto `path` by commit(): until then `path` keeps what it held, or stays
// absent. Faults name `path`. A file never committed has its temporary
// removed by the destructor, or by a stop signal (stop_cleanup.h). A
// device or FIFO (/dev/null) is written in place; a symbolic link to a
// file is replaced, never written through.
class StagedTextFile {
 public:
  // Creates the temporary: "PATH: cannot create (reason)".
  explicit StagedTextFile(const std::string& path);
  ~StagedTextFile();
  StagedTextFile(const StagedTextFile&) = delete;
  StagedTextFile& operator=(const StagedTextFile&) = delete;

  // Appends `text`, written through at once: "PATH: cannot write (reason)".
  void write(const std::string& text);

  // Flushes to stable storage and renames onto the path, durably.
  void commit();

  const std::string& path() const { return path_; }

 private:
  std::string path_, temporary_;  // temporary_: "" once committed or in place
  int fd_ = -1;
  RemovedOnStop on_stop_;
};

}  // namespace mpiformer
