// The CPU twin of the CUDA flash attention kernels: one function per CUDA
// block (a tile and a head), running the same loops over the same tiles.
// Where a CUDA block spreads a tile over its threads, the twin walks the
// tile's rows one by one; the recurrences per row are the same.
#include "kernels/cpu/attention_tiled.h"

#include <cmath>
#include <vector>

#include "kernels/attention_tiling.h"

namespace mpiformer::cpu {
namespace {

using tiling::kLog2e;
using tiling::kTile;

// A tile: sequence b's rows [start, start + kTile).
struct Tile {
  int b, start;
};

// The tiles of a ragged batch in the CUDA grid's order, sequence by sequence.
std::vector<Tile> batch_tiles(const Ragged& r) {
  std::vector<Tile> tiles;
  for (int b = 0; b < r.batch; ++b) {
    for (int start = 0; start < r.length(b); start += kTile) tiles.push_back({b, start});
  }
  return tiles;
}

// The operands of one call.
struct Operands {
  const float* q;  // (Nq, .) rows q_stride apart
  const float* k;  // (Nk, .) rows kv_stride apart
  const float* v;  // (Nk, .) rows kv_stride apart
  int q_stride, kv_stride;
  const Ragged& qs;
  const Ragged& ks;
  const AttentionConfig& cfg;

  // Row i of sequence b's queries, keys, values for head h.  (D) each
  const float* q_row(int b, int i, int h) const {
    return q + static_cast<size_t>(qs.host_offsets[b] + i) * q_stride + h * cfg.head_dim;
  }
  const float* k_row(int b, int j, int h) const {
    return k + static_cast<size_t>(ks.host_offsets[b] + j) * kv_stride + h * cfg.head_dim;
  }
  const float* v_row(int b, int j, int h) const {
    return v + static_cast<size_t>(ks.host_offsets[b] + j) * kv_stride + h * cfg.head_dim;
  }
  float scale(int b, int i) const {
    return tiling::query_scale(cfg.scale, cfg.head_dim, cfg.ref_len, cfg.causal, i, ks.length(b));
  }
  bool sees(int b, int i, int j) const {
    return tiling::sees(i, j, qs.length(b), ks.length(b), cfg.causal);
  }
};

float dot(const float* x, const float* y, int n) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int d = 0; d < n; ++d) sum += x[d] * y[d];
  return sum;
}

// x += a * y.  x, y: (n)
void add_scaled(float* x, float a, const float* y, int n) {
#pragma omp simd
  for (int d = 0; d < n; ++d) x[d] += a * y[d];
}

// One row's online softmax over the key tile at k0: its base-2 scores,
// then m, l and the unnormalised output o (D) rescaled and added to.
void forward_row(const Operands& a, int b, int i, int h, int k0, float* m, float* l, float* o) {
  const int D = a.cfg.head_dim;
  const float scale2 = a.scale(b, i) * kLog2e;
  float s[kTile];
  float top = *m;
  for (int c = 0; c < kTile; ++c) {
    const int j = k0 + c;
    s[c] = a.sees(b, i, j) ? dot(a.q_row(b, i, h), a.k_row(b, j, h), D) * scale2 : -INFINITY;
    top = std::fmax(top, s[c]);
  }
  const float ref = tiling::softmax_reference(top);
  const float correction = std::exp2(*m - ref);
  float sum = 0.0f;
  for (int d = 0; d < D; ++d) o[d] *= correction;
  for (int c = 0; c < kTile; ++c) {
    const float p = std::exp2(s[c] - ref);
    sum += p;
    if (k0 + c < a.ks.length(b)) add_scaled(o, p, a.v_row(b, k0 + c, h), D);
  }
  *l = *l * correction + sum;
  *m = top;
}

// A CUDA forward block: query tile t of head h.  out: (Nq, H*D), stats: (Nq, H)
void forward_tile(const Operands& a, Tile t, int h, float* out, float* stats) {
  const int H = a.cfg.heads, D = a.cfg.head_dim;
  const int lq = a.qs.length(t.b), lk = a.ks.length(t.b);
  const int rows = tiling::rows_of_tile(t.start, lq);
  const int keys = tiling::keys_of_query_tile(t.start, lq, lk, a.cfg.causal);
  std::vector<float> m(rows, -INFINITY), l(rows, 0.0f), o(static_cast<size_t>(rows) * D, 0.0f);
  for (int k0 = 0; k0 < keys; k0 += kTile) {
    for (int r = 0; r < rows; ++r) {
      forward_row(a, t.b, t.start + r, h, k0, &m[r], &l[r], &o[static_cast<size_t>(r) * D]);
    }
  }
  for (int r = 0; r < rows; ++r) {
    const size_t row = a.qs.host_offsets[t.b] + t.start + r;
    const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
    for (int d = 0; d < D; ++d)
      out[row * H * D + h * D + d] = o[static_cast<size_t>(r) * D + d] * inv;
    stats[row * H + h] = tiling::row_stats(m[r], l[r]);
  }
}

// What the backward passes read besides the operands.
struct Saved {
  const float* dout;   // (Nq, H*D) dense
  const float* stats;  // (Nq, H)
  const float* delta;  // (Nq, H): rowsum(dout * out) per head
};

// Query i's probability of key j and the gradient at its score (dS, with
// the scale applied), recomputed from the stats.
void score_grad(const Operands& a, const Saved& s, int b, int i, int j, int h, float* p,
                float* ds) {
  const int D = a.cfg.head_dim, H = a.cfg.heads;
  const size_t row = a.qs.host_offsets[b] + i;
  const float scale = a.scale(b, i);
  const float lse2 = s.stats[row * H + h] * kLog2e;
  *p = std::exp2(dot(a.q_row(b, i, h), a.k_row(b, j, h), D) * (scale * kLog2e) - lse2);
  const float dp = dot(s.dout + row * H * D + h * D, a.v_row(b, j, h), D);
  *ds = *p * (dp - s.delta[row * H + h]) * scale;
}

// A CUDA dK/dV block: key tile t of head h, over the query tiles that see it.
// dk, dv: (Nk, .) rows kv_stride apart
void key_tile(const Operands& a, const Saved& s, Tile t, int h, float* dk, float* dv) {
  const int D = a.cfg.head_dim, H = a.cfg.heads;
  const int lq = a.qs.length(t.b), keys = tiling::rows_of_tile(t.start, a.ks.length(t.b));
  std::vector<float> dk_acc(static_cast<size_t>(keys) * D, 0.0f), dv_acc(dk_acc.size(), 0.0f);
  for (int q0 = tiling::first_query_of_key_tile(t.start, a.cfg.causal); q0 < lq; q0 += kTile) {
    const int rows = tiling::rows_of_tile(q0, lq);
    for (int c = 0; c < keys; ++c) {
      for (int r = 0; r < rows; ++r) {
        const int i = q0 + r, j = t.start + c;
        if (!a.sees(t.b, i, j)) continue;
        float p, ds;
        score_grad(a, s, t.b, i, j, h, &p, &ds);
        const size_t row = a.qs.host_offsets[t.b] + i;
        add_scaled(&dv_acc[static_cast<size_t>(c) * D], p, s.dout + row * H * D + h * D, D);
        add_scaled(&dk_acc[static_cast<size_t>(c) * D], ds, a.q_row(t.b, i, h), D);
      }
    }
  }
  for (int c = 0; c < keys; ++c) {
    const size_t row = a.ks.host_offsets[t.b] + t.start + c;
    for (int d = 0; d < D; ++d) {
      dk[row * a.kv_stride + h * D + d] = dk_acc[static_cast<size_t>(c) * D + d];
      dv[row * a.kv_stride + h * D + d] = dv_acc[static_cast<size_t>(c) * D + d];
    }
  }
}

// A CUDA dQ block: query tile t of head h, over its key tiles.
// dq: (Nq, .) rows q_stride apart
void query_tile(const Operands& a, const Saved& s, Tile t, int h, float* dq) {
  const int D = a.cfg.head_dim;
  const int lq = a.qs.length(t.b), lk = a.ks.length(t.b);
  const int rows = tiling::rows_of_tile(t.start, lq);
  const int keys = tiling::keys_of_query_tile(t.start, lq, lk, a.cfg.causal);
  std::vector<float> acc(static_cast<size_t>(rows) * D, 0.0f);
  for (int k0 = 0; k0 < keys; k0 += kTile) {
    for (int r = 0; r < rows; ++r) {
      for (int c = 0; c < kTile; ++c) {
        const int i = t.start + r, j = k0 + c;
        if (!a.sees(t.b, i, j)) continue;
        float p, ds;
        score_grad(a, s, t.b, i, j, h, &p, &ds);
        add_scaled(&acc[static_cast<size_t>(r) * D], ds, a.k_row(t.b, j, h), D);
      }
    }
  }
  for (int r = 0; r < rows; ++r) {
    const size_t row = a.qs.host_offsets[t.b] + t.start + r;
    for (int d = 0; d < D; ++d)
      dq[row * a.q_stride + h * D + d] = acc[static_cast<size_t>(r) * D + d];
  }
}

// delta = rowsum(dout * out) per (row, head): the backward's preprocessing.
// delta: (Nq, H), dout, out: (Nq, H*D)
void row_deltas(float* delta, const float* dout, const float* out, int rows, int H, int D) {
#pragma omp parallel for schedule(static)
  for (int row = 0; row < rows; ++row) {
    for (int h = 0; h < H; ++h) {
      const size_t at = static_cast<size_t>(row) * H * D + h * D;
      delta[static_cast<size_t>(row) * H + h] = dot(dout + at, out + at, D);
    }
  }
}

}  // namespace

void tiled_attention_forward(float* out, float* stats, const float* q, int q_stride, const float* k,
                             const float* v, int kv_stride, const Ragged& qs, const Ragged& ks,
                             const AttentionConfig& cfg) {
  const Operands a{q, k, v, q_stride, kv_stride, qs, ks, cfg};
  const std::vector<Tile> tiles = batch_tiles(qs);
  const int tasks = static_cast<int>(tiles.size()) * cfg.heads;
#pragma omp parallel for schedule(dynamic, 1)
  for (int task = 0; task < tasks; ++task) {
    forward_tile(a, tiles[task / cfg.heads], task % cfg.heads, out, stats);
  }
}

void tiled_attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                              const float* stats, const float* q, int q_stride, const float* k,
                              const float* v, int kv_stride, const Ragged& qs, const Ragged& ks,
                              const AttentionConfig& cfg) {
  const Operands a{q, k, v, q_stride, kv_stride, qs, ks, cfg};
  std::vector<float> delta(static_cast<size_t>(qs.total) * cfg.heads);
  row_deltas(delta.data(), dout, out, qs.total, cfg.heads, cfg.head_dim);
  const Saved s{dout, stats, delta.data()};
  // The dQ pass, then the dK/dV pass, as the CUDA kernels are queued.
  const std::vector<Tile> q_tiles = batch_tiles(qs), k_tiles = batch_tiles(ks);
  const int q_tasks = static_cast<int>(q_tiles.size()) * cfg.heads;
  const int k_tasks = static_cast<int>(k_tiles.size()) * cfg.heads;
#pragma omp parallel for schedule(dynamic, 1)
  for (int task = 0; task < q_tasks; ++task) {
    query_tile(a, s, q_tiles[task / cfg.heads], task % cfg.heads, dq);
  }
#pragma omp parallel for schedule(dynamic, 1)
  for (int task = 0; task < k_tasks; ++task) {
    key_tile(a, s, k_tiles[task / cfg.heads], task % cfg.heads, dk, dv);
  }
}

}  // namespace mpiformer::cpu
