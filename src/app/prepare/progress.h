// Rank 0's report while `mpiformer prepare` works: the figures as people
// read them ("1,234,567", "12.3 s"), and the two ways a long phase keeps
// talking: a Throttle for a loop that can ask, at most once every
// kProgressSeconds, whether to report, and a Heartbeat thread for a call
// that cannot (SentencePiece's training). So a large corpus is never silent
// for long while a small one gets only the phase lines.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace mpiformer::prepare {

using Clock = std::chrono::steady_clock;

constexpr double kProgressSeconds = 5.0;

// Rank 0's report: one line at a time, on stdout, flushed at once (a no-op
// on the other ranks).
using Say = std::function<void(const std::string&)>;

double seconds_since(Clock::time_point start);

// "12.3 s"
std::string format_seconds(double seconds);

// 1234567 -> "1,234,567": the summary's figures are read by people.
std::string grouped(int64_t n);

// True at most once per kProgressSeconds: a long phase reports as it goes,
// a short one not at all.
class Throttle {
 public:
  bool due();

 private:
  Clock::time_point last_ = Clock::now();
};

// Calls say(seconds) every kProgressSeconds from a thread of its own until
// destroyed: SentencePiece trains without a word, for minutes on a large
// corpus.
class Heartbeat {
 public:
  explicit Heartbeat(std::function<void(double)> say)
      : say_(std::move(say)), thread_([this] { run(); }) {}
  ~Heartbeat();
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

 private:
  void run();

  std::function<void(double)> say_;
  std::mutex mutex_;
  std::condition_variable changed_;
  bool stop_ = false;
  std::thread thread_;  // last: starts once the members above exist
};

}  // namespace mpiformer::prepare
