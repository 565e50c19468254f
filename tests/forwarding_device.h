// A Device that forwards every call to another, for tests that change one
// of its methods (copies that arrive late, a wait that faults) and run ops
// on it through ObservedOps(ops, device).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "kernels/device.h"

namespace mpiformer {

class ForwardingDevice : public Device {
 public:
  explicit ForwardingDevice(Device& inner) : inner_(inner) {}
  Device& inner() { return inner_; }

  std::string name() const override { return inner_.name(); }
  void* allocate(size_t bytes) override { return inner_.allocate(bytes); }
  void release(void* ptr) override { inner_.release(ptr); }
  void fill_zero(void* x, size_t bytes) override { inner_.fill_zero(x, bytes); }
  size_t peak_allocated_bytes() const override { return inner_.peak_allocated_bytes(); }
  void* allocate_host(size_t bytes) override { return inner_.allocate_host(bytes); }
  void release_host(void* ptr) override { inner_.release_host(ptr); }
  void copy_to_device(void* dst, const void* src, size_t bytes) override {
    inner_.copy_to_device(dst, src, bytes);
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    inner_.copy_to_host(dst, src, bytes);
  }
  void upload(void* dst, const void* src, size_t bytes) override { inner_.upload(dst, src, bytes); }
  void reserve_uploads(size_t bytes) override { inner_.reserve_uploads(bytes); }
  void copy_to_host_async(int slot, void* dst, const void* src, size_t bytes) override {
    inner_.copy_to_host_async(slot, dst, src, bytes);
  }
  bool host_copy_done(int slot) override { return inner_.host_copy_done(slot); }
  void copy_to_device_async(void* dst, const void* src, size_t bytes) override {
    inner_.copy_to_device_async(dst, src, bytes);
  }
  void synchronize() override { inner_.synchronize(); }
  void* native_stream() const override { return inner_.native_stream(); }
  bool host_accessible() const override { return inner_.host_accessible(); }
  size_t device_memory_free() const override { return inner_.device_memory_free(); }
  size_t logits_chunk_elements() const override { return inner_.logits_chunk_elements(); }
  std::unique_ptr<OpTimer> make_timer() override { return inner_.make_timer(); }

 private:
  Device& inner_;
};

}  // namespace mpiformer
