// What ObservedOps and CheckedOps say about an op (kernels/observed_ops.h,
// kernels/checked_ops.h).
#include "kernels/observed_ops.h"

#include <cstring>
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

namespace {

// The size of `name` in the call (0 where it has none).
double size_of(const OpCall& call, const char* name) {
  for (const OpCall::Size& size : call.sizes)
    if (std::strcmp(size.name, name) == 0) return static_cast<double>(size.value);
  return 0.0;
}

// Attention's forward operations over a batch of equal lengths; 0 for a
// ragged one.
double attention_forward_flops(const OpCall& call) {
  const double batch = size_of(call, "B"), nq = size_of(call, "Nq"), nk = size_of(call, "Nk");
  const double lq = size_of(call, "longest q"), lk = size_of(call, "longest k");
  if (batch <= 0 || nq != batch * lq || nk != batch * lk) return 0.0;
  const double flops = 4.0 * batch * lq * lk * size_of(call, "heads") * size_of(call, "head size");
  return size_of(call, "causal") != 0 ? flops / 2.0 : flops;
}

}  // namespace

double call_flops(const OpCall& call) {
  const std::string name = call.name;
  const double product = 2.0 * size_of(call, "N") * size_of(call, "IC") * size_of(call, "OC");
  if (name == "matmul_forward") return product;
  if (name == "matmul_backward") return product * (size_of(call, "dx") != 0 ? 2.0 : 1.0);
  if (name == "attention_forward") return attention_forward_flops(call);
  if (name == "attention_backward") return 2.5 * attention_forward_flops(call);
  return 0.0;
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
