// An Ops that waits for the device after every compute op of another and
// checks it, so that a fault (an illegal address, a library error) names
// the op that caused it, with its shapes and element type, instead of
// surfacing ops later. Slow: a first run on a new GPU turns it on with
// MPIFORMER_CUDA_CHECK=1 (src/parallel/rank_device.cpp).
#pragma once

#include <exception>
#include <memory>

#include "kernels/observed_ops.h"

namespace mpiformer {

class CheckedOps : public ObservedOps {
 public:
  explicit CheckedOps(std::unique_ptr<Ops> inner) : ObservedOps(*inner), owned_(std::move(inner)) {}

 protected:
  // Throws std::runtime_error "after OP (dtype; sizes): what the device said".
  void end(const OpCall& call) override;
  // The op itself threw: the same, with the op's own message.
  void failed(const OpCall& call, const std::exception& e) override;

 private:
  std::unique_ptr<Ops> owned_;
};

}  // namespace mpiformer
