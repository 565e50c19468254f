// The CUDA backend's device (kernels/device.h): one GPU's memory, the
// copies to and from it, and the stream every op of the backend is queued
// on. Per-batch data comes through upload(), staged in a pinned ring
// (kernels/staging_ring.h), so nothing in a step waits for the GPU except
// what the caller reads back.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "kernels/device.h"
#include "kernels/staging_ring.h"

namespace mpiformer {

namespace cuda {

// Throws std::runtime_error "CUDA error in WHAT: reason" on failure.
void check(cudaError_t status, const char* what);

class UploadEvents;  // device.cu

}  // namespace cuda

class CudaDevice final : public Device {
 public:
  // Binds this process to GPU `ordinal` (cudaSetDevice) and creates its
  // stream. Throws std::runtime_error.
  explicit CudaDevice(int ordinal);
  ~CudaDevice() override;
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  std::string name() const override { return name_; }
  int ordinal() const { return ordinal_; }
  cudaStream_t stream() const { return stream_; }

  void* allocate(size_t bytes) override;  // 256-byte aligned
  void release(void* ptr) override;
  void fill_zero(void* x, size_t bytes) override;
  size_t peak_allocated_bytes() const override { return peak_bytes_; }
  void* allocate_host(size_t bytes) override;  // pinned
  void release_host(void* ptr) override;
  void copy_to_device(void* dst, const void* host_src, size_t bytes) override;
  void copy_to_host(void* host_dst, const void* src, size_t bytes) override;
  void upload(void* dst, const void* host_src, size_t bytes) override;
  void reserve_uploads(size_t bytes) override;
  void copy_to_host_async(int slot, void* host_dst, const void* src, size_t bytes) override;
  bool host_copy_done(int slot) override;
  void copy_to_device_async(void* dst, const void* host_src, size_t bytes) override;
  void synchronize() override;
  void* native_stream() const override { return stream_; }
  bool host_accessible() const override { return false; }
  size_t device_memory_free() const override;
  // Large, not sized for L2: each chunk's GEMM reads the whole output
  // weight (V x C: 77 MB at GPT-2 small in bf16, more than a Hopper's 50
  // MB of L2), so chunks whose logits stay in L2 (about 250 rows) would
  // read it again every 250 rows: more bytes than the logits they keep out
  // of memory.
  size_t logits_chunk_elements() const override { return size_t{1} << 29; }
  // Spans timed by CUDA events on the stream.
  std::unique_ptr<OpTimer> make_timer() override;

  // Memory the ops hold outside allocate (their scratch, a library's
  // workspace), counted in peak_allocated_bytes while they hold it.
  void count_workspace(size_t bytes);
  void uncount_workspace(size_t bytes);

 private:
  int ordinal_ = 0;
  std::string name_;
  cudaStream_t stream_ = nullptr;
  std::unordered_map<void*, size_t> sizes_;
  size_t current_bytes_ = 0;
  size_t peak_bytes_ = 0;

  // Uploads go through a ring of pinned host memory; where each goes and
  // which copies it waits for is the ring's (kernels/staging_ring.h), each
  // copy marked by an event on the stream.
  unsigned char* ring_ = nullptr;
  std::unique_ptr<cuda::UploadEvents> upload_events_;
  std::unique_ptr<StagingRing> uploads_;  // after upload_events_, which it uses
  // The latest copy_to_host_async of each slot.
  std::vector<cudaEvent_t> copy_events_;
};

}  // namespace mpiformer
