// The CUDA backend's elementwise ops: the compute copy of the weights,
// dropout, an activation made again from its pre-activation, and an
// activation's backward that follows no GEMM.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/dropout_mask.h"

namespace mpiformer {

namespace {

using cuda::blocks_for;
using cuda::load;
using cuda::store;
using cuda::typed;

// dst = src rounded to T.  dst, src: (n)
template <typename T>
__global__ void convert_kernel(T* dst, const float* src, size_t n) {
  MPIFORMER_FOR_EACH(i, n) store(dst, i, src[i]);
}

// out = x * keep / (1 - p), the mask of dropout_keep (the CPU backend's).
template <typename T>
__global__ void dropout_kernel(T* out, const T* x, size_t n, float p, uint64_t seed,
                               uint64_t stream) {
  const float keep_scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
  MPIFORMER_FOR_EACH(i, n) {
    store(out, i, dropout_keep(seed, stream, i, p) ? load(x, i) * keep_scale : 0.0f);
  }
}

// out = act(pre).  out, pre: (n)
template <typename T>
__global__ void activation_forward_kernel(T* out, const T* pre, size_t n, bool gelu) {
  MPIFORMER_FOR_EACH(i, n) {
    const float x = load(pre, i);
    store(out, i, gelu ? cuda::gelu(x) : fmaxf(x, 0.0f));
  }
}

// dx = act'(pre) * dout.  dx, dout, pre: (n)
template <typename T>
__global__ void activation_backward_kernel(T* dx, const T* dout, const T* pre, size_t n,
                                           bool gelu) {
  MPIFORMER_FOR_EACH(i, n) {
    const float x = load(pre, i);
    const float d = gelu ? cuda::gelu_grad(x) : (x > 0.0f ? 1.0f : 0.0f);
    store(dx, i, d * load(dout, i));
  }
}

}  // namespace

void CudaOps::convert(Act dst, const float* src, size_t n) {
  if (n == 0) return;
  cuda::dispatch(dst.dtype, [&](auto t) {
    using T = decltype(t);
    convert_kernel<<<blocks_for(n), 256, 0, stream_>>>(typed<T>(dst), src, n);
  });
  cuda::check(cudaGetLastError(), "convert");
}

// ---- elementwise ----------------------------------------------------------

void CudaOps::dropout(Act out, Act x, size_t n, const Dropout& d) {
  if (n == 0) return;
  if (!(d.p > 0.0f)) {
    if (out.data != x.data) {
      cuda::check(cudaMemcpyAsync(out.data, x.data, n * dtype_bytes(x.dtype),
                                  cudaMemcpyDeviceToDevice, stream_),
                  "dropout (copy)");
    }
    return;
  }
  cuda::dispatch(out.dtype, [&](auto t) {
    using T = decltype(t);
    dropout_kernel<<<blocks_for(n), 256, 0, stream_>>>(typed<T>(out), typed<T>(x), n, d.p, d.seed,
                                                       d.stream);
  });
  cuda::check(cudaGetLastError(), "dropout");
}

void CudaOps::activation_forward(Act out, Act pre, size_t n, Activation act) {
  if (n == 0) return;
  cuda::dispatch(out.dtype, [&](auto t) {
    using T = decltype(t);
    activation_forward_kernel<<<blocks_for(n), 256, 0, stream_>>>(typed<T>(out), typed<T>(pre), n,
                                                                  act == Activation::kGelu);
  });
  cuda::check(cudaGetLastError(), "activation_forward");
}

void CudaOps::activation_backward(Act dx, Act dout, Act pre, size_t n, Activation act) {
  if (n == 0) return;
  cuda::dispatch(dx.dtype, [&](auto t) {
    using T = decltype(t);
    activation_backward_kernel<<<blocks_for(n), 256, 0, stream_>>>(
        typed<T>(dx), typed<T>(dout), typed<T>(pre), n, act == Activation::kGelu);
  });
  cuda::check(cudaGetLastError(), "activation_backward");
}

}  // namespace mpiformer
