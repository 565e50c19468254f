// Backend memory holding a copy of a host vector, for op tests: going
// through the backend keeps a test valid for any Ops.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

#include "kernels/ops.h"

namespace mpiformer {

template <typename T>
class Buffer {
 public:
  Buffer(Ops& ops, const std::vector<T>& host) : ops_(ops), n_(host.size()) {
    ptr_ = static_cast<T*>(ops_.device().allocate(std::max<size_t>(n_, 1) * sizeof(T)));
    ops_.device().copy_to_device(ptr_, host.data(), n_ * sizeof(T));
  }
  ~Buffer() { ops_.device().release(ptr_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  T* get() { return ptr_; }
  // The backend's copy, back on the host.
  std::vector<T> read() {
    std::vector<T> host(n_);
    ops_.device().copy_to_host(host.data(), ptr_, n_ * sizeof(T));
    return host;
  }

 private:
  Ops& ops_;
  size_t n_;
  T* ptr_ = nullptr;
};

}  // namespace mpiformer
