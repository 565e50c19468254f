// What ObservedOps and CheckedOps say about an op (kernels/observed_ops.h,
// kernels/checked_ops.h).
#include "kernels/observed_ops.h"

#include <stdexcept>
#include <string>

#include "kernels/checked_ops.h"

namespace mpiformer {

std::string describe(const OpCall& call) {
  std::string text = std::string(call.name) + " (" + to_string(call.dtype);
  const char* separator = "; ";
  for (const OpCall::Size& size : call.sizes) {
    text += separator + std::string(size.name) + " " + std::to_string(size.value);
    separator = ", ";
  }
  return text + ")";
}

void CheckedOps::end(const OpCall& call) {
  try {
    device().synchronize();
  } catch (const std::exception& e) {
    throw std::runtime_error("after " + describe(call) + ": " + e.what());
  }
}

void CheckedOps::failed(const OpCall& call, const std::exception& e) {
  throw std::runtime_error("in " + describe(call) + ": " + e.what());
}

}  // namespace mpiformer
