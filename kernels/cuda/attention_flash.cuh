// The flash attention kernels (FlashAttention-2 on CUDA cores), device code
// only; the launchers are attention_flash.cu's. Tiles, masks and
// recurrences are kernels/attention_tiling.h's, shared with the CPU twin.
//
// A block of 16 row groups of kLanes threads works on (kTile, kTile) score
// tiles: thread (group, lane) holds rows group * 4 + r (r < 4) and columns
// lane + kLanes * c of a score tile, and the same rows of head columns
// lane * 4 + 4 kLanes * chunk + e (e < 4) of an output tile. The kLanes
// threads of a row are adjacent lanes of one warp, so row maxima and sums
// are warp shuffles. Operand tiles sit in shared memory in fp32 whatever
// the storage type (zero past a sequence's rows and past D), rows padded by
// 4 floats so that float4 reads of different rows fall in different banks.
// Everything is computed and accumulated in fp32 (no TF32).
#pragma once

#include <cstdint>

#include "kernels/attention_tiling.h"
#include "kernels/cuda/common.cuh"

namespace mpiformer::cuda::flash {

using tiling::kLog2e;
using tiling::kTile;

// Dynamic shared memory of every flash kernel (float4: 16-byte aligned).
extern __shared__ float4 flash_shared[];

// The batch as the kernels see it.
struct Shape {
  const int32_t* q_offsets;  // (B+1) query rows
  const int32_t* k_offsets;  // (B+1) key rows
  const int32_t* q_tiles;    // (B+1) first query tile of each sequence
  const int32_t* k_tiles;    // (B+1) first key tile of each sequence
  int batch, heads, head_dim, q_stride, kv_stride;
  bool causal;
  AttentionScale scale;
  float ref_len;
};

// An instantiation for head sizes up to kDmax (zero padded).
template <int kDmaxArg>
struct Geometry {
  static constexpr int kDmax = kDmaxArg;
  static constexpr int kLanes = kDmax >= 128 ? 16 : 8;  // threads sharing a row
  static constexpr int kThreads = 16 * kLanes;          // 16 row groups
  static constexpr int kRows = kTile / 16;              // rows per thread
  static constexpr int kCols = kTile / kLanes;          // score columns per thread
  static constexpr int kChunks = kDmax / (4 * kLanes);  // 4-column chunks of a head per thread
  static constexpr int kHeadCols = 4 * kChunks;
  static constexpr int kLd = kDmax + 4;   // row stride of a (kTile, kDmax) tile
  static constexpr int kPLd = kTile + 4;  // row stride of a (kTile, kTile) tile
  static constexpr int kTileFloats = kTile * kLd;
  static constexpr int kScoreFloats = kTile * kPLd;
  // A region that holds either (a key or value tile later reused for scores).
  static constexpr int kEitherFloats = kTileFloats > kScoreFloats ? kTileFloats : kScoreFloats;
  static_assert(kChunks >= 1 && kDmax % (4 * kLanes) == 0, "head size not tiled");
};

// Registers of one thread: (kRows, kCols) scores, (kRows, kHeadCols) outputs.
template <class G>
using Scores = float[G::kRows][G::kCols];
template <class G>
using Outputs = float[G::kRows][G::kHeadCols];

template <class G>
struct Thread {
  int group, lane;
  __device__ Thread() : group(threadIdx.x / G::kLanes), lane(threadIdx.x % G::kLanes) {}
  __device__ int row(int r) const { return group * G::kRows + r; }
  __device__ int col(int c) const { return lane + G::kLanes * c; }
  __device__ int head_col(int chunk) const { return lane * 4 + chunk * 4 * G::kLanes; }
};

// A block's tile: rows [start, start + kTile) of sequence b.
struct TileAt {
  int b, start;
  int lq, lk;        // the sequence's query and key lengths
  int q_row, k_row;  // its first query and key rows in the batch
};

// Tile `tile` of a batch whose sequence b has tiles [tiles[b], tiles[b+1]).
// tiles: (B+1)
__device__ inline TileAt tile_at(const Shape& s, const int32_t* tiles, int tile) {
  int lo = 0, hi = s.batch - 1;
  while (lo < hi) {  // the last sequence whose first tile is at or before `tile`
    const int mid = (lo + hi + 1) / 2;
    if (tiles[mid] <= tile)
      lo = mid;
    else
      hi = mid - 1;
  }
  TileAt t;
  t.b = lo;
  t.start = (tile - tiles[lo]) * kTile;
  t.q_row = s.q_offsets[lo];
  t.k_row = s.k_offsets[lo];
  t.lq = s.q_offsets[lo + 1] - t.q_row;
  t.lk = s.k_offsets[lo + 1] - t.k_row;
  return t;
}

__device__ __forceinline__ float component(const float4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// Four consecutive elements, widened; p aligned to 4 elements.
__device__ __forceinline__ void load4(const float* p, float* x) {
  const float4 v = *reinterpret_cast<const float4*>(p);
  x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
}
template <typename T>
__device__ __forceinline__ void load4(const T* p, float* x) {
  const uint2 raw = *reinterpret_cast<const uint2*>(p);
  const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) x[i] = load(e, i);
}
__device__ __forceinline__ void store4(float* p, const float* x) {
  *reinterpret_cast<float4*>(p) = make_float4(x[0], x[1], x[2], x[3]);
}
template <typename T>
__device__ __forceinline__ void store4(T* p, const float* x) {
  uint2 raw;
  T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) store(e, i, x[i]);
  *reinterpret_cast<uint2*>(p) = raw;
}

// Whether a (rows, D) slice at p, rows `stride` elements apart, moves in
// aligned groups of 4 elements.
template <typename T>
__device__ __forceinline__ bool moves_by_4(const T* p, int stride, int D) {
  return D % 4 == 0 && stride % 4 == 0 && reinterpret_cast<uintptr_t>(p) % (4 * sizeof(T)) == 0;
}

// Rows [0, rows) of a (rows, D) slice at src, rows `stride` elements apart,
// into a (kTile, kDmax) fp32 tile (row stride kLd), zero past them.
template <class G, typename T>
__device__ void load_tile(float* tile, const T* src, int stride, int rows, int D) {
  constexpr int kPerRow = G::kDmax / 4;
  const bool by4 = moves_by_4(src, stride, D);
  for (int at = threadIdx.x; at < kTile * kPerRow; at += G::kThreads) {
    const int r = at / kPerRow, c = at % kPerRow * 4;
    float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (r < rows && c < D) {
      const T* p = src + static_cast<size_t>(r) * stride + c;
      if (by4) {
        load4(p, x);
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) x[e] = c + e < D ? load(p, e) : 0.0f;
      }
    }
    store4(tile + r * G::kLd + c, x);
  }
}

// A thread's part of a (rows, D) slice at p (rows `stride` elements apart),
// rows < rows and columns < D only; reads 0 elsewhere (read) or leaves
// them (write).
template <class G, typename T>
__device__ void read_part(Outputs<G>& x, const T* p, int stride, int rows, int D,
                          const Thread<G>& t) {
  const bool by4 = moves_by_4(p, stride, D);
#pragma unroll
  for (int r = 0; r < G::kRows; ++r) {
#pragma unroll
    for (int chunk = 0; chunk < G::kChunks; ++chunk) {
      const int c = t.head_col(chunk);
      float* xs = &x[r][4 * chunk];
#pragma unroll
      for (int e = 0; e < 4; ++e) xs[e] = 0.0f;
      if (t.row(r) >= rows || c >= D) continue;
      const T* at = p + static_cast<size_t>(t.row(r)) * stride + c;
      if (by4) {
        load4(at, xs);
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) xs[e] = c + e < D ? load(at, e) : 0.0f;
      }
    }
  }
}
template <class G, typename T>
__device__ void write_part(T* p, int stride, const Outputs<G>& x, int rows, int D,
                           const Thread<G>& t) {
  const bool by4 = moves_by_4(p, stride, D);
#pragma unroll
  for (int r = 0; r < G::kRows; ++r) {
#pragma unroll
    for (int chunk = 0; chunk < G::kChunks; ++chunk) {
      const int c = t.head_col(chunk);
      if (t.row(r) >= rows || c >= D) continue;
      T* at = p + static_cast<size_t>(t.row(r)) * stride + c;
      if (by4) {
        store4(at, &x[r][4 * chunk]);
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if (c + e < D) store(at, e, x[r][4 * chunk + e]);
        }
      }
    }
  }
}

// s = A B^T, this thread's part: s[r][c] = sum_d A[row r][d] * B[col c][d]
// for (kTile, kDmax) tiles A and B in shared memory.
template <class G>
__device__ void tile_scores(Scores<G>& s, const float* A, const float* B, const Thread<G>& t) {
#pragma unroll
  for (int r = 0; r < G::kRows; ++r) {
#pragma unroll
    for (int c = 0; c < G::kCols; ++c) s[r][c] = 0.0f;
  }
#pragma unroll 2
  for (int d = 0; d < G::kDmax; d += 4) {
    float4 a[G::kRows];
#pragma unroll
    for (int r = 0; r < G::kRows; ++r)
      a[r] = *reinterpret_cast<const float4*>(A + t.row(r) * G::kLd + d);
#pragma unroll
    for (int c = 0; c < G::kCols; ++c) {
      const float4 b = *reinterpret_cast<const float4*>(B + t.col(c) * G::kLd + d);
#pragma unroll
      for (int r = 0; r < G::kRows; ++r) {
        s[r][c] = fmaf(a[r].x, b.x, s[r][c]);
        s[r][c] = fmaf(a[r].y, b.y, s[r][c]);
        s[r][c] = fmaf(a[r].z, b.z, s[r][c]);
        s[r][c] = fmaf(a[r].w, b.w, s[r][c]);
      }
    }
  }
}

// o += P V, this thread's part: o[r][4 chunk + e] += sum_j P[row r][j] *
// V[j][head_col(chunk) + e] for a (kTile, kTile) P (row stride kPLd) and a
// (kTile, kDmax) V in shared memory.
template <class G>
__device__ void tile_accumulate(Outputs<G>& o, const float* P, const float* V, const Thread<G>& t) {
#pragma unroll 1
  for (int j = 0; j < kTile; j += 4) {
    float4 p[G::kRows];
#pragma unroll
    for (int r = 0; r < G::kRows; ++r)
      p[r] = *reinterpret_cast<const float4*>(P + t.row(r) * G::kPLd + j);
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) {
#pragma unroll
      for (int chunk = 0; chunk < G::kChunks; ++chunk) {
        const float4 v =
            *reinterpret_cast<const float4*>(V + (j + jj) * G::kLd + t.head_col(chunk));
#pragma unroll
        for (int r = 0; r < G::kRows; ++r) {
          const float pr = component(p[r], jj);
          float* out = &o[r][4 * chunk];
          out[0] = fmaf(pr, v.x, out[0]);
          out[1] = fmaf(pr, v.y, out[1]);
          out[2] = fmaf(pr, v.z, out[2]);
          out[3] = fmaf(pr, v.w, out[3]);
        }
      }
    }
  }
}

// This thread's part of a (kTile, kTile) tile into shared memory (row
// stride kPLd).
template <class G>
__device__ void store_scores(float* tile, const Scores<G>& s, const Thread<G>& t) {
#pragma unroll
  for (int r = 0; r < G::kRows; ++r) {
#pragma unroll
    for (int c = 0; c < G::kCols; ++c) tile[t.row(r) * G::kPLd + t.col(c)] = s[r][c];
  }
}

// The max and sum of x over the kLanes threads of a row.
template <class G>
__device__ __forceinline__ float row_max(float x) {
#pragma unroll
  for (int lanes = G::kLanes / 2; lanes > 0; lanes /= 2)
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, lanes));
  return x;
}
template <class G>
__device__ __forceinline__ float row_sum(float x) {
#pragma unroll
  for (int lanes = G::kLanes / 2; lanes > 0; lanes /= 2)
    x += __shfl_xor_sync(0xffffffffu, x, lanes);
  return x;
}

template <class G>
__device__ void zero(Outputs<G>& o) {
#pragma unroll
  for (int r = 0; r < G::kRows; ++r) {
#pragma unroll
    for (int d = 0; d < G::kHeadCols; ++d) o[r][d] = 0.0f;
  }
}

}  // namespace mpiformer::cuda::flash
