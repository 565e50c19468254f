// CudaDevice (kernels/cuda/device.h): the GPU's memory, the pinned upload
// ring, the copies to and from the host, and the op timer on CUDA events.
#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/cuda/device.h"

namespace mpiformer {

namespace cuda {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw std::runtime_error(std::string("CUDA error in ") + what + ": " +
                             cudaGetErrorString(status));
  }
}

// Events on the device's stream behind the upload ring's copies, reused
// once the ring is done with them.
class UploadEvents final : public StreamMarkers {
 public:
  explicit UploadEvents(cudaStream_t stream) : stream_(stream) {}
  ~UploadEvents() override {
    for (cudaEvent_t e : created_) cudaEventDestroy(e);
  }
  Marker record() override {
    if (spare_.empty()) {
      cudaEvent_t e = nullptr;
      check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
      created_.push_back(e);
      spare_.push_back(e);
    }
    cudaEvent_t e = spare_.back();
    spare_.pop_back();
    check(cudaEventRecord(e, stream_), "cudaEventRecord (upload)");
    return e;
  }
  bool completed(Marker marker) override {
    const cudaError_t status = cudaEventQuery(static_cast<cudaEvent_t>(marker));
    if (status == cudaErrorNotReady) return false;
    check(status, "upload");
    return true;
  }
  void wait(Marker marker) override {
    check(cudaEventSynchronize(static_cast<cudaEvent_t>(marker)), "cudaEventSynchronize (upload)");
  }
  void recycle(Marker marker) override { spare_.push_back(static_cast<cudaEvent_t>(marker)); }

 private:
  cudaStream_t stream_;
  std::vector<cudaEvent_t> created_, spare_;
};

}  // namespace cuda

namespace {

// Spans of ops timed by CUDA events on the stream: device time, which is
// what a queued, asynchronous step spends.
class EventTimer final : public OpTimer {
 public:
  explicit EventTimer(cudaStream_t stream) : stream_(stream) {}
  ~EventTimer() override {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
  }
  void begin() override {
    open_ = next_event();
    cuda::check(cudaEventRecord(open_, stream_), "cudaEventRecord");
  }
  void end() override {
    cudaEvent_t done = next_event();
    cuda::check(cudaEventRecord(done, stream_), "cudaEventRecord");
    spans_.push_back({open_, done});
  }
  std::vector<double> span_milliseconds() override {
    std::vector<double> ms;
    cuda::check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    for (const Span& s : spans_) {
      float elapsed = 0.0f;
      cuda::check(cudaEventElapsedTime(&elapsed, s.begin, s.end), "cudaEventElapsedTime");
      ms.push_back(elapsed);
    }
    return ms;
  }
  void reset() override {
    spans_.clear();
    used_ = 0;
  }

 private:
  struct Span {
    cudaEvent_t begin, end;
  };
  cudaEvent_t next_event() {
    if (used_ == events_.size()) {
      cudaEvent_t e;
      cuda::check(cudaEventCreate(&e), "cudaEventCreate");
      events_.push_back(e);
    }
    return events_[used_++];
  }
  cudaStream_t stream_;
  std::vector<cudaEvent_t> events_;
  size_t used_ = 0;
  cudaEvent_t open_ = nullptr;
  std::vector<Span> spans_;
};

}  // namespace

// ---- set-up ---------------------------------------------------------------

CudaDevice::CudaDevice(int ordinal) : ordinal_(ordinal) {
  cuda::check(cudaSetDevice(ordinal), "cudaSetDevice");
  cudaDeviceProp props{};
  cuda::check(cudaGetDeviceProperties(&props, ordinal), "cudaGetDeviceProperties");
  name_ = std::string("cuda:") + std::to_string(ordinal) + " (" + props.name + ")";
  cuda::check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  upload_events_ = std::make_unique<cuda::UploadEvents>(stream_);
  uploads_ = std::make_unique<StagingRing>(*upload_events_);
}

CudaDevice::~CudaDevice() {
  if (stream_) cudaStreamSynchronize(stream_);
  for (auto& [ptr, bytes] : sizes_) cudaFree(ptr);
  uploads_.reset();
  upload_events_.reset();
  for (cudaEvent_t e : copy_events_) cudaEventDestroy(e);
  if (ring_) cudaFreeHost(ring_);
  if (stream_) cudaStreamDestroy(stream_);
}

// ---- memory ---------------------------------------------------------------

void* CudaDevice::allocate(size_t bytes) {
  void* ptr = nullptr;
  if (bytes == 0) return nullptr;
  cuda::check(cudaMalloc(&ptr, bytes), "cudaMalloc");  // 256-byte aligned
  cuda::check(cudaMemsetAsync(ptr, 0, bytes, stream_), "cudaMemsetAsync");
  sizes_[ptr] = bytes;
  current_bytes_ += bytes;
  peak_bytes_ = std::max(peak_bytes_, current_bytes_);
  return ptr;
}

size_t CudaDevice::device_memory_free() const {
  size_t free_bytes = 0, total_bytes = 0;
  cuda::check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  return free_bytes;
}

void CudaDevice::release(void* ptr) {
  if (!ptr) return;
  const auto it = sizes_.find(ptr);
  if (it == sizes_.end()) throw std::runtime_error("CudaDevice::release: not this device's memory");
  cuda::check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");  // no kernel still uses it
  cuda::check(cudaFree(ptr), "cudaFree");
  current_bytes_ -= it->second;
  sizes_.erase(it);
}

void CudaDevice::count_workspace(size_t bytes) {
  current_bytes_ += bytes;
  peak_bytes_ = std::max(peak_bytes_, current_bytes_);
}

void CudaDevice::uncount_workspace(size_t bytes) {
  current_bytes_ -= bytes;
}

void CudaDevice::copy_to_device(void* dst, const void* host_src, size_t bytes) {
  if (bytes == 0) return;
  cuda::check(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream_),
              "cudaMemcpy to the device");
  // The host buffer may change as soon as this returns.
  cuda::check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
}

void CudaDevice::copy_to_host(void* host_dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  cuda::check(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream_),
              "cudaMemcpy to the host");
  cuda::check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
}

void* CudaDevice::allocate_host(size_t bytes) {
  if (bytes == 0) return nullptr;
  void* ptr = nullptr;
  cuda::check(cudaMallocHost(&ptr, bytes), "cudaMallocHost");
  return ptr;
}

void CudaDevice::release_host(void* ptr) {
  if (ptr) cudaFreeHost(ptr);
}

void CudaDevice::copy_to_host_async(int slot, void* host_dst, const void* src, size_t bytes) {
  while (static_cast<int>(copy_events_.size()) <= slot) {
    cudaEvent_t e = nullptr;
    cuda::check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    copy_events_.push_back(e);
  }
  if (bytes > 0) {
    cuda::check(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream_),
                "cudaMemcpyAsync to the host");
  }
  cuda::check(cudaEventRecord(copy_events_[slot], stream_), "cudaEventRecord");
}

bool CudaDevice::host_copy_done(int slot) {
  const cudaError_t status = cudaEventQuery(copy_events_.at(slot));
  if (status == cudaErrorNotReady) return false;
  cuda::check(status, "copy to the host");
  return true;
}

void CudaDevice::copy_to_device_async(void* dst, const void* host_src, size_t bytes) {
  if (bytes == 0) return;
  cuda::check(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream_),
              "cudaMemcpyAsync to the device");
}

void CudaDevice::reserve_uploads(size_t bytes) {
  if (bytes <= uploads_->size()) return;
  // Nothing staged may be lost: wait for every copy out of the old ring.
  cuda::check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  uploads_->reset(0);
  unsigned char* old = ring_;
  ring_ = nullptr;
  if (old) cuda::check(cudaFreeHost(old), "cudaFreeHost");
  cuda::check(cudaMallocHost(reinterpret_cast<void**>(&ring_), bytes), "cudaMallocHost (uploads)");
  uploads_->reset(bytes);
}

void CudaDevice::upload(void* dst, const void* host_src, size_t bytes) {
  if (bytes == 0) return;
  if (bytes > uploads_->size()) reserve_uploads(std::max(bytes, 2 * uploads_->size()));
  const size_t begin = uploads_->claim(bytes);  // waits for copies still reading there
  std::memcpy(ring_ + begin, host_src, bytes);
  cuda::check(cudaMemcpyAsync(dst, ring_ + begin, bytes, cudaMemcpyHostToDevice, stream_),
              "cudaMemcpyAsync (upload)");
  uploads_->queued();
}

void CudaDevice::fill_zero(void* x, size_t bytes) {
  if (bytes > 0) cuda::check(cudaMemsetAsync(x, 0, bytes, stream_), "cudaMemsetAsync");
}

void CudaDevice::synchronize() {
  cuda::check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
}

std::unique_ptr<OpTimer> CudaDevice::make_timer() {
  return std::make_unique<EventTimer>(stream_);
}

}  // namespace mpiformer
