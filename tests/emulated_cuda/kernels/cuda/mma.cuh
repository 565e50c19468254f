// Stands in for kernels/cuda/mma.cuh in flash_emulation_test: mma.sync
// m16n8k16 on bf16, emulated. The warp's lanes put their fragments in a
// buffer; each lane then rebuilds A and B from them by the layout of the
// PTX ISA ("Matrix Fragments for mma.m16n8k16", as kernels/cuda/mma.cuh
// describes it) and computes its own four results.
#pragma once

#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace emulated {
inline uint32_t fragments[32][32][6];  // [warp][lane]: a[0..3], b0, b1
}  // namespace emulated

namespace mpiformer::cuda {

template <typename T>
inline uint32_t pack2(float lo, float hi);
template <>
inline uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  return static_cast<uint32_t>(float_to_bf16(lo)) | static_cast<uint32_t>(float_to_bf16(hi)) << 16;
}
template <typename T>
inline uint32_t pack2(float2 v) {
  return pack2<T>(v.x, v.y);
}

// Element `half` (0: the low 16 bits) of a register of two bf16.
inline float unpack(uint32_t reg, int half) {
  return bf16_to_float(static_cast<uint16_t>(half ? reg >> 16 : reg & 0xffffu));
}

template <typename T>
inline void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  static_assert(sizeof(T) == 2, "bf16");
  const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  uint32_t* mine = emulated::fragments[warp][lane];
  for (int i = 0; i < 4; ++i) mine[i] = a[i];
  mine[4] = b0, mine[5] = b1;
  emulated::warp_barriers[warp]->arrive_and_wait();
  // A[row][k] is in lane (row % 8) * 4 + (k % 8) / 2, register (row >= 8) +
  // 2 (k >= 8); B[k][col] in lane col * 4 + (k % 8) / 2, register b0 or b1
  // by k >= 8; the half is k % 2.
  const auto A = [&](int row, int k) {
    const uint32_t* lane_of = emulated::fragments[warp][(row % 8) * 4 + (k % 8) / 2];
    return unpack(lane_of[(row >= 8) + 2 * (k >= 8)], k % 2);
  };
  const auto B = [&](int k, int col) {
    const uint32_t* lane_of = emulated::fragments[warp][col * 4 + (k % 8) / 2];
    return unpack(lane_of[4 + (k >= 8)], k % 2);
  };
  const int g = lane / 4, t = lane % 4;
  for (int i = 0; i < 4; ++i) {
    const int row = g + 8 * (i / 2), col = 2 * t + i % 2;
    float sum = 0.0f;
    for (int k = 0; k < 16; ++k) sum += A(row, k) * B(k, col);
    d[i] += sum;
  }
  emulated::warp_barriers[warp]->arrive_and_wait();
}

}  // namespace mpiformer::cuda
