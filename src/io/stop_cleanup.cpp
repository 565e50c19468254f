#include "src/io/stop_cleanup.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <utility>

namespace mpiformer {

// One registered path. Entries are never freed (a few bytes a file, for a
// process that runs one command): the handler may be walking the list on
// another thread at any moment, so an entry is only ever marked dead.
struct RemovedPath {
  std::atomic<bool> live{true};
  bool directory = false;
  const char* path = nullptr;
  RemovedPath* next = nullptr;
};

namespace {

std::atomic<RemovedPath*> registered{nullptr};

constexpr int kStopSignals[] = {SIGTERM, SIGINT, SIGHUP};
struct sigaction saved[3];
bool installed[3] = {false, false, false};

std::atomic<bool> finished{false};
std::atomic_flag exiting = ATOMIC_FLAG_INIT;
// The stop line's two halves, copied into storage that outlives any handler.
char line_before[1024] = "";
char line_after[1024] = "";

void copy_line(const std::string& text, char (&into)[1024]) {
  const size_t n = std::min(text.size(), sizeof(into) - 1);
  std::memcpy(into, text.data(), n);
  into[n] = '\0';
}

void write_all(const char* text) {
  size_t left = std::strlen(text);
  while (left > 0) {
    const ssize_t n = ::write(STDERR_FILENO, text, left);
    if (n <= 0) return;  // stderr gone: the files matter more than the line
    text += n;
    left -= static_cast<size_t>(n);
  }
}

// Async-signal-safe: unlink, rmdir, write, _exit.
extern "C" void exit_on_stop(int signal) {
  if (finished.load()) return;
  // Two signals on two threads: the first one does it all.
  if (exiting.test_and_set()) return;
  // Files first, then the directories they emptied.
  for (const bool directories : {false, true}) {
    for (RemovedPath* e = registered.load(); e; e = e->next) {
      if (!e->live.load() || e->directory != directories) continue;
      if (directories) {
        ::rmdir(e->path);
      } else {
        ::unlink(e->path);
      }
    }
  }
  if (line_before[0] != '\0' || line_after[0] != '\0') {
    write_all(line_before);
    write_all(stop_signal_name(signal));
    write_all(line_after);
    write_all("\n");
  }
  ::_exit(128 + signal);
}

}  // namespace

const char* stop_signal_name(int signal) {
  switch (signal) {
    case SIGTERM:
      return "SIGTERM";
    case SIGUSR1:
      return "SIGUSR1";
    case SIGINT:
      return "SIGINT";
    case SIGHUP:
      return "SIGHUP";
    default:
      return "a signal";
  }
}

RemovedOnStop::RemovedOnStop(const std::string& path, bool directory) {
  char* copy = new char[path.size() + 1];
  std::memcpy(copy, path.c_str(), path.size() + 1);
  entry_ = new RemovedPath;
  entry_->directory = directory;
  entry_->path = copy;
  // Published whole: the handler sees the entry complete or not at all.
  entry_->next = registered.load();
  while (!registered.compare_exchange_weak(entry_->next, entry_)) {
  }
}

RemovedOnStop::RemovedOnStop(RemovedOnStop&& other) noexcept
    : entry_(std::exchange(other.entry_, nullptr)) {}

RemovedOnStop& RemovedOnStop::operator=(RemovedOnStop&& other) noexcept {
  if (this != &other) {
    forget();
    entry_ = std::exchange(other.entry_, nullptr);
  }
  return *this;
}

void RemovedOnStop::forget() {
  if (entry_) entry_->live.store(false);
  entry_ = nullptr;
}

ExitOnStop::ExitOnStop(const std::string& before, const std::string& after) {
  copy_line(before, line_before);
  copy_line(after, line_after);
  finished.store(false);
  exiting.clear();
  struct sigaction action {};
  action.sa_handler = exit_on_stop;
  action.sa_flags = SA_RESTART;  // after finish(), an ignored signal interrupts nothing
  sigemptyset(&action.sa_mask);
  for (int i = 0; i < 3; ++i) {
    const int signal = kStopSignals[i];
    struct sigaction old {};
    sigaction(signal, nullptr, &old);
    // nohup: the user asked for hang-ups to be ignored.
    if (signal == SIGHUP && old.sa_handler == SIG_IGN) continue;
    installed[i] = sigaction(signal, &action, &saved[i]) == 0;
  }
}

ExitOnStop::~ExitOnStop() {
  for (int i = 0; i < 3; ++i) {
    if (installed[i]) sigaction(kStopSignals[i], &saved[i], nullptr);
    installed[i] = false;
  }
}

void ExitOnStop::finish() {
  finished.store(true);
}

}  // namespace mpiformer
