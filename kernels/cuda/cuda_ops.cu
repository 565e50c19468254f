// The CUDA backend's memory, elementwise ops and embeddings.
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/dropout_mask.h"

namespace mpiformer {

namespace cuda {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw std::runtime_error(std::string("CUDA error in ") + what + ": " +
                             cudaGetErrorString(status));
  }
}

void check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw std::runtime_error(std::string("cuBLAS error in ") + what + ": status " +
                             std::to_string(static_cast<int>(status)));
  }
}

}  // namespace cuda

namespace {

using cuda::blocks_for;

// GELU, tanh approximation as in GPT-2 (the CPU backend's formula).
constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;

// Grid-stride loops: any n with a bounded grid.
#define FOR_EACH(i, n) \
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < (n); i += static_cast<size_t>(gridDim.x) * blockDim.x)

__global__ void add_kernel(float* out, const float* a, const float* b, size_t n) {
  FOR_EACH(i, n) out[i] = a[i] + b[i];
}

__global__ void activation_forward_kernel(float* out, const float* x, size_t n, bool gelu) {
  FOR_EACH(i, n) {
    const float xi = x[i];
    out[i] = gelu ? 0.5f * xi * (1.0f + tanhf(kGeluC * (xi + kGeluA * xi * xi * xi)))
                  : fmaxf(xi, 0.0f);
  }
}

// d/dx 0.5 x (1 + tanh u), u = c (x + a x^3).
__global__ void activation_backward_kernel(float* dx, const float* dout, const float* x, size_t n,
                                           bool gelu) {
  FOR_EACH(i, n) {
    const float xi = x[i];
    float d;
    if (gelu) {
      const float t = tanhf(kGeluC * (xi + kGeluA * xi * xi * xi));
      d = 0.5f * (1.0f + t) + 0.5f * xi * (1.0f - t * t) * kGeluC * (1.0f + 3.0f * kGeluA * xi * xi);
    } else {
      d = xi > 0.0f ? 1.0f : 0.0f;
    }
    dx[i] = d * dout[i];
  }
}

// out = x * keep / (1 - p), the mask of dropout_keep (the CPU backend's).
__global__ void dropout_kernel(float* out, const float* x, size_t n, float p, uint64_t seed,
                               uint64_t stream) {
  const float keep_scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
  FOR_EACH(i, n) out[i] = dropout_keep(seed, stream, i, p) ? x[i] * keep_scale : 0.0f;
}

// out: (N, C), ids: (N), table: (V, C)
__global__ void gather_rows_kernel(float* out, const int32_t* ids, const float* table, int N, int C,
                                   float scale, bool add) {
  FOR_EACH(i, static_cast<size_t>(N) * C) {
    const size_t row = i / C, col = i % C;
    const float value = table[static_cast<size_t>(ids[row]) * C + col] * scale;
    out[i] = add ? out[i] + value : value;
  }
}

// dtable[ids[r]] += dout[r] * scale.  dtable: (V, C), dout: (N, C)
__global__ void scatter_add_rows_kernel(float* dtable, const float* dout, const int32_t* ids, int N,
                                        int C, float scale) {
  FOR_EACH(i, static_cast<size_t>(N) * C) {
    const size_t row = i / C, col = i % C;
    atomicAdd(dtable + static_cast<size_t>(ids[row]) * C + col, dout[i] * scale);
  }
}

}  // namespace

CudaOps::CudaOps(int device) : device_(device) {
  cuda::check(cudaSetDevice(device), "cudaSetDevice");
  cudaDeviceProp props{};
  cuda::check(cudaGetDeviceProperties(&props, device), "cudaGetDeviceProperties");
  name_ = std::string("cuda:") + std::to_string(device) + " (" + props.name + ")";
  cuda::check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  cuda::check(cublasCreate(&cublas_), "cublasCreate");
  cuda::check(cublasSetStream(cublas_, stream_), "cublasSetStream");
  // fp32 means fp32: no TF32 behind the caller's back.
  cuda::check(cublasSetMathMode(cublas_, CUBLAS_PEDANTIC_MATH), "cublasSetMathMode");
}

CudaOps::~CudaOps() {
  if (stream_) cudaStreamSynchronize(stream_);
  for (void* p : scratch_)
    if (p) cudaFree(p);
  for (auto& [ptr, bytes] : sizes_) cudaFree(ptr);
  if (cublas_) cublasDestroy(cublas_);
  if (stream_) cudaStreamDestroy(stream_);
}

void* CudaOps::allocate(size_t bytes) {
  void* ptr = nullptr;
  if (bytes == 0) return nullptr;
  cuda::check(cudaMalloc(&ptr, bytes), "cudaMalloc");  // 256-byte aligned
  cuda::check(cudaMemsetAsync(ptr, 0, bytes, stream_), "cudaMemsetAsync");
  sizes_[ptr] = bytes;
  current_bytes_ += bytes;
  peak_bytes_ = std::max(peak_bytes_, current_bytes_);
  return ptr;
}

void CudaOps::release(void* ptr) {
  if (!ptr) return;
  const auto it = sizes_.find(ptr);
  if (it == sizes_.end()) throw std::runtime_error("CudaOps::release: not this backend's memory");
  cuda::check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");  // no kernel still uses it
  cuda::check(cudaFree(ptr), "cudaFree");
  current_bytes_ -= it->second;
  sizes_.erase(it);
}

void CudaOps::copy_to_device(void* dst, const void* host_src, size_t bytes) {
  if (bytes == 0) return;
  cuda::check(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream_),
              "cudaMemcpy to the device");
  // The host buffer may change as soon as this returns.
  cuda::check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
}

void CudaOps::copy_to_host(void* host_dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  cuda::check(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream_),
              "cudaMemcpy to the host");
  cuda::check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
}

void CudaOps::fill_zero(float* x, size_t n) {
  if (n > 0) cuda::check(cudaMemsetAsync(x, 0, n * sizeof(float), stream_), "cudaMemsetAsync");
}

void CudaOps::synchronize() {
  cuda::check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
}

void* CudaOps::scratch(int slot, size_t bytes) {
  if (scratch_bytes_[slot] < bytes) {
    if (scratch_[slot]) {
      cuda::check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
      cuda::check(cudaFree(scratch_[slot]), "cudaFree");
    }
    scratch_[slot] = nullptr;
    cuda::check(cudaMalloc(&scratch_[slot], bytes), "cudaMalloc (scratch)");
    scratch_bytes_[slot] = bytes;
  }
  return scratch_[slot];
}

void CudaOps::add(float* out, const float* a, const float* b, size_t n) {
  if (n == 0) return;
  add_kernel<<<blocks_for(n), 256, 0, stream_>>>(out, a, b, n);
  cuda::check(cudaGetLastError(), "add");
}

void CudaOps::activation_forward(float* out, const float* x, size_t n, Activation act) {
  if (n == 0) return;
  activation_forward_kernel<<<blocks_for(n), 256, 0, stream_>>>(out, x, n, act == Activation::kGelu);
  cuda::check(cudaGetLastError(), "activation_forward");
}

void CudaOps::activation_backward(float* dx, const float* dout, const float* x, size_t n,
                                  Activation act) {
  if (n == 0) return;
  activation_backward_kernel<<<blocks_for(n), 256, 0, stream_>>>(dx, dout, x, n,
                                                                  act == Activation::kGelu);
  cuda::check(cudaGetLastError(), "activation_backward");
}

void CudaOps::dropout_forward(float* out, const float* x, size_t n, float p, uint64_t seed,
                              uint64_t stream) {
  if (n == 0) return;
  if (!(p > 0.0f)) {
    if (out != x) {
      cuda::check(cudaMemcpyAsync(out, x, n * sizeof(float), cudaMemcpyDeviceToDevice, stream_),
                  "dropout (copy)");
    }
    return;
  }
  dropout_kernel<<<blocks_for(n), 256, 0, stream_>>>(out, x, n, p, seed, stream);
  cuda::check(cudaGetLastError(), "dropout");
}

void CudaOps::dropout_backward(float* dx, const float* dout, size_t n, float p, uint64_t seed,
                               uint64_t stream) {
  // The same mask and scale: d(x * keep / (1 - p)) = dout * keep / (1 - p).
  dropout_forward(dx, dout, n, p, seed, stream);
}

void CudaOps::embedding_forward(float* out, const int32_t* ids, const float* table, int N, int C,
                                float scale) {
  if (N == 0) return;
  gather_rows_kernel<<<blocks_for(static_cast<size_t>(N) * C), 256, 0, stream_>>>(out, ids, table, N, C, scale,
                                                                     false);
  cuda::check(cudaGetLastError(), "embedding_forward");
}

void CudaOps::embedding_backward(float* dtable, const float* dout, const int32_t* ids, int N, int C,
                                 float scale) {
  if (N == 0) return;
  scatter_add_rows_kernel<<<blocks_for(static_cast<size_t>(N) * C), 256, 0, stream_>>>(dtable, dout, ids, N, C,
                                                                          scale);
  cuda::check(cudaGetLastError(), "embedding_backward");
}

void CudaOps::positional_add_forward(float* x, const int32_t* positions, const float* table, int N,
                                     int C) {
  if (N == 0) return;
  gather_rows_kernel<<<blocks_for(static_cast<size_t>(N) * C), 256, 0, stream_>>>(x, positions, table, N, C,
                                                                     1.0f, true);
  cuda::check(cudaGetLastError(), "positional_add_forward");
}

void CudaOps::positional_add_backward(float* dtable, const float* dx, const int32_t* positions,
                                      int N, int C) {
  if (N == 0) return;
  scatter_add_rows_kernel<<<blocks_for(static_cast<size_t>(N) * C), 256, 0, stream_>>>(dtable, dx, positions,
                                                                          N, C, 1.0f);
  cuda::check(cudaGetLastError(), "positional_add_backward");
}

}  // namespace mpiformer
