// An Ops that times every op of another by family on that backend's clock
// (CUDA events on a GPU, so the figures are device time, queued ops
// included) and forwards the call unchanged. `bench --profile` runs the
// model on it; the next bottleneck then shows without a profiler.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "kernels/observed_ops.h"

namespace mpiformer {

class ProfiledOps : public ObservedOps {
 public:
  explicit ProfiledOps(Ops& inner) : ProfiledOps(inner, inner.make_timer()) {}
  // With a timer of the caller's (tests log the order of ops through it).
  ProfiledOps(Ops& inner, std::unique_ptr<OpTimer> timer)
      : ObservedOps(inner), timer_(std::move(timer)) {}

  // Milliseconds per OpFamily since the last reset (waits for the device).
  std::vector<double> milliseconds() { return timer_->milliseconds(); }
  void reset() { timer_->reset(); }

 protected:
  void begin(const OpCall& call) override { timer_->begin(call.family); }
  void end(const OpCall& call) override { timer_->end(call.family); }

 private:
  std::unique_ptr<OpTimer> timer_;
};

}  // namespace mpiformer
