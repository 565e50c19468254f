// The tiling of flash-style attention (FlashAttention-2), shared by the CUDA
// kernels (kernels/cuda/attention_flash.cu) and their CPU twin
// (kernels/cpu/attention_tiled.h): both walk the same tiles in the same
// order and apply the same masks, scales and softmax recurrences.
//
// Each sequence of a ragged batch is cut into tiles of kTile rows, the last
// one partial: sequence b has tiles_of(L_b) query tiles and as many key
// tiles of its own keys. Query and key tiles are the same size and start at
// multiples of kTile, so under the causal mask a query tile's last key tile
// is the one on its diagonal.
// - Forward and the dQ pass: a query tile runs over its key tiles left to
//   right, keeping for each row a running max m and sum l of its scores in
//   base 2 (the scaled score times log2 e, so exp2 does the exponentials);
//   the output is divided by l once, at the end.
// - The dK/dV pass: a key tile runs over the query tiles that see it, top
//   to bottom, recomputing P = exp2(S * scale2 - lse2) from the forward's
//   log-sum-exp.
#pragma once

#include <cmath>

#include "kernels/ops.h"

namespace mpiformer::tiling {

constexpr int kTile = 64;  // query rows of a query tile (Br) and keys of a key tile (Bc)
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

MPIFORMER_HOST_DEVICE inline int tiles_of(int length) {
  return (length + kTile - 1) / kTile;
}

// Rows of the tile that starts at row `start` of a sequence of `length`.
MPIFORMER_HOST_DEVICE inline int rows_of_tile(int start, int length) {
  return length - start < kTile ? length - start : kTile;
}

// The query tile at q0 runs over keys [0, keys_of_query_tile): all of them,
// or under the causal mask those up to its last row's diagonal.
MPIFORMER_HOST_DEVICE inline int keys_of_query_tile(int q0, int lq, int lk, bool causal) {
  if (!causal) return lk;
  const int end = q0 + rows_of_tile(q0, lq);
  return end < lk ? end : lk;
}

// The key tile at k0 runs over the query tiles from this row on (query k0
// is the first that sees key k0 under the causal mask).
MPIFORMER_HOST_DEVICE inline int first_query_of_key_tile(int k0, bool causal) {
  return causal ? k0 : 0;
}

// Whether query i of a sequence sees its key j.
MPIFORMER_HOST_DEVICE inline bool sees(int i, int j, int lq, int lk, bool causal) {
  return i < lq && j < lk && (!causal || j <= i);
}

// Query i's attention scale (attention_scale of the keys it sees).
MPIFORMER_HOST_DEVICE inline float query_scale(AttentionScale kind, int head_dim, float ref_len,
                                               bool causal, int i, int lk) {
  const int visible = causal ? (i + 1 < lk ? i + 1 : lk) : lk;
  return attention_scale(kind, head_dim, ref_len, visible);
}

// The online softmax subtracts this from a row's base-2 scores: its running
// max m, or 0 while the row has seen no key (m = -inf), so that a masked
// score (-inf) gives exp2 = 0 and never NaN.
MPIFORMER_HOST_DEVICE inline float softmax_reference(float m) {
  return m == -INFINITY ? 0.0f : m;
}

// A row's stats from its final base-2 max m and sum l: the natural
// log-sum-exp of its scaled scores, 0 for a row that saw no key.
MPIFORMER_HOST_DEVICE inline float row_stats(float m, float l) {
  return l > 0.0f ? (m + log2f(l)) * kLn2 : 0.0f;
}

}  // namespace mpiformer::tiling
