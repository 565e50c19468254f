// Errors. A UsageError is a bad flag or value: one line naming the flag and
// what is allowed, exit code 2, before any work starts. Anything else that
// goes wrong is a std::runtime_error (exit code 1); under MPI the rank that
// saw it prints "[rank r] message" and aborts every rank.
#pragma once

#include <stdexcept>
#include <string>

namespace mpiformer {

constexpr int kExitUsage = 2;
constexpr int kExitFailure = 1;
// Training stopped early on SIGTERM, SIGUSR1, SIGINT or SIGHUP after
// writing a checkpoint: "resume me" (EX_TEMPFAIL of sysexits.h). slurm/
// scripts requeue on it.
constexpr int kExitStopped = 75;
// Training stopped because the loss or the gradient norm was not finite
// (--on-divergence): nothing of the diverged step was saved, and the last
// good checkpoint is `latest`. Resuming as is would diverge again.
constexpr int kExitDiverged = 3;

class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
  // "FLAG: REASON", keeping both: a value read from a file names its key and
  // gives the flag's reason (a checkpoint's config).
  UsageError(const std::string& flag, const std::string& reason)
      : std::runtime_error(flag + ": " + reason), flag_(flag), reason_(reason) {}
  // What the flag was refused for, without the flag; "" when not made so.
  const std::string& flag() const { return flag_; }
  const std::string& reason() const { return reason_; }

 private:
  std::string flag_, reason_;
};

// A failure of the command as a whole rather than of one rank (an output
// that cannot be written): one line "mpiformer WHAT", exit code 1.
class CommandError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Throws UsageError("--flag: message").
[[noreturn]] void usage_error(const std::string& flag, const std::string& message);

// A size in messages: "12.3 GiB", "456.0 MiB", "0.9 KiB".
std::string format_bytes(double bytes);

}  // namespace mpiformer
