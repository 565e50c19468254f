// The device interface: where a backend's data lives and how it gets there.
// A Device owns the backend's memory, the copies between it and the host,
// the stream its ops are queued on, what it offers (host access, free
// memory, the logits chunk that suits it) and the clock its ops are timed
// on. It does no math: the ops (kernels/ops.h) run on a Device, and code
// that holds an Ops reaches memory through ops.device().
//
// - Every pointer is this device's memory (host memory for the CPU) except
//   where a comment says "host".
// - Stream order: copies and fills are queued behind the ops before them.
//   Only copy_to_host, copy_to_device and synchronize wait.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace mpiformer {

// Times spans of ops on the device's own clock (CUDA events on a GPU).
class OpTimer {
 public:
  virtual ~OpTimer() = default;
  virtual void begin() = 0;
  virtual void end() = 0;
  // Milliseconds of each begin/end span since the last reset, in order;
  // waits for the device.
  virtual std::vector<double> span_milliseconds() = 0;
  virtual void reset() = 0;
};

class Device {
 public:
  virtual ~Device() = default;
  // "cpu", or "cuda:0 (NVIDIA H100 80GB HBM3)".
  virtual std::string name() const = 0;

  // ---- memory -----------------------------------------------------------
  virtual void* allocate(size_t bytes) = 0;  // zero-filled, 64-byte aligned
  virtual void release(void* ptr) = 0;
  // x[0, bytes) = 0, queued on the stream.  x: (bytes)
  virtual void fill_zero(void* x, size_t bytes) = 0;
  // Peak of the device's own memory so far (buffers, scratch and library
  // workspaces), in bytes.
  virtual size_t peak_allocated_bytes() const = 0;
  // Host memory for copies that overlap the device's work (pinned on a
  // GPU); the CPU's is plain memory.
  virtual void* allocate_host(size_t bytes);
  virtual void release_host(void* ptr);

  // ---- transfers --------------------------------------------------------
  // Synchronous copies: they return when the data has arrived.
  // dst: (bytes), host_src: host (bytes); host_dst: host (bytes), src: (bytes)
  virtual void copy_to_device(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void copy_to_host(void* host_dst, const void* src, size_t bytes) = 0;
  // A stream-ordered copy from the host: queued behind the ops before it and
  // staged (through pinned memory on a GPU), so host_src may change as soon
  // as it returns. For the per-batch data of a step.
  virtual void upload(void* dst, const void* host_src, size_t bytes) = 0;
  // Staging memory for uploads of up to `bytes` in flight, allocated now so
  // that a step allocates nothing.
  virtual void reserve_uploads(size_t bytes) { (void)bytes; }
  // A stream-ordered copy into allocate_host memory: queued behind the ops
  // before it, it returns at once; host_copy_done(slot) says whether the
  // latest copy of `slot` has arrived. The CPU copies at once.
  virtual void copy_to_host_async(int slot, void* host_dst, const void* src, size_t bytes) {
    (void)slot;
    copy_to_host(host_dst, src, bytes);
  }
  virtual bool host_copy_done(int slot) {
    (void)slot;
    return true;
  }
  // A stream-ordered copy from allocate_host memory, which must not change
  // before the ops queued after it have run.
  virtual void copy_to_device_async(void* dst, const void* host_src, size_t bytes) {
    copy_to_device(dst, host_src, bytes);
  }

  // ---- stream -----------------------------------------------------------
  // Returns when everything queued so far has run.
  virtual void synchronize() = 0;
  // The stream every op is queued on (a cudaStream_t on a GPU), for a
  // transport that orders its own stream after it; null on the CPU.
  virtual void* native_stream() const { return nullptr; }

  // ---- capabilities -----------------------------------------------------
  // Whether the host may read and write this device's memory directly
  // (CPU: yes; a GPU's: no, copy_to_host and copy_to_device).
  virtual bool host_accessible() const { return true; }
  // Free memory of the device that is not the host's (cudaMemGetInfo); 0
  // where the device's memory is the host's.
  virtual size_t device_memory_free() const { return 0; }
  // How many logits the vocabulary projection may hold at a time: a CPU
  // wants its chunks in cache, a GPU wants GEMMs with many rows.
  virtual size_t logits_chunk_elements() const { return size_t{1} << 22; }

  // ---- timers -----------------------------------------------------------
  // A timer for the ops queued on this device (bench --profile).
  virtual std::unique_ptr<OpTimer> make_timer() = 0;
};

// Host memory that a device copies to or from at the bus's pace (pinned on
// a GPU: Device::allocate_host), released with it; it grows and never
// shrinks. MPIFORMER_HOST_PAGEABLE=1 makes it plain memory, to measure
// what pinning gains.
class HostBuffer {
 public:
  explicit HostBuffer(Device& device);
  ~HostBuffer();
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  // At least `bytes`; the contents are kept only when it does not grow.
  void* reserve(size_t bytes);

 private:
  void release();

  Device& device_;
  bool pinned_;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace mpiformer
