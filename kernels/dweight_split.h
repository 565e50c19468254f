// The weight gradient's GEMM split along the tokens (kernels/cuda/matmul.cu,
// MPIFORMER_KERNELS=dweight=split), the parts that need no GPU: how many
// parts, and the order their sums are added in. Also checked on the CPU
// (tests/dweight_split_test.cpp), the adding kernel under emulation.
//
// dW (IC x OC) += x^T dout sums over N tokens, tens of thousands in a
// GPT-2 step, into few output tiles: 768 x 768 is 36 tiles of 128 x 128
// for 132 SMs, so one GEMM leaves most of the GPU idle. Split, `parts`
// GEMMs of `rows` tokens each run as one batch into fp32 partial sums,
// each part's bias gradient fused, which a kernel then adds, part 0
// first, into dW (and dbias). The split depends on the shape alone, never
// on the GPU or on timing: the same micro-batch gives the same bits on any
// rank and in any run.
#pragma once

#include <climits>
#include <cstddef>

#include "kernels/dropout_mask.h"  // MPIFORMER_HOST_DEVICE

namespace mpiformer::dweight_split {

// Output tiles to aim for (about four waves of an H100's 132 SMs), tokens
// a part keeps at the least, and the most parts.
constexpr int kTileEdge = 128;
constexpr long long kTargetTiles = 512;
constexpr int kMinRows = 2048;
constexpr int kMaxParts = 16;

// parts GEMMs of `rows` tokens each (tokens [p * rows, (p + 1) * rows) in
// part p); the last N - parts * rows tokens (fewer than parts) are added
// into part 0 after its own. parts == 1: no split, the GEMM as it was.
struct Split {
  int parts = 1;
  int rows = 0;
};

// The split for N tokens into an IC x OC gradient whose dout rows are
// `ld` elements apart: parts doubles while the tiles fall short of the
// target and each part keeps kMinRows tokens; no split where a part's
// offset or dW's size would not fit an int (the GEMM's batch strides).
inline Split split_for(int N, int IC, int OC, int ld) {
  const long long tiles =
      static_cast<long long>((IC + kTileEdge - 1) / kTileEdge) * ((OC + kTileEdge - 1) / kTileEdge);
  Split s{1, N};
  while (s.parts < kMaxParts && tiles * s.parts < kTargetTiles && N / (2 * s.parts) >= kMinRows)
    s.parts *= 2;
  s.rows = N / s.parts;
  const long long widest = IC > ld ? IC : ld;
  const bool fits = static_cast<long long>(s.rows) * widest <= INT_MAX &&
                    static_cast<long long>(IC) * OC <= INT_MAX;
  if (s.parts > 1 && !fits) s = Split{1, N};
  return s;
}

// Floats from one part's bias gradient to the next: OC rounded up to 64,
// so that each part's starts 256 bytes after the last, as aligned as the
// first (cuBLASLt checks the alignment of the bias pointer it is given,
// not of the batch stride added to it).
inline size_t bias_stride(int OC) {
  return (static_cast<size_t>(OC) + 63) / 64 * 64;
}

// Element i of dW after the parts: dW[i] + (((p_0 + p_1) + p_2) + ...),
// the parts `stride` elements apart.
MPIFORMER_HOST_DEVICE inline float add_parts(float dw, const float* partial, size_t stride,
                                             int parts, size_t i) {
  float sum = partial[i];
  for (int p = 1; p < parts; ++p) sum += partial[static_cast<size_t>(p) * stride + i];
  return dw + sum;
}

}  // namespace mpiformer::dweight_split
