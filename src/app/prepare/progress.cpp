// The report's figures and the progress of prepare's long phases
// (progress.h): number and time formatting, the Throttle of the encoding
// loops and the Heartbeat thread that speaks while SentencePiece trains.
#include "src/app/prepare/progress.h"

#include <cstdio>
#include <utility>

namespace mpiformer::prepare {

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string format_seconds(double seconds) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f s", seconds);
  return text;
}

std::string grouped(int64_t n) {
  std::string digits = std::to_string(n < 0 ? -n : n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return (n < 0 ? "-" : "") + out;
}

bool Throttle::due() {
  const auto now = Clock::now();
  if (std::chrono::duration<double>(now - last_).count() < kProgressSeconds) return false;
  last_ = now;
  return true;
}

Heartbeat::~Heartbeat() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void Heartbeat::run() {
  const auto start = Clock::now();
  std::unique_lock<std::mutex> lock(mutex_);
  while (!changed_.wait_for(lock, std::chrono::duration<double>(kProgressSeconds),
                            [this] { return stop_; })) {
    say_(seconds_since(start));
  }
}

}  // namespace mpiformer::prepare
