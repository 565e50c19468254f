#include "src/core/parameters.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <stdexcept>

#include "kernels/dropout_mask.h"

namespace mpiformer {

namespace {

// FNV-1a over the name's bytes: stable across compilers and runs, unlike
// std::hash, so a checkpoint-free restart initialises identically.
uint64_t hash_name(const std::string& name) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char c : name) {
    h = (h ^ c) * 0x100000001B3ull;
  }
  return mix64(h);
}

// Fills x with N(0, stddev^2). Element i takes its value from pair i / 2 of the
// stream `key` alone (Box-Muller gives two normals per 64-bit hash), so the
// values do not depend on thread count, tensor order or other tensors.
// x: host (n)
void fill_normal(float* x, size_t n, uint64_t key, float stddev) {
  const size_t pairs = (n + 1) / 2;
#pragma omp parallel for schedule(static)
  for (size_t p = 0; p < pairs; ++p) {
    const uint64_t h = mix64(key + p);
    // u1 in (0, 1] keeps the log finite; u2 in [0, 1).
    const double u1 = (static_cast<double>(h >> 32) + 1.0) * 0x1p-32;
    const double u2 = static_cast<double>(h & 0xFFFFFFFFull) * 0x1p-32;
    const double r = stddev * std::sqrt(-2.0 * std::log(u1));
    const double theta = 2.0 * std::numbers::pi * u2;
    x[2 * p] = static_cast<float>(r * std::cos(theta));
    if (2 * p + 1 < n) x[2 * p + 1] = static_cast<float>(r * std::sin(theta));
  }
}

}  // namespace

ParameterSet::~ParameterSet() {
  if (params_) ops_.device().release(params_);
  if (grads_) ops_.device().release(grads_);
  if (compute_) ops_.device().release(compute_);
}

int ParameterSet::add(const std::string& name, std::vector<int> shape, bool decay, Init init,
                      float init_std) {
  if (params_) throw std::runtime_error("parameter '" + name + "' added after allocate()");
  if (find(name) >= 0) throw std::runtime_error("parameter '" + name + "' added twice");
  if (shape.empty()) throw std::runtime_error("parameter '" + name + "' has no shape");
  size_t size = 1;
  for (int d : shape) {
    if (d <= 0) throw std::runtime_error("parameter '" + name + "' has a non-positive dimension");
    size *= static_cast<size_t>(d);
  }
  ParamInfo info;
  info.name = name;
  info.shape = std::move(shape);
  // Packed without gaps: count() is then exactly the number of parameters,
  // and adjacent tensors can be updated as one range.
  info.offset = total_;
  info.size = size;
  info.decay = decay;
  info.init = init;
  info.init_std = init_std;
  info_.push_back(std::move(info));
  total_ += size;
  return static_cast<int>(info_.size()) - 1;
}

void ParameterSet::allocate(uint64_t seed) {
  if (params_) throw std::runtime_error("ParameterSet::allocate called twice");
  if (total_ == 0) throw std::runtime_error("ParameterSet::allocate with no parameters");
  const size_t bytes = total_ * sizeof(float);
  params_ = static_cast<float*>(ops_.device().allocate(bytes));
  grads_ = static_cast<float*>(ops_.device().allocate(bytes));
  // One spare element: a sliced run all-gathers the compute copy as floats,
  // so a 2-byte copy is padded to whole floats.
  if (compute_dtype_ != DType::kF32)
    compute_ = ops_.device().allocate((total_ + 1) * dtype_bytes(compute_dtype_));
  masters_end_ = total_;

  const uint64_t seed_key = mix64(seed);
  std::vector<float> host;  // reused across tensors: (largest tensor)
  for (const ParamInfo& t : info_) {
    if (t.init == Init::kZeros) continue;  // allocate() already zero-fills
    host.resize(t.size);
    if (t.init == Init::kOnes) {
      std::fill(host.begin(), host.end(), 1.0f);
    } else {
      fill_normal(host.data(), t.size, mix64(seed_key ^ hash_name(t.name)), t.init_std);
    }
    ops_.device().copy_to_device(params_ + t.offset, host.data(), t.size * sizeof(float));
  }
  refresh_compute();
}

void ParameterSet::refresh_compute() {
  if (compute_) {
    ops_.convert(compute_copy() + masters_begin_, params_, masters_end_ - masters_begin_);
  }
}

void ParameterSet::keep_masters_of(size_t begin, size_t end) {
  if (!params_ || !compute_ || sliced_ || begin > end || end > total_)
    throw std::logic_error("ParameterSet::keep_masters_of: not a slice of whole masters");
  std::vector<float> host(end - begin);  // (end - begin)
  ops_.device().copy_to_host(host.data(), params_ + begin, host.size() * sizeof(float));
  ops_.device().release(params_);
  // An empty slice still gets a float, so the pointer is not null.
  params_ =
      static_cast<float*>(ops_.device().allocate(std::max<size_t>(host.size(), 1) * sizeof(float)));
  ops_.device().copy_to_device(params_, host.data(), host.size() * sizeof(float));
  sliced_ = true;
  masters_begin_ = begin;
  masters_end_ = end;
}

float* ParameterSet::whole_masters() const {
  if (sliced_) throw std::logic_error("the whole master weights were asked of a sliced run");
  return params_;
}

int ParameterSet::find(const std::string& name) const {
  for (size_t i = 0; i < info_.size(); ++i) {
    if (info_[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

void ParameterSet::zero_grads() {
  if (grads_) ops_.device().fill_zero(grads_, total_ * sizeof(float));
}

}  // namespace mpiformer
