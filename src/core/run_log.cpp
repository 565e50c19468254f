#include "src/core/run_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstring>
#include <ctime>
#include <mutex>
#include <stdexcept>
#include <vector>

#include "src/core/own_file.h"

namespace mpiformer {
namespace {

// Start-up lines held until a log is attached: a few kilobytes in practice.
constexpr size_t kHeldLimit = size_t{1} << 20;

struct RunLog {
  std::mutex mutex;
  int fd = -1;
  bool holding = true;
  std::string held;
  bool line_start = true;  // the next text begins a line (it gets a time stamp)
};

// `text` with each line begun by the local time ("2026-11-25 14:03:07 "):
// a log read days later says when each thing happened.
std::string stamped(const std::string& text, bool* line_start) {
  char stamp[32] = "";
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  if (localtime_r(&now, &local) != nullptr) std::strftime(stamp, sizeof stamp, "%F %T ", &local);
  std::string out;
  out.reserve(text.size() + 32);
  for (char c : text) {
    if (*line_start) out += stamp;
    out += c;
    *line_start = c == '\n';
  }
  return out;
}

RunLog& run_log() {
  static RunLog log;
  return log;
}

// write(2) all of `text`; a failing log (full disk) never stops the run.
void write_all(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

}  // namespace

void say(std::FILE* stream, const char* format, ...) {
  std::va_list args;
  va_start(args, format);
  std::va_list copy;
  va_copy(copy, args);
  std::vfprintf(stream, format, args);
  va_end(args);

  RunLog& log = run_log();
  std::lock_guard<std::mutex> lock(log.mutex);
  if (log.fd >= 0 || (log.holding && log.held.size() < kHeldLimit)) {
    const int n = std::vsnprintf(nullptr, 0, format, copy);
    va_end(copy);
    if (n <= 0) return;
    va_start(copy, format);
    std::string text(static_cast<size_t>(n) + 1, '\0');
    std::vsnprintf(text.data(), text.size(), format, copy);
    text.pop_back();
    if (log.fd >= 0) {
      write_all(log.fd, stamped(text, &log.line_start));
    } else {
      log.held += stamped(text, &log.line_start);
    }
  }
  va_end(copy);
}

void attach_run_log(const std::string& path) {
  std::string why;
  const int fd = open_regular_file(path, O_WRONLY | O_CREAT | O_APPEND, &why);
  if (fd < 0) throw std::runtime_error(path + ": " + why);
  RunLog& log = run_log();
  std::lock_guard<std::mutex> lock(log.mutex);
  if (log.fd >= 0) ::close(log.fd);
  log.fd = fd;
  write_all(fd, log.held);
  log.held.clear();
  log.holding = false;
}

void detach_run_log() {
  RunLog& log = run_log();
  std::lock_guard<std::mutex> lock(log.mutex);
  if (log.fd >= 0) ::close(log.fd);
  log.fd = -1;
  log.holding = false;
  log.held.clear();
}

}  // namespace mpiformer
