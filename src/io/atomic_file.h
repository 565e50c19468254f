// Durable, atomic file writes: a reader sees the old file or the new one,
// never half of one, even after a crash or a full disk. Every fault throws
// std::runtime_error "PATH: what is wrong (reason)"; nothing half-written is
// left behind.
#pragma once

#include <string>

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

}  // namespace mpiformer
