// The CPU backend's device (kernels/device.h): host memory, 64-byte aligned
// (a cache line, one AVX-512 vector) and zero filled, with the running and
// peak byte counts. Copies are memcpy and the ops run to completion, so
// nothing is ever queued and synchronize has nothing to wait for.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "kernels/device.h"

namespace mpiformer {

class CpuDevice final : public Device {
 public:
  std::string name() const override { return "cpu"; }

  void* allocate(size_t bytes) override;
  void release(void* ptr) override;
  void fill_zero(void* x, size_t bytes) override;
  size_t peak_allocated_bytes() const override { return peak_bytes_; }
  void copy_to_device(void* dst, const void* host_src, size_t bytes) override;
  void copy_to_host(void* host_dst, const void* src, size_t bytes) override;
  void upload(void* dst, const void* host_src, size_t bytes) override;
  void synchronize() override {}
  // Spans timed by the wall clock.
  std::unique_ptr<OpTimer> make_timer() override;

 private:
  size_t current_bytes_ = 0;
  size_t peak_bytes_ = 0;
};

}  // namespace mpiformer
