// All trainable tensors of a model in one flat buffer, with gradients and
// optimizer state laid out identically, so the optimizer, the gradient norm,
// a gradient all-reduce and a checkpoint each see one contiguous array.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/ops.h"

namespace mpiformer {

enum class Init { kZeros, kOnes, kNormal };

struct ParamInfo {
  std::string name;        // e.g. "decoder.layers.0.attn.qkv.weight"
  std::vector<int> shape;  // row-major
  size_t offset = 0;       // floats from the start of the flat buffer
  size_t size = 0;         // floats
  bool decay = false;      // weight decay applies (matrices; not biases, norms, embeddings)
  Init init = Init::kZeros;
  float init_std = 0.0f;
};

class ParameterSet {
 public:
  explicit ParameterSet(Ops& ops) : ops_(ops) {}
  ~ParameterSet();
  ParameterSet(const ParameterSet&) = delete;
  ParameterSet& operator=(const ParameterSet&) = delete;

  // Registers a tensor; returns its index. Only before allocate().
  int add(const std::string& name, std::vector<int> shape, bool decay, Init init,
          float init_std = 0.0f);
  // Allocates params and grads (zeroed) and initialises params from `seed`:
  // tensor i draws from its own counter-based stream, so initial values do not
  // depend on the order or number of other tensors.
  void allocate(uint64_t seed);

  float* param(int i) { return params_ + info_[i].offset; }
  float* grad(int i) { return grads_ + info_[i].offset; }
  float* params() { return params_; }
  float* grads() { return grads_; }
  const float* params() const { return params_; }
  const float* grads() const { return grads_; }
  size_t count() const { return total_; }  // floats in all tensors
  const std::vector<ParamInfo>& info() const { return info_; }
  int find(const std::string& name) const;  // -1 when absent
  void zero_grads();
  Ops& ops() const { return ops_; }  // const: a checkpoint copies through it

 private:
  Ops& ops_;
  std::vector<ParamInfo> info_;
  size_t total_ = 0;
  float* params_ = nullptr;  // (total_)
  float* grads_ = nullptr;   // (total_)
};

}  // namespace mpiformer
