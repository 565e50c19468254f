// The warp-per-row layer norm's layout (kernels/cuda/layernorm_warp.cu,
// the forward's default, layernorm=warp), also checked on the CPU
// (tests/layernorm_emulation_test.cpp): which columns each lane holds in
// registers, which rows each warp takes, and the order of its sums.
//
// A row of C elements is C / vec vectors of 16 bytes (vec: 8 bf16 or fp16,
// 4 fp32). Lane l holds vectors l, l + 32, l + 64, ...: one warp-wide load
// reads 512 contiguous bytes. A lane's sums run over its vectors in order,
// then the warp's lanes are added in a butterfly (xor 16, 8, 4, 2, 1), so
// every lane ends with the same total and the order never depends on timing.
#pragma once

#include "kernels/dropout_mask.h"  // MPIFORMER_HOST_DEVICE

namespace mpiformer::layernorm_rows {

constexpr int kLanes = 32;
// Floats one row array may take per lane (the forward holds the row and
// reads gamma and beta; the backward holds x, dout and gamma as stored and
// the next row's x and dout), so C <= 1024 in every type.
constexpr int kLargestLaneFloats = 32;
// Warps per block; in the backward each takes this many rows of its block.
constexpr int kWarps = 8;
constexpr int kBackwardRowsPerWarp = 4;
constexpr int kBackwardRowsPerBlock = kWarps * kBackwardRowsPerWarp;

MPIFORMER_HOST_DEVICE constexpr int row_vectors(int C, int vec) {
  return C / vec;
}
// The most vectors a lane holds (the last lanes may hold one fewer).
MPIFORMER_HOST_DEVICE constexpr int vectors_per_lane(int C, int vec) {
  return (row_vectors(C, vec) + kLanes - 1) / kLanes;
}
// The vector index of lane `lane`'s i-th vector (valid below row_vectors).
MPIFORMER_HOST_DEVICE constexpr int vector_of(int lane, int i) {
  return lane + kLanes * i;
}
// Whether rows of C elements fit the warp kernel: whole vectors, held in
// registers. (The caller also checks that every row starts 16-byte aligned.)
MPIFORMER_HOST_DEVICE constexpr bool fits(int C, int vec) {
  return C > 0 && C % vec == 0 && vectors_per_lane(C, vec) * vec <= kLargestLaneFloats;
}
// The kernel instance that holds a row: register slots for 1, 2, 3, 4, 6
// or 8 vectors per lane, the fewest that hold vectors_per_lane.
MPIFORMER_HOST_DEVICE constexpr int lane_slots(int C, int vec) {
  const int n = vectors_per_lane(C, vec);
  return n <= 4 ? n : n <= 6 ? 6 : 8;
}

// The rows of backward block `block` that warp `warp` takes: first, first +
// kWarps, ... below end.
MPIFORMER_HOST_DEVICE constexpr int backward_first_row(int block, int warp) {
  return block * kBackwardRowsPerBlock + warp;
}
MPIFORMER_HOST_DEVICE constexpr int backward_blocks(int N) {
  return (N + kBackwardRowsPerBlock - 1) / kBackwardRowsPerBlock;
}

// The column sums a layer norm backward adds to (+=): dgamma and dbeta,
// and, where not null, dx_sums, the sums of dx as it came in (accumulate
// only: Ops::layernorm_backward's dx_sums). A block's partials are
// count() rows of C: dgamma's, dbeta's, then dx_sums'.  each: (C)
struct Sums {
  float* dgamma = nullptr;
  float* dbeta = nullptr;
  float* dx_sums = nullptr;
  MPIFORMER_HOST_DEVICE constexpr int count() const { return dx_sums ? 3 : 2; }
  // Where column sum j (0 <= j < count() C) goes.
  MPIFORMER_HOST_DEVICE float* target(int j, int C) const {
    return j < C ? dgamma + j : j < 2 * C ? dbeta + (j - C) : dx_sums + (j - 2 * C);
  }
};

}  // namespace mpiformer::layernorm_rows
