// All trainable tensors of a model in one flat buffer, with gradients and
// optimizer state laid out identically, so the optimizer, the gradient norm,
// a gradient all-reduce and a checkpoint each see one contiguous array.
//
// The master weights are fp32. The ops read the compute copy (weight()),
// which is the master buffer itself in fp32 runs and a bf16 or fp16 copy
// otherwise, refreshed by the optimizer's update and by refresh_compute().
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
  // compute: the precision of the compute copy the ops read.
  explicit ParameterSet(Ops& ops, DType compute = DType::kF32)
      : ops_(ops), compute_dtype_(compute) {}
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

  // Master weights (fp32).
  float* param(int i) { return whole_masters() + info_[i].offset; }
  // The compute copy of tensor i, what the forward and backward passes read.
  Act weight(int i) const { return compute() + info_[i].offset; }
  // The whole compute copy; the master buffer itself when it is fp32.
  Act compute() const { return compute_ ? Act(compute_, compute_dtype_) : Act::f32(params_); }
  // The compute copy as a separate buffer (null when it is the master).
  Act compute_copy() const { return compute_ ? Act(compute_, compute_dtype_) : Act(); }
  // After the master weights were written other than by the optimizer
  // (initialisation, a checkpoint, a test): brings the compute copy up to
  // date (only the kept range when the masters are sliced).
  void refresh_compute();
  // A sharded optimizer's run with a separate compute copy (bf16, fp16)
  // keeps the fp32 masters of its slice [begin, end) only, and frees the
  // whole ones: the optimizer updates the slice and writes its compute copy,
  // and the ranks all-gather the compute copy. After allocate().
  void keep_masters_of(size_t begin, size_t end);
  bool masters_sliced() const { return sliced_; }
  size_t masters_begin() const { return masters_begin_; }
  size_t masters_end() const { return masters_end_; }
  // The fp32 masters from flat element i on; i in [masters_begin(), masters_end()].
  float* master_at(size_t i) { return params_ + (i - masters_begin_); }
  const float* master_at(size_t i) const { return params_ + (i - masters_begin_); }
  float* grad(int i) { return grads_ + info_[i].offset; }
  // The whole fp32 masters (not while sliced: master_at()).
  float* params() { return whole_masters(); }
  float* grads() { return grads_; }
  const float* params() const { return whole_masters(); }
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
  DType compute_dtype_;
  // params_ when whole; throws while sliced.
  float* whole_masters() const;

  float* params_ = nullptr;  // (total_), or (masters_end_ - masters_begin_) when sliced
  bool sliced_ = false;
  size_t masters_begin_ = 0, masters_end_ = 0;
  float* grads_ = nullptr;   // (total_)
  void* compute_ = nullptr;  // (total_) in compute_dtype_; null when fp32
};

}  // namespace mpiformer
