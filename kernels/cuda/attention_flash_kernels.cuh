// The flash attention kernels: forward, the dQ pass (which also writes
// delta = rowsum(dO * O)) and the dK/dV pass, on attention_flash.cuh's
// tiles; and the scan that numbers a batch's tiles. No float atomics: each
// output element is written by one thread of one block.
#pragma once

#include "kernels/cuda/attention_flash.cuh"

namespace mpiformer::cuda::flash {

// Shared memory of each kernel, in floats.
template <class G>
struct SharedFloats {
  // q; k, then P; v
  static constexpr int kForward = 2 * G::kTileFloats + G::kEitherFloats;
  // q, dO, k; v, then dS
  static constexpr int kQueryGrad = 3 * G::kTileFloats + G::kEitherFloats;
  // k, v, q, dO; P, dS; per query column: scale, scale2, lse2, delta
  static constexpr int kKeyGrad = 4 * G::kTileFloats + 2 * G::kScoreFloats + 4 * kTile;
};

// What a query tile's rows need: their scale (natural and base 2) and, in
// the backward, the forward's log-sum-exp (base 2) and delta.
template <class G>
struct QueryRows {
  float scale[G::kRows], scale2[G::kRows], lse2[G::kRows], delta[G::kRows];
};

template <class G>
__device__ void row_scales(QueryRows<G>& rows, const Shape& s, const TileAt& at,
                           const Thread<G>& t) {
#pragma unroll
  for (int r = 0; r < G::kRows; ++r) {
    rows.scale[r] =
        tiling::query_scale(s.scale, s.head_dim, s.ref_len, s.causal, at.start + t.row(r), at.lk);
    rows.scale2[r] = rows.scale[r] * kLog2e;
  }
}

// A query tile's scores against the key tile at k0, in base 2; -inf where
// the query does not see the key.
template <class G>
__device__ void scale_and_mask(Scores<G>& sc, const QueryRows<G>& rows, const Shape& s,
                               const TileAt& at, int k0, const Thread<G>& t) {
#pragma unroll
  for (int r = 0; r < G::kRows; ++r) {
#pragma unroll
    for (int c = 0; c < G::kCols; ++c) {
      const bool seen = tiling::sees(at.start + t.row(r), k0 + t.col(c), at.lq, at.lk, s.causal);
      sc[r][c] = seen ? sc[r][c] * rows.scale2[r] : -INFINITY;
    }
  }
}

// The online softmax over one key tile: the running max m of each row
// moves to the tile's, l (this thread's part of the running sum) and o
// are rescaled to it, and the scores become exp2(score - m).
template <class G>
__device__ void online_softmax(Scores<G>& sc, float (&m)[G::kRows], float (&l)[G::kRows],
                               Outputs<G>& o) {
#pragma unroll
  for (int r = 0; r < G::kRows; ++r) {
    float top = m[r];
#pragma unroll
    for (int c = 0; c < G::kCols; ++c) top = fmaxf(top, sc[r][c]);
    top = row_max<G>(top);
    const float ref = tiling::softmax_reference(top);
    const float correction = exp2f(m[r] - ref);
    float sum = 0.0f;
#pragma unroll
    for (int c = 0; c < G::kCols; ++c) {
      sc[r][c] = exp2f(sc[r][c] - ref);
      sum += sc[r][c];
    }
    l[r] = l[r] * correction + sum;
#pragma unroll
    for (int d = 0; d < G::kHeadCols; ++d) o[r][d] *= correction;
    m[r] = top;
  }
}

// out = o / l and stats = the log-sum-exp of each row of a query tile.
// out: (Nq, H*D) dense, stats: (Nq, H)
template <class G, typename T>
__device__ void finish_forward(T* out, float* stats, Outputs<G>& o, const float (&m)[G::kRows],
                               const float (&l)[G::kRows], const Shape& s, const TileAt& at,
                               const Thread<G>& t) {
  const int h = blockIdx.y, D = s.head_dim, rows = tiling::rows_of_tile(at.start, at.lq);
  const size_t row0 = static_cast<size_t>(at.q_row) + at.start;
#pragma unroll
  for (int r = 0; r < G::kRows; ++r) {
    const float sum = row_sum<G>(l[r]);
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;  // a row that sees nothing gets 0
#pragma unroll
    for (int d = 0; d < G::kHeadCols; ++d) o[r][d] *= inv;
    if (t.lane == 0 && t.row(r) < rows)
      stats[(row0 + t.row(r)) * s.heads + h] = tiling::row_stats(m[r], sum);
  }
  write_part<G>(out + row0 * s.heads * D + h * D, s.heads * D, o, rows, D, t);
}

// grid (query tiles, H), SharedFloats::kForward floats of shared memory.
// out: (Nq, H*D) dense, stats: (Nq, H); q: (Nq, .) rows q_stride apart;
// k, v: (Nk, .) rows kv_stride apart
template <typename T, int kDmax>
__global__ void __launch_bounds__(Geometry<kDmax>::kThreads, 1)
    forward_kernel(Shape s, T* out, float* stats, const T* q, const T* k, const T* v) {
  using G = Geometry<kDmax>;
  float* q_tile = reinterpret_cast<float*>(flash_shared);
  float* k_tile = q_tile + G::kTileFloats;  // then P
  float* v_tile = k_tile + G::kEitherFloats;
  const Thread<G> t;
  const int h = blockIdx.y, D = s.head_dim;
  // Backwards through the grid: a sequence's causal tiles with the most keys first.
  const TileAt at = tile_at(s, s.q_tiles, gridDim.x - 1 - blockIdx.x);
  const int keys = tiling::keys_of_query_tile(at.start, at.lq, at.lk, s.causal);
  load_tile<G>(q_tile, q + (static_cast<size_t>(at.q_row) + at.start) * s.q_stride + h * D,
               s.q_stride, tiling::rows_of_tile(at.start, at.lq), D);
  QueryRows<G> rows;
  row_scales<G>(rows, s, at, t);
  float m[G::kRows], l[G::kRows];
#pragma unroll
  for (int r = 0; r < G::kRows; ++r) m[r] = -INFINITY, l[r] = 0.0f;
  Outputs<G> o;
  zero<G>(o);
  for (int k0 = 0; k0 < keys; k0 += kTile) {
    __syncthreads();  // the previous tile's P and V are read
    const size_t kv = (static_cast<size_t>(at.k_row) + k0) * s.kv_stride + h * D;
    load_tile<G>(k_tile, k + kv, s.kv_stride, tiling::rows_of_tile(k0, keys), D);
    load_tile<G>(v_tile, v + kv, s.kv_stride, tiling::rows_of_tile(k0, keys), D);
    __syncthreads();
    Scores<G> sc;
    tile_scores<G>(sc, q_tile, k_tile, t);
    scale_and_mask<G>(sc, rows, s, at, k0, t);
    online_softmax<G>(sc, m, l, o);
    __syncthreads();  // K is read: P takes its place
    store_scores<G>(k_tile, sc, t);
    __syncthreads();
    tile_accumulate<G>(o, k_tile, v_tile, t);
  }
  finish_forward<G>(out, stats, o, m, l, s, at, t);
}

// A query tile's rows for the backward: scales, the forward's log-sum-exp,
// and delta = rowsum(dO * O), which is also written for the dK/dV pass.
// do_tile: the tile's dO in shared memory; out: (Nq, H*D) dense;
// stats, delta_out: (Nq, H)
template <class G, typename T>
__device__ void backward_rows(QueryRows<G>& rows, float* delta_out, const float* do_tile,
                              const T* out, const float* stats, const Shape& s, const TileAt& at,
                              const Thread<G>& t) {
  const int h = blockIdx.y, D = s.head_dim, n = tiling::rows_of_tile(at.start, at.lq);
  const size_t row0 = static_cast<size_t>(at.q_row) + at.start;
  row_scales<G>(rows, s, at, t);
  Outputs<G> o;
  read_part<G>(o, out + row0 * s.heads * D + h * D, s.heads * D, n, D, t);
#pragma unroll
  for (int r = 0; r < G::kRows; ++r) {
    float dot = 0.0f;
#pragma unroll
    for (int d = 0; d < G::kHeadCols; ++d)
      dot += o[r][d] * do_tile[t.row(r) * G::kLd + t.head_col(d / 4) + d % 4];
    rows.delta[r] = row_sum<G>(dot);
    const bool real = t.row(r) < n;
    rows.lse2[r] = real ? stats[(row0 + t.row(r)) * s.heads + h] * kLog2e : 0.0f;
    if (real && t.lane == 0) delta_out[(row0 + t.row(r)) * s.heads + h] = rows.delta[r];
  }
}

// P = exp2(S * scale2 - lse2) of a query tile against the key tile at k0,
// 0 where the query does not see the key.  sc: S in, P out
template <class G>
__device__ void probabilities(Scores<G>& sc, const QueryRows<G>& rows, const Shape& s,
                              const TileAt& at, int k0, const Thread<G>& t) {
#pragma unroll
  for (int r = 0; r < G::kRows; ++r) {
#pragma unroll
    for (int c = 0; c < G::kCols; ++c) {
      const bool seen = tiling::sees(at.start + t.row(r), k0 + t.col(c), at.lq, at.lk, s.causal);
      sc[r][c] = seen ? exp2f(sc[r][c] * rows.scale2[r] - rows.lse2[r]) : 0.0f;
    }
  }
}

// grid (query tiles, H), SharedFloats::kQueryGrad floats of shared memory.
// dq: (Nq, .) rows q_stride apart, written; delta: (Nq, H), written;
// dout, out: (Nq, H*D) dense; stats: (Nq, H); q, k, v as in forward
template <typename T, int kDmax>
__global__ void __launch_bounds__(Geometry<kDmax>::kThreads, 1)
    query_grad_kernel(Shape s, T* dq, float* delta, const T* dout, const T* out, const float* stats,
                      const T* q, const T* k, const T* v) {
  using G = Geometry<kDmax>;
  float* q_tile = reinterpret_cast<float*>(flash_shared);
  float* do_tile = q_tile + G::kTileFloats;
  float* k_tile = do_tile + G::kTileFloats;
  float* v_tile = k_tile + G::kTileFloats;  // then dS
  const Thread<G> t;
  const int h = blockIdx.y, D = s.head_dim, C = s.heads * D;
  const TileAt at = tile_at(s, s.q_tiles, gridDim.x - 1 - blockIdx.x);
  const int n = tiling::rows_of_tile(at.start, at.lq);
  const int keys = tiling::keys_of_query_tile(at.start, at.lq, at.lk, s.causal);
  const size_t row0 = static_cast<size_t>(at.q_row) + at.start;
  load_tile<G>(q_tile, q + row0 * s.q_stride + h * D, s.q_stride, n, D);
  load_tile<G>(do_tile, dout + row0 * C + h * D, C, n, D);
  __syncthreads();
  QueryRows<G> rows;
  backward_rows<G>(rows, delta, do_tile, out, stats, s, at, t);
  Outputs<G> acc;
  zero<G>(acc);
  for (int k0 = 0; k0 < keys; k0 += kTile) {
    __syncthreads();  // the previous tile's dS and K are read
    const size_t kv = (static_cast<size_t>(at.k_row) + k0) * s.kv_stride + h * D;
    load_tile<G>(k_tile, k + kv, s.kv_stride, tiling::rows_of_tile(k0, keys), D);
    load_tile<G>(v_tile, v + kv, s.kv_stride, tiling::rows_of_tile(k0, keys), D);
    __syncthreads();
    Scores<G> p, dp;
    tile_scores<G>(p, q_tile, k_tile, t);
    probabilities<G>(p, rows, s, at, k0, t);
    tile_scores<G>(dp, do_tile, v_tile, t);
#pragma unroll
    for (int r = 0; r < G::kRows; ++r) {
#pragma unroll
      for (int c = 0; c < G::kCols; ++c)
        p[r][c] = p[r][c] * (dp[r][c] - rows.delta[r]) * rows.scale[r];  // dS
    }
    __syncthreads();  // V is read: dS takes its place
    store_scores<G>(v_tile, p, t);
    __syncthreads();
    tile_accumulate<G>(acc, v_tile, k_tile, t);
  }
  write_part<G>(dq + row0 * s.q_stride + h * D, s.q_stride, acc, n, D, t);
}

// Per query of the tile at q0, into shared memory: scale, scale2, lse2 and
// delta (kTile each, 0 past the sequence).  stats, delta: (Nq, H)
template <class G>
__device__ void query_columns(float* cols, const float* stats, const float* delta, const Shape& s,
                              const TileAt& at, int q0) {
  const int h = blockIdx.y;
  for (int i = threadIdx.x; i < kTile; i += G::kThreads) {
    const int query = q0 + i;
    const bool real = query < at.lq;
    const size_t at_stats = (static_cast<size_t>(at.q_row) + query) * s.heads + h;
    const float scale =
        real ? tiling::query_scale(s.scale, s.head_dim, s.ref_len, s.causal, query, at.lk) : 0.0f;
    cols[i] = scale;
    cols[kTile + i] = scale * kLog2e;
    cols[2 * kTile + i] = real ? stats[at_stats] * kLog2e : 0.0f;
    cols[3 * kTile + i] = real ? delta[at_stats] : 0.0f;
  }
}

// A key tile against the query tile at q0: P^T and dS^T into shared memory
// (rows: keys, columns: queries).
template <class G>
__device__ void transposed_grads(float* p_tile, float* ds_tile, const float* k_tile,
                                 const float* v_tile, const float* q_tile, const float* do_tile,
                                 const float* cols, const Shape& s, const TileAt& at, int q0,
                                 const Thread<G>& t) {
  const float *scale = cols, *scale2 = cols + kTile, *lse2 = cols + 2 * kTile,
              *delta = cols + 3 * kTile;
  Scores<G> p, dp;
  tile_scores<G>(p, k_tile, q_tile, t);
#pragma unroll
  for (int r = 0; r < G::kRows; ++r) {
#pragma unroll
    for (int c = 0; c < G::kCols; ++c) {
      const int i = t.col(c);
      const bool seen = tiling::sees(q0 + i, at.start + t.row(r), at.lq, at.lk, s.causal);
      p[r][c] = seen ? exp2f(p[r][c] * scale2[i] - lse2[i]) : 0.0f;
    }
  }
  tile_scores<G>(dp, v_tile, do_tile, t);
  store_scores<G>(p_tile, p, t);
#pragma unroll
  for (int r = 0; r < G::kRows; ++r) {
#pragma unroll
    for (int c = 0; c < G::kCols; ++c) {
      const int i = t.col(c);
      dp[r][c] = p[r][c] * (dp[r][c] - delta[i]) * scale[i];
    }
  }
  store_scores<G>(ds_tile, dp, t);
}

// grid (key tiles, H), SharedFloats::kKeyGrad floats of shared memory.
// dk, dv: (Nk, .) rows kv_stride apart, written; delta: (Nq, H) from the
// dQ pass; dout: (Nq, H*D) dense; stats: (Nq, H); q, k, v as in forward
template <typename T, int kDmax>
__global__ void __launch_bounds__(Geometry<kDmax>::kThreads, 1)
    key_grad_kernel(Shape s, T* dk, T* dv, const float* delta, const T* dout, const float* stats,
                    const T* q, const T* k, const T* v) {
  using G = Geometry<kDmax>;
  float* k_tile = reinterpret_cast<float*>(flash_shared);
  float* v_tile = k_tile + G::kTileFloats;
  float* q_tile = v_tile + G::kTileFloats;
  float* do_tile = q_tile + G::kTileFloats;
  float* p_tile = do_tile + G::kTileFloats;
  float* ds_tile = p_tile + G::kScoreFloats;
  float* cols = ds_tile + G::kScoreFloats;
  const Thread<G> t;
  const int h = blockIdx.y, D = s.head_dim, C = s.heads * D;
  const TileAt at = tile_at(s, s.k_tiles, blockIdx.x);
  const int keys = tiling::rows_of_tile(at.start, at.lk);
  const size_t kv = (static_cast<size_t>(at.k_row) + at.start) * s.kv_stride + h * D;
  load_tile<G>(k_tile, k + kv, s.kv_stride, keys, D);
  load_tile<G>(v_tile, v + kv, s.kv_stride, keys, D);
  Outputs<G> dk_acc, dv_acc;
  zero<G>(dk_acc);
  zero<G>(dv_acc);
  for (int q0 = tiling::first_query_of_key_tile(at.start, s.causal); q0 < at.lq; q0 += kTile) {
    const size_t row0 = static_cast<size_t>(at.q_row) + q0;
    __syncthreads();  // the previous query tile is read
    load_tile<G>(q_tile, q + row0 * s.q_stride + h * D, s.q_stride, tiling::rows_of_tile(q0, at.lq),
                 D);
    load_tile<G>(do_tile, dout + row0 * C + h * D, C, tiling::rows_of_tile(q0, at.lq), D);
    query_columns<G>(cols, stats, delta, s, at, q0);
    __syncthreads();
    transposed_grads<G>(p_tile, ds_tile, k_tile, v_tile, q_tile, do_tile, cols, s, at, q0, t);
    __syncthreads();
    tile_accumulate<G>(dv_acc, p_tile, do_tile, t);  // dV += P^T dO
    tile_accumulate<G>(dk_acc, ds_tile, q_tile, t);  // dK += dS^T Q
  }
  write_part<G>(dk + kv, s.kv_stride, dk_acc, keys, D, t);
  write_part<G>(dv + kv, s.kv_stride, dv_acc, keys, D, t);
}

// tiles[b] = the tiles of the sequences before b (tiles[B]: all of them),
// for the query side (block 0) and the key side (block 1). Each thread
// sums a run of sequences, then the block scans the runs.
// blockDim.x ints of shared memory.  tiles, offsets: (B+1) each
__global__ void tile_starts_kernel(int32_t* q_tiles, int32_t* k_tiles, const int32_t* q_offsets,
                                   const int32_t* k_offsets, int batch) {
  int32_t* tiles = blockIdx.x == 0 ? q_tiles : k_tiles;
  const int32_t* offsets = blockIdx.x == 0 ? q_offsets : k_offsets;
  int* sums = reinterpret_cast<int*>(flash_shared);
  const int me = static_cast<int>(threadIdx.x), threads = static_cast<int>(blockDim.x);
  const int per = (batch + threads - 1) / threads;
  const int b0 = min(batch, me * per), b1 = min(batch, b0 + per);
  int own = 0;
  for (int b = b0; b < b1; ++b) own += tiling::tiles_of(offsets[b + 1] - offsets[b]);
  sums[me] = own;
  __syncthreads();
  for (int step = 1; step < threads; step *= 2) {  // inclusive scan of the runs
    const int add = me >= step ? sums[me - step] : 0;
    __syncthreads();
    sums[me] += add;
    __syncthreads();
  }
  int before = sums[me] - own;
  for (int b = b0; b < b1; ++b) {
    tiles[b] = before;
    before += tiling::tiles_of(offsets[b + 1] - offsets[b]);
  }
  if (me == threads - 1) tiles[batch] = sums[me];
}

}  // namespace mpiformer::cuda::flash
