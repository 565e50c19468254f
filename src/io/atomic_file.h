// Durable, atomic file writes: a reader sees the old file or the new one,
// never half of one, even after a crash or a full disk. Every fault throws
// std::runtime_error "PATH: what is wrong (reason)"; nothing half-written is
// left behind.
#pragma once

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

// Writes `text` to `path`: PATH.tmp, fsync, rename, fsync of the directory.
void write_file_atomically(const std::string& path, const std::string& text);

// PATH.tmp-PID: where this process writes PATH until it is complete. The
// pid lets a later process tell a temporary of a writer that was killed
// from one still being written.
std::string temporary_name(const std::string& path);

// Whether `name` (a file name, no directory) is a temporary_name of a
// process that no longer runs on this host; if so, *final_name is the name
// it stood for.
bool abandoned_temporary(const std::string& name, std::string* final_name);

// A text file written piece by piece under temporary_name(path) and renamed
// onto `path` by commit(): until then `path` keeps what it held, or stays
// absent. Faults name `path`. A file never committed has its temporary
// removed by the destructor, or by a stop signal (stop_cleanup.h). A
// device or FIFO (/dev/null) is written in place; through a symbolic link,
// the file it names is replaced.
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
  std::string path_, target_, temporary_;  // temporary_: "" once committed or in place
  int fd_ = -1;
  RemovedOnStop on_stop_;
};

}  // namespace mpiformer
