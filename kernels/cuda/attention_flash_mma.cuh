// The flash kernels on tensor cores, for bf16 and fp16 and heads up to 64:
// the tiles, loops and recurrences of attention_flash_kernels.cuh, with the
// products on mma.sync m16n8k16 (mma.cuh) in the storage type, accumulated
// in fp32. Operand tiles stay fp32 in shared memory (load_tile), rounded
// back to T as fragments are built: exact for q, k, v and dO, which are T
// already; P and dS are rounded to T for their products with V, K, Q and
// dO, as cuDNN does.
//
// Warp w of a block's 4 holds rows 16w .. 16w+15 of the 64-row tile (query
// rows, or key rows in the dK/dV pass). Its scores against 64 columns are
// 8 mma tiles of (16, 8) accumulators, so lane (g, t) holds rows 16w+g and
// 16w+g+8, columns 8n + 2t and 8n + 2t + 1 of tile n (Lane::row, col); the
// 4 lanes of a row reduce with two shuffles, and the accumulators are the
// A operand of the next product as they are (a_of_accumulators). Tile
// rows past a sequence are zero, as in the CUDA-core kernels.
#pragma once

#include "kernels/cuda/attention_flash_kernels.cuh"
#include "kernels/cuda/mma.cuh"

namespace mpiformer::cuda::flash {

// An instantiation for heads up to kDmax (32 or 64): 4 warps, tiles in
// shared memory as load_tile writes them, rows kLd floats apart. kLd = 12
// mod 32 puts b_of_columns' reads (rows 2t apart, column g) in distinct
// banks, and costs b_of_rows' float2 reads (rows g apart) at most a 2-way
// conflict per half warp.
template <int kDmaxArg>
struct MmaGeometry {
  static constexpr int kDmax = kDmaxArg;
  static constexpr int kThreads = 128;
  static constexpr int kLd = kDmax + 12;
  static constexpr int kTileFloats = kTile * kLd;
  static constexpr int kSteps = kDmax / 16;     // k-steps over a head
  static constexpr int kHeadTiles = kDmax / 8;  // n-tiles over a head
  static_assert(kDmax % 16 == 0 && kLd % 32 == 12 && kTile == 64, "mma tiles");
};

// Shared memory of the mma kernels, in floats.
template <class G>
struct MmaSharedFloats {
  static constexpr int kForward = 3 * G::kTileFloats;              // q, k, v
  static constexpr int kQueryGrad = 4 * G::kTileFloats;            // q, dO, k, v
  static constexpr int kKeyGrad = 4 * G::kTileFloats + 4 * kTile;  // k, v, q, dO; columns
};

// Scores of a warp's 16 rows against 64 columns: 8 mma accumulator tiles.
using MmaScores = float[8][4];

struct Lane {
  int warp, g, t;
  __device__ Lane() : warp(threadIdx.x / 32), g(threadIdx.x % 32 / 4), t(threadIdx.x % 4) {}
  // Tile row of accumulators [2h, 2h+2): h = 0 row g, h = 1 row g + 8.
  __device__ int row(int h) const { return 16 * warp + g + 8 * h; }
  // Column of accumulator e of n-tile n.
  __device__ int col(int n, int e) const { return 8 * n + 2 * t + (e & 1); }
};

// Two adjacent floats of a tile in one 8-byte read (p is 8-byte aligned:
// rows an even number of floats apart, even columns).
__device__ __forceinline__ float2 pair(const float* p) {
  return *reinterpret_cast<const float2*>(p);
}

// Rows 16 warp .. +15, columns k0 .. k0+15 of a fp32 tile (row stride ld)
// as an A fragment.
template <typename T, int ld>
__device__ __forceinline__ void a_fragment(uint32_t (&a)[4], const float* tile, int k0,
                                           const Lane& l) {
  const float* p = tile + (16 * l.warp + l.g) * ld + k0 + 2 * l.t;
  a[0] = pack2<T>(pair(p));
  a[1] = pack2<T>(pair(p + 8 * ld));
  a[2] = pack2<T>(pair(p + 8));
  a[3] = pack2<T>(pair(p + 8 * ld + 8));
}

// B fragments of a fp32 tile x (row stride ld): b_of_rows, B = x^T
// (B[k][n] = x[n0 + n][k0 + k]); b_of_columns, B = x (B[k][n] =
// x[k0 + k][n0 + n]).
template <typename T, int ld>
__device__ __forceinline__ void b_of_rows(uint32_t& b0, uint32_t& b1, const float* x, int n0,
                                          int k0, const Lane& l) {
  const float* p = x + (n0 + l.g) * ld + k0 + 2 * l.t;
  b0 = pack2<T>(pair(p));
  b1 = pack2<T>(pair(p + 8));
}
template <typename T, int ld>
__device__ __forceinline__ void b_of_columns(uint32_t& b0, uint32_t& b1, const float* x, int k0,
                                             int n0, const Lane& l) {
  const float* p = x + (k0 + 2 * l.t) * ld + n0 + l.g;
  b0 = pack2<T>(p[0], p[ld]);
  b1 = pack2<T>(p[8 * ld], p[9 * ld]);
}

// Columns 16 kk .. +15 of a warp's scores as an A fragment.
template <typename T>
__device__ __forceinline__ void a_of_accumulators(uint32_t (&a)[4], const MmaScores& c, int kk) {
  a[0] = pack2<T>(c[2 * kk][0], c[2 * kk][1]);
  a[1] = pack2<T>(c[2 * kk][2], c[2 * kk][3]);
  a[2] = pack2<T>(c[2 * kk + 1][0], c[2 * kk + 1][1]);
  a[3] = pack2<T>(c[2 * kk + 1][2], c[2 * kk + 1][3]);
}

// s = A x^T: a warp's 16 rows (A fragments over the head) against the 64
// rows of x, a (kTile, kDmax) tile.
template <typename T, class G>
__device__ void mma_scores(MmaScores& s, const uint32_t (&a)[G::kSteps][4], const float* x,
                           const Lane& l) {
#pragma unroll
  for (int n = 0; n < 8; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) s[n][e] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < G::kSteps; ++ks) {
      uint32_t b0, b1;
      b_of_rows<T, G::kLd>(b0, b1, x, 8 * n, 16 * ks, l);
      mma_16816<T>(s[n], a[ks], b0, b1);
    }
  }
}

// o += p x: a warp's 16 rows of p (over 64 columns) times the 64 rows of x.
template <typename T, class G>
__device__ void mma_accumulate(float (&o)[G::kHeadTiles][4], const MmaScores& p, const float* x,
                               const Lane& l) {
#pragma unroll
  for (int kk = 0; kk < kTile / 16; ++kk) {
    uint32_t a[4];
    a_of_accumulators<T>(a, p, kk);
#pragma unroll
    for (int n = 0; n < G::kHeadTiles; ++n) {
      uint32_t b0, b1;
      b_of_columns<T, G::kLd>(b0, b1, x, 16 * kk, 8 * n, l);
      mma_16816<T>(o[n], a, b0, b1);
    }
  }
}

// The max and sum of x over the 4 lanes of a row.
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// A lane's elements of a warp's (16, kDmax) accumulators into rows `stride`
// elements apart, rows < rows and columns < D only.
template <class G, typename T>
__device__ void mma_write(T* p, int stride, const float (&o)[G::kHeadTiles][4], int rows, int D,
                          const Lane& l) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (l.row(h) >= rows) continue;
#pragma unroll
    for (int n = 0; n < G::kHeadTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int c = l.col(n, e);
        if (c < D) store(p, static_cast<size_t>(l.row(h)) * stride + c, o[n][2 * h + e]);
      }
    }
  }
}

}  // namespace mpiformer::cuda::flash
