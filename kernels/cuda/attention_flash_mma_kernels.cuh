// The flash kernels on tensor cores (attention_flash_mma.cuh): forward, the
// dQ pass and the dK/dV pass, for T bf16 or fp16 and heads up to kDmax
// 32 or 64, 4 warps a block, each 16 rows of the tile.
#pragma once

#include "kernels/cuda/attention_flash_mma.cuh"

namespace mpiformer::cuda::flash {

template <int kDmax>
using HeadAccumulators = float[MmaGeometry<kDmax>::kHeadTiles][4];

// The online softmax of a warp's scores against the key tile at k0 (cf.
// online_softmax): scaled to base 2, masked, m and l (this lane's part)
// moved to the tile's max, o rescaled, scores replaced by exp2(s - m).
template <int kDmax>
__device__ void mma_online_softmax(MmaScores& sc, const float (&scale2)[2], float (&m)[2],
                                   float (&l)[2], HeadAccumulators<kDmax>& o, const Shape& s,
                                   const TileAt& at, int k0, const Lane& lane) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int i = at.start + lane.row(h);
    float top = m[h];
#pragma unroll
    for (int n = 0; n < 8; ++n) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& x = sc[n][2 * h + e];
        x = tiling::sees(i, k0 + lane.col(n, e), at.lq, at.lk, s.causal) ? x * scale2[h]
                                                                         : -INFINITY;
        top = fmaxf(top, x);
      }
    }
    top = quad_max(top);
    const float ref = tiling::softmax_reference(top);
    const float correction = exp2f(m[h] - ref);
    float sum = 0.0f;
#pragma unroll
    for (int n = 0; n < 8; ++n) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& x = sc[n][2 * h + e];
        x = exp2f(x - ref);
        sum += x;
      }
    }
    l[h] = l[h] * correction + sum;
#pragma unroll
    for (int n = 0; n < MmaGeometry<kDmax>::kHeadTiles; ++n)
      o[n][2 * h] *= correction, o[n][2 * h + 1] *= correction;
    m[h] = top;
  }
}

// grid (query tiles, H), MmaSharedFloats::kForward floats of shared
// memory; forward_kernel's arguments.
template <typename T, int kDmax>
__global__ void __launch_bounds__(128, 1)
    forward_mma_kernel(Shape s, T* out, float* stats, const T* q, const T* k, const T* v) {
  using G = MmaGeometry<kDmax>;
  float* q_tile = reinterpret_cast<float*>(flash_shared);
  float* k_tile = q_tile + G::kTileFloats;
  float* v_tile = k_tile + G::kTileFloats;
  const Lane lane;
  const int h = blockIdx.y, D = s.head_dim;
  const TileAt at = tile_at(s, s.q_tiles, gridDim.x - 1 - blockIdx.x);
  const int rows = tiling::rows_of_tile(at.start, at.lq);
  const int keys = tiling::keys_of_query_tile(at.start, at.lq, at.lk, s.causal);
  const size_t row0 = static_cast<size_t>(at.q_row) + at.start;
  load_tile<G>(q_tile, q + row0 * s.q_stride + h * D, s.q_stride, rows, D);
  __syncthreads();
  uint32_t qa[MmaGeometry<kDmax>::kSteps][4];
#pragma unroll
  for (int ks = 0; ks < MmaGeometry<kDmax>::kSteps; ++ks)
    a_fragment<T, G::kLd>(qa[ks], q_tile, 16 * ks, lane);
  float scale2[2], m[2], l[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    scale2[i] =
        tiling::query_scale(s.scale, D, s.ref_len, s.causal, at.start + lane.row(i), at.lk) *
        kLog2e;
    m[i] = -INFINITY, l[i] = 0.0f;
  }
  HeadAccumulators<kDmax> o = {};
  for (int k0 = 0; k0 < keys; k0 += kTile) {
    __syncthreads();  // the previous tile's K and V are read
    const size_t kv = (static_cast<size_t>(at.k_row) + k0) * s.kv_stride + h * D;
    load_tile<G>(k_tile, k + kv, s.kv_stride, tiling::rows_of_tile(k0, keys), D);
    load_tile<G>(v_tile, v + kv, s.kv_stride, tiling::rows_of_tile(k0, keys), D);
    __syncthreads();
    MmaScores sc;
    mma_scores<T, G>(sc, qa, k_tile, lane);
    mma_online_softmax<kDmax>(sc, scale2, m, l, o, s, at, k0, lane);
    mma_accumulate<T, G>(o, sc, v_tile, lane);
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float sum = quad_sum(l[i]);
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;  // a row that sees nothing gets 0
#pragma unroll
    for (int n = 0; n < MmaGeometry<kDmax>::kHeadTiles; ++n)
      o[n][2 * i] *= inv, o[n][2 * i + 1] *= inv;
    if (lane.t == 0 && lane.row(i) < rows)
      stats[(row0 + lane.row(i)) * s.heads + h] = tiling::row_stats(m[i], sum);
  }
  mma_write<G>(out + row0 * s.heads * D + h * D, s.heads * D, o, rows, D, lane);
}

// A warp's query rows for the backward (cf. backward_rows): scale, scale2,
// lse2 and delta = rowsum(dO * O), delta also written for the dK/dV pass.
// do_tile: the tile's dO; out: (Nq, H*D) dense; stats, delta_out: (Nq, H)
template <class G, typename T>
__device__ void mma_backward_rows(float (&rows)[4][2], float* delta_out, const float* do_tile,
                                  const T* out, const float* stats, const Shape& s,
                                  const TileAt& at, const Lane& lane) {
  const int h = blockIdx.y, D = s.head_dim, n = tiling::rows_of_tile(at.start, at.lq);
  const size_t row0 = static_cast<size_t>(at.q_row) + at.start;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = lane.row(i);
    const bool real = r < n;
    const float scale = tiling::query_scale(s.scale, D, s.ref_len, s.causal, at.start + r, at.lk);
    float dot = 0.0f;
    for (int d = lane.t; real && d < D; d += 4)
      dot += do_tile[r * G::kLd + d] * load(out, (row0 + r) * s.heads * D + h * D + d);
    dot = quad_sum(dot);
    rows[0][i] = scale;
    rows[1][i] = scale * kLog2e;
    rows[2][i] = real ? stats[(row0 + r) * s.heads + h] * kLog2e : 0.0f;
    rows[3][i] = dot;
    if (real && lane.t == 0) delta_out[(row0 + r) * s.heads + h] = dot;
  }
}

// grid (query tiles, H), MmaSharedFloats::kQueryGrad floats of shared
// memory; query_grad_kernel's arguments.
template <typename T, int kDmax>
__global__ void __launch_bounds__(128, 1)
    query_grad_mma_kernel(Shape s, T* dq, float* delta, const T* dout, const T* out,
                          const float* stats, const T* q, const T* k, const T* v) {
  using G = MmaGeometry<kDmax>;
  float* q_tile = reinterpret_cast<float*>(flash_shared);
  float* do_tile = q_tile + G::kTileFloats;
  float* k_tile = do_tile + G::kTileFloats;
  float* v_tile = k_tile + G::kTileFloats;
  const Lane lane;
  const int h = blockIdx.y, D = s.head_dim, C = s.heads * D;
  const TileAt at = tile_at(s, s.q_tiles, gridDim.x - 1 - blockIdx.x);
  const int n = tiling::rows_of_tile(at.start, at.lq);
  const int keys = tiling::keys_of_query_tile(at.start, at.lq, at.lk, s.causal);
  const size_t row0 = static_cast<size_t>(at.q_row) + at.start;
  load_tile<G>(q_tile, q + row0 * s.q_stride + h * D, s.q_stride, n, D);
  load_tile<G>(do_tile, dout + row0 * C + h * D, C, n, D);
  __syncthreads();
  uint32_t qa[G::kSteps][4], da[G::kSteps][4];
#pragma unroll
  for (int ks = 0; ks < G::kSteps; ++ks) {
    a_fragment<T, G::kLd>(qa[ks], q_tile, 16 * ks, lane);
    a_fragment<T, G::kLd>(da[ks], do_tile, 16 * ks, lane);
  }
  float rows[4][2];  // scale, scale2, lse2, delta of rows row(0), row(1)
  mma_backward_rows<G>(rows, delta, do_tile, out, stats, s, at, lane);
  HeadAccumulators<kDmax> acc = {};
  for (int k0 = 0; k0 < keys; k0 += kTile) {
    __syncthreads();  // the previous tile's K and V are read
    const size_t kv = (static_cast<size_t>(at.k_row) + k0) * s.kv_stride + h * D;
    load_tile<G>(k_tile, k + kv, s.kv_stride, tiling::rows_of_tile(k0, keys), D);
    load_tile<G>(v_tile, v + kv, s.kv_stride, tiling::rows_of_tile(k0, keys), D);
    __syncthreads();
    MmaScores p, dp;
    mma_scores<T, G>(p, qa, k_tile, lane);
    mma_scores<T, G>(dp, da, v_tile, lane);
#pragma unroll
    for (int c = 0; c < 8; ++c) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = e / 2;
        const bool seen =
            tiling::sees(at.start + lane.row(i), k0 + lane.col(c, e), at.lq, at.lk, s.causal);
        const float pe = seen ? exp2f(p[c][e] * rows[1][i] - rows[2][i]) : 0.0f;
        p[c][e] = pe * (dp[c][e] - rows[3][i]) * rows[0][i];  // dS
      }
    }
    mma_accumulate<T, G>(acc, p, k_tile, lane);  // dQ += dS K
  }
  mma_write<G>(dq + row0 * s.q_stride + h * D, s.q_stride, acc, n, D, lane);
}

// A warp's key rows against the query tile at q0 (cf. transposed_grads):
// pt = P^T and dst = dS^T, rows keys and columns queries.
template <typename T, class G>
__device__ void mma_transposed_grads(MmaScores& pt, MmaScores& dst,
                                     const uint32_t (&ka)[G::kSteps][4],
                                     const uint32_t (&va)[G::kSteps][4], const float* q_tile,
                                     const float* do_tile, const float* cols, const Shape& s,
                                     const TileAt& at, int q0, const Lane& lane) {
  const float *scale = cols, *scale2 = cols + kTile, *lse2 = cols + 2 * kTile,
              *delta = cols + 3 * kTile;
  mma_scores<T, G>(pt, ka, q_tile, lane);
  mma_scores<T, G>(dst, va, do_tile, lane);
#pragma unroll
  for (int c = 0; c < 8; ++c) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = lane.col(c, e), j = at.start + lane.row(e / 2);
      const bool seen = tiling::sees(q0 + i, j, at.lq, at.lk, s.causal);
      pt[c][e] = seen ? exp2f(pt[c][e] * scale2[i] - lse2[i]) : 0.0f;
      dst[c][e] = pt[c][e] * (dst[c][e] - delta[i]) * scale[i];
    }
  }
}

// grid (key tiles, H), MmaSharedFloats::kKeyGrad floats of shared memory;
// key_grad_kernel's arguments.
template <typename T, int kDmax>
__global__ void __launch_bounds__(128, 1)
    key_grad_mma_kernel(Shape s, T* dk, T* dv, const float* delta, const T* dout,
                        const float* stats, const T* q, const T* k, const T* v) {
  using G = MmaGeometry<kDmax>;
  float* k_tile = reinterpret_cast<float*>(flash_shared);
  float* v_tile = k_tile + G::kTileFloats;
  float* q_tile = v_tile + G::kTileFloats;
  float* do_tile = q_tile + G::kTileFloats;
  float* cols = do_tile + G::kTileFloats;
  const Lane lane;
  const int h = blockIdx.y, D = s.head_dim, C = s.heads * D;
  const TileAt at = tile_at(s, s.k_tiles, blockIdx.x);
  const int keys = tiling::rows_of_tile(at.start, at.lk);
  const size_t kv = (static_cast<size_t>(at.k_row) + at.start) * s.kv_stride + h * D;
  load_tile<G>(k_tile, k + kv, s.kv_stride, keys, D);
  load_tile<G>(v_tile, v + kv, s.kv_stride, keys, D);
  __syncthreads();
  uint32_t ka[G::kSteps][4], va[G::kSteps][4];
#pragma unroll
  for (int ks = 0; ks < G::kSteps; ++ks) {
    a_fragment<T, G::kLd>(ka[ks], k_tile, 16 * ks, lane);
    a_fragment<T, G::kLd>(va[ks], v_tile, 16 * ks, lane);
  }
  HeadAccumulators<kDmax> dk_acc = {}, dv_acc = {};
  for (int q0 = tiling::first_query_of_key_tile(at.start, s.causal); q0 < at.lq; q0 += kTile) {
    const size_t row0 = static_cast<size_t>(at.q_row) + q0;
    __syncthreads();  // the previous query tile is read
    load_tile<G>(q_tile, q + row0 * s.q_stride + h * D, s.q_stride, tiling::rows_of_tile(q0, at.lq),
                 D);
    load_tile<G>(do_tile, dout + row0 * C + h * D, C, tiling::rows_of_tile(q0, at.lq), D);
    query_columns<G>(cols, stats, delta, s, at, q0);
    __syncthreads();
    MmaScores pt, dst;
    mma_transposed_grads<T, G>(pt, dst, ka, va, q_tile, do_tile, cols, s, at, q0, lane);
    mma_accumulate<T, G>(dv_acc, pt, do_tile, lane);  // dV += P^T dO
    mma_accumulate<T, G>(dk_acc, dst, q_tile, lane);  // dK += dS^T Q
  }
  mma_write<G>(dk + kv, s.kv_stride, dk_acc, keys, D, lane);
  mma_write<G>(dv + kv, s.kv_stride, dv_acc, keys, D, lane);
}

}  // namespace mpiformer::cuda::flash
