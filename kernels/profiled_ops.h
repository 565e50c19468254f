// An Ops that times every op of another on its device's clock (CUDA
// events on a GPU, so the figures are device time, queued ops included),
// by family and by call, and forwards the call unchanged. `bench --profile`
// runs the model on it; the next bottleneck then shows without a profiler.
// Memory and copies are the device's and are not timed.
#pragma once

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/observed_ops.h"

namespace mpiformer {

class ProfiledOps : public ObservedOps {
 public:
  explicit ProfiledOps(Ops& inner) : ProfiledOps(inner, inner.device().make_timer()) {}
  // With a timer of the caller's (tests log the order of ops through it).
  ProfiledOps(Ops& inner, std::unique_ptr<OpTimer> timer)
      : ObservedOps(inner), timer_(std::move(timer)) {}

  // Milliseconds per OpFamily since the last reset (waits for the device).
  std::vector<double> milliseconds() {
    const std::vector<double> spans = timer_->span_milliseconds();
    std::vector<double> ms(static_cast<int>(OpFamily::kCount), 0.0);
    for (size_t i = 0; i < spans.size() && i < calls_.size(); ++i)
      ms[static_cast<int>(calls_[i].family)] += spans[i];
    return ms;
  }
  void reset() {
    timer_->reset();
    calls_.clear();
  }

  // The op calls since the last reset, the same op on the same sizes taken
  // together ("matmul_backward (bf16; N 8192, IC 768, OC 50257)", with
  // their operations where the sizes tell them), the costliest first
  // (waits for the device).
  struct CallTotal {
    std::string call;
    double ms = 0.0;
    long long count = 0;
    double flops = 0.0;  // call_flops over the calls; 0 where the sizes do not tell
  };
  std::vector<CallTotal> call_totals() {
    const std::vector<double> spans = timer_->span_milliseconds();
    std::map<std::string, CallTotal> by_call;
    for (size_t i = 0; i < spans.size() && i < calls_.size(); ++i) {
      CallTotal& total = by_call[calls_[i].description];
      total.call = calls_[i].description;
      total.ms += spans[i];
      ++total.count;
      total.flops += calls_[i].flops;
    }
    std::vector<CallTotal> totals;
    for (auto& [call, total] : by_call) totals.push_back(total);
    std::sort(totals.begin(), totals.end(),
              [](const CallTotal& a, const CallTotal& b) { return a.ms > b.ms; });
    return totals;
  }

 protected:
  void begin(const OpCall&) override { timer_->begin(); }
  void end(const OpCall& call) override {
    timer_->end();
    calls_.push_back({call.family, describe(call), call_flops(call)});
  }

 private:
  struct TimedCall {
    OpFamily family;
    std::string description;
    double flops;
  };
  std::unique_ptr<OpTimer> timer_;
  std::vector<TimedCall> calls_;  // each timed span's call, in order
};

}  // namespace mpiformer
