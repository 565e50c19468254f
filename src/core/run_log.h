// Rank 0's output, also kept in RUNDIR/train.log: every line the trainer
// prints goes through say(), which writes it to its stream and, once a run
// directory is claimed, appends it to the log, each line there begun by the
// local time it was said ("2026-11-25 14:03:07 step 10/200 | ..."). Lines said before that are
// held and written first, so the log of a run starts with its start-up lines.
// A job that never claims its directory (busy, refused) writes no log.
#pragma once

#include <cstdio>
#include <string>

namespace mpiformer {

// printf to `stream` (stdout or stderr), and to the run log.
void say(std::FILE* stream, const char* format, ...) __attribute__((format(printf, 2, 3)));

// From now on, every said line is also appended to `path` (the lines held so
// far first). Throws std::runtime_error when the file cannot be opened.
void attach_run_log(const std::string& path);

// Stops appending (and holding): for ranks and commands without a run log.
void detach_run_log();

}  // namespace mpiformer
