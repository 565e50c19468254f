// A stop signal (SIGTERM, SIGINT, SIGHUP) to a command that has no step
// boundary to wait for (generate, classify, prepare): the command's
// unfinished files are removed, one line says so, and the process exits at
// once with 128 + the signal's number, as a shell reports a process that
// signal ended (143, 130, 129). Nothing else can stop SentencePiece's
// training, and a line of decoding may take long. `train` stops at a step
// boundary with a checkpoint instead (src/train/stop_signals.h).
//
// The handler may only call what is async-signal-safe (unlink, rmdir, write,
// _exit), so what it removes is registered beforehand, as paths.
#pragma once

#include <string>

namespace mpiformer {

// "SIGTERM", "SIGUSR1", "SIGINT", "SIGHUP"; "a signal" for any other.
// Async-signal-safe.
const char* stop_signal_name(int signal);

// A file, or a directory removed if empty, that a stop signal removes while
// this object lives (with or without an ExitOnStop installed: one may come
// later). Forgetting it does not remove it: that is its owner's business.
class RemovedOnStop {
 public:
  RemovedOnStop() = default;
  explicit RemovedOnStop(const std::string& path, bool directory = false);
  ~RemovedOnStop() { forget(); }
  RemovedOnStop(RemovedOnStop&& other) noexcept;
  RemovedOnStop& operator=(RemovedOnStop&& other) noexcept;
  RemovedOnStop(const RemovedOnStop&) = delete;
  RemovedOnStop& operator=(const RemovedOnStop&) = delete;

  void forget();

 private:
  struct RemovedPath* entry_ = nullptr;
};

// Installs the handlers for its lifetime and restores the previous ones.
// On a stop it prints `before` + "SIGTERM" + `after` on stderr (nothing if
// both are empty: the ranks that do not speak) and exits. A SIGHUP that was
// ignored (nohup) stays ignored.
class ExitOnStop {
 public:
  ExitOnStop(const std::string& before, const std::string& after);
  ~ExitOnStop();
  ExitOnStop(const ExitOnStop&) = delete;
  ExitOnStop& operator=(const ExitOnStop&) = delete;

  // The outputs are complete and about to be (or already) in place: from
  // now on a stop signal is ignored and the command finishes.
  static void finish();
};

}  // namespace mpiformer
