// GEMMs through cuBLAS (fp32, no TF32). Row-major (N, C) tensors are
// column-major (C, N) to cuBLAS, so out = x W^T becomes out^T = W x^T.
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/reduce.cuh"

namespace mpiformer {

namespace {

// out[r, c] += bias[c].  out: (N, OC), bias: (OC)
__global__ void add_bias_kernel(float* out, const float* bias, int N, int OC) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < static_cast<size_t>(N) * OC;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    out[i] += bias[i % OC];
}

// dbias[c] += sum over rows of dout[r, c]; one block per column.  dout: (N, OC)
__global__ void bias_grad_kernel(float* dbias, const float* dout, int N, int OC) {
  __shared__ float shared[32];
  const int c = blockIdx.x;
  float sum = 0.0f;
  for (int r = threadIdx.x; r < N; r += blockDim.x) sum += dout[static_cast<size_t>(r) * OC + c];
  sum = cuda::block_sum(sum, shared);
  if (threadIdx.x == 0) dbias[c] += sum;
}

}  // namespace

void CudaOps::matmul_forward(float* out, const float* x, const float* weight, const float* bias,
                             int N, int IC, int OC) {
  if (N == 0) return;
  const float one = 1.0f, zero = 0.0f;
  // out^T (OC, N) = W (OC, IC) x^T (IC, N); W is (IC, OC) column-major: transpose it.
  cuda::check(cublasSgemm(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, IC, &one, weight, IC, x, IC,
                          &zero, out, OC),
              "matmul_forward");
  if (bias) {
    add_bias_kernel<<<cuda::blocks_for(static_cast<size_t>(N) * OC), 256, 0, stream_>>>(out, bias, N, OC);
    cuda::check(cudaGetLastError(), "matmul_forward (bias)");
  }
}

void CudaOps::matmul_backward(float* dx, float* dweight, float* dbias, const float* dout,
                              const float* x, const float* weight, int N, int IC, int OC,
                              bool accumulate) {
  if (N == 0) return;
  const float one = 1.0f, zero = 0.0f;
  if (dx) {
    // dx^T (IC, N) = W^T (IC, OC) dout^T (OC, N)
    cuda::check(cublasSgemm(cublas_, CUBLAS_OP_N, CUBLAS_OP_N, IC, N, OC, &one, weight, IC, dout,
                            OC, accumulate ? &one : &zero, dx, IC),
                "matmul_backward (dx)");
  }
  // dW^T (IC, OC) += x^T (IC, N) dout (N, OC)
  cuda::check(cublasSgemm(cublas_, CUBLAS_OP_N, CUBLAS_OP_T, IC, OC, N, &one, x, IC, dout, OC, &one,
                          dweight, IC),
              "matmul_backward (dweight)");
  if (dbias) {
    bias_grad_kernel<<<OC, 256, 0, stream_>>>(dbias, dout, N, OC);
    cuda::check(cudaGetLastError(), "matmul_backward (dbias)");
  }
}

}  // namespace mpiformer
