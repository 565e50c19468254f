// AdamW's device code (launched by adamw.cu; run on the CPU by
// tests/adamw_emulation_test.cpp, where tests/emulated_cuda stands in for
// the CUDA built-ins). One block per range of the flat buffers; both
// kernels update an element with element(), so they give the same bits:
// ranged (MPIFORMER_KERNELS=adamw=ranged, the older path) reads one float
// of each buffer per thread and step of its loop; vector (the default)
// reads 16 bytes of each, four elements, keeping four times the bytes in
// flight.
#pragma once

#include <cmath>
#include <cstddef>

#include "kernels/cuda/common.cuh"
#include "kernels/ops.h"

namespace mpiformer::cuda::adamw {

struct Step {
  float lr, beta1, beta2, eps, inv_bias1, inv_bias2, inv_loss_scale, max_norm;
};

// What every gradient is multiplied by: the loss scale removed, and the
// clip taken from the norm on the device.  grad_norm_sq: (1)
__device__ __forceinline__ float grad_scale(const Step& s, const double* grad_norm_sq) {
  const double norm = sqrt(*grad_norm_sq) * s.inv_loss_scale;
  return clip_factor(norm, s.max_norm) * s.inv_loss_scale;
}

// One element: m and v updated in place; returns the new parameter.
__device__ __forceinline__ float element(float param, float grad, float& m, float& v, const Step& s,
                                         float weight_decay) {
  const float g = grad;
  const float m_i = s.beta1 * m + (1.0f - s.beta1) * g;
  const float v_i = s.beta2 * v + (1.0f - s.beta2) * g * g;
  m = m_i;
  v = v_i;
  const float m_hat = m_i * s.inv_bias1, v_hat = v_i * s.inv_bias2;
  return param - s.lr * (m_hat / (sqrtf(v_hat) + s.eps) + weight_decay * param);
}

// Element i of every buffer.  compute: null in fp32 runs.
template <typename T>
__device__ __forceinline__ void update(size_t i, float* params, const float* grads, float* m,
                                       float* v, T* compute, const Step& s, float scale,
                                       float weight_decay) {
  float m_i = m[i], v_i = v[i];
  const float p = element(params[i], grads[i] * scale, m_i, v_i, s, weight_decay);
  m[i] = m_i;
  v[i] = v_i;
  params[i] = p;
  if (compute) store(compute, i, p);
}

// The older path: a float of each buffer per thread and step.
// params, grads, m, v, compute: (n); ranges: (R), one per block
template <typename T>
__global__ void ranged_kernel(float* params, const float* grads, float* m, float* v, T* compute,
                              const AdamWRange* ranges, Step s, const double* grad_norm_sq) {
  const AdamWRange range = ranges[blockIdx.x];
  const float scale = grad_scale(s, grad_norm_sq);
  for (size_t i = range.begin + threadIdx.x; i < range.end; i += blockDim.x)
    update(i, params, grads, m, v, compute, s, scale, range.weight_decay);
}

// Where a range's whole float4s lie: [*body_begin, *body_end), multiples
// of 4; elements before and after go one at a time.
__host__ __device__ inline void vector_body(const AdamWRange& r, size_t* body_begin,
                                            size_t* body_end) {
  const size_t first = (r.begin + 3) / 4 * 4, last = r.end / 4 * 4;
  *body_begin = first < r.end ? first : r.end;
  *body_end = last > *body_begin ? last : *body_begin;
}

// The default: 16 bytes of params, grads, m and v per thread and step.
// The four buffers must be 16-byte aligned (adamw.cu checks), so element i
// of each is when i is a multiple of 4. Arguments as ranged_kernel.
template <typename T>
__global__ void vector_kernel(float* params, const float* grads, float* m, float* v, T* compute,
                              const AdamWRange* ranges, Step s, const double* grad_norm_sq) {
  const AdamWRange range = ranges[blockIdx.x];
  const float scale = grad_scale(s, grad_norm_sq);
  size_t body_begin = 0, body_end = 0;
  vector_body(range, &body_begin, &body_end);
  for (size_t i = range.begin + threadIdx.x; i < body_begin; i += blockDim.x)
    update(i, params, grads, m, v, compute, s, scale, range.weight_decay);
  for (size_t i = body_begin + 4 * size_t{threadIdx.x}; i < body_end; i += 4 * size_t{blockDim.x}) {
    float4 p4 = *reinterpret_cast<const float4*>(params + i);
    const float4 g4 = *reinterpret_cast<const float4*>(grads + i);
    float4 m4 = *reinterpret_cast<const float4*>(m + i);
    float4 v4 = *reinterpret_cast<const float4*>(v + i);
    p4.x = element(p4.x, g4.x * scale, m4.x, v4.x, s, range.weight_decay);
    p4.y = element(p4.y, g4.y * scale, m4.y, v4.y, s, range.weight_decay);
    p4.z = element(p4.z, g4.z * scale, m4.z, v4.z, s, range.weight_decay);
    p4.w = element(p4.w, g4.w * scale, m4.w, v4.w, s, range.weight_decay);
    *reinterpret_cast<float4*>(params + i) = p4;
    *reinterpret_cast<float4*>(m + i) = m4;
    *reinterpret_cast<float4*>(v + i) = v4;
    if (compute) {
      store(compute, i, p4.x);
      store(compute, i + 1, p4.y);
      store(compute, i + 2, p4.z);
      store(compute, i + 3, p4.w);
    }
  }
  for (size_t i = body_end + threadIdx.x; i < range.end; i += blockDim.x)
    update(i, params, grads, m, v, compute, s, scale, range.weight_decay);
}

}  // namespace mpiformer::cuda::adamw
