// The host-side arithmetic of cuDNN attention (attention_cudnn.h), plain
// C++ so that it is tested without a GPU: the layout of a graph's per-batch
// metadata, and the memory its calls may take.
//
// A graph with `slots` sequences (slots >= B: the slots past B are empty
// sequences, their offsets repeating the end) reads
//   seq_q, seq_kv: int32 (slots)   sequence lengths
//   ro_q, ro_kv, ro_o, ro_stats: int64 (slots + 1)   ragged offsets in
//   elements: token offsets times each tensor's token stride.
// The cuDNN frontend assumes every tensor 16-byte aligned and does not
// check, so each array starts on its own 16-byte boundary (the buffer's
// base, from cudaMalloc, is 256-byte aligned).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/ops.h"

namespace mpiformer::cuda {

constexpr size_t kAttentionMetaAlignment = 16;

// Byte offsets of the six arrays in the buffer, and its size.
struct AttentionMetaLayout {
  size_t seq_q, seq_kv, ro_q, ro_kv, ro_o, ro_stats;
  size_t bytes;
};

constexpr AttentionMetaLayout attention_meta_layout(int slots) {
  const auto aligned = [](size_t bytes) {
    return (bytes + kAttentionMetaAlignment - 1) / kAttentionMetaAlignment *
           kAttentionMetaAlignment;
  };
  const size_t lengths = aligned(static_cast<size_t>(slots) * sizeof(int32_t));
  const size_t offsets = aligned((static_cast<size_t>(slots) + 1) * sizeof(int64_t));
  AttentionMetaLayout layout{};
  layout.seq_q = 0;
  layout.seq_kv = layout.seq_q + lengths;
  layout.ro_q = layout.seq_kv + lengths;
  layout.ro_kv = layout.ro_q + offsets;
  layout.ro_o = layout.ro_kv + offsets;
  layout.ro_stats = layout.ro_o + offsets;
  layout.bytes = layout.ro_stats + offsets;
  return layout;
}

inline size_t attention_meta_bytes(int slots) {
  return attention_meta_layout(slots).bytes;
}

struct AttentionMeta {
  int32_t* seq_q;     // (slots)
  int32_t* seq_kv;    // (slots)
  int64_t* ro_q;      // (slots + 1)
  int64_t* ro_kv;     // (slots + 1)
  int64_t* ro_o;      // (slots + 1)
  int64_t* ro_stats;  // (slots + 1)
};

// The arrays in a buffer of attention_meta_bytes(slots) at `base`.
inline AttentionMeta attention_meta(void* base, int slots) {
  const AttentionMetaLayout layout = attention_meta_layout(slots);
  char* bytes = static_cast<char*>(base);
  return AttentionMeta{reinterpret_cast<int32_t*>(bytes + layout.seq_q),
                       reinterpret_cast<int32_t*>(bytes + layout.seq_kv),
                       reinterpret_cast<int64_t*>(bytes + layout.ro_q),
                       reinterpret_cast<int64_t*>(bytes + layout.ro_kv),
                       reinterpret_cast<int64_t*>(bytes + layout.ro_o),
                       reinterpret_cast<int64_t*>(bytes + layout.ro_stats)};
}

// ---- memory ----------------------------------------------------------------
// A call's cuDNN workspace shares its buffer with the plain kernels' scores
// (P and dS, kept by the plain backward), and may be as large as those
// would be for the same call, or this floor. A case that needs more (the
// deterministic backward's dP grows with slots x heads x the padded length
// squared, so a batch of many short sequences and one long one needs
// gigabytes) goes to the plain kernels.
constexpr size_t kAttentionWorkspaceFloor = size_t{64} << 20;

// The plain backward's P and dS: H * sum_b Lq_b * Lk_b floats each.
// qs, ks: host lengths.
inline size_t plain_attention_scores_bytes(const Ragged& qs, const Ragged& ks, int heads) {
  size_t pairs = 0;
  for (int b = 0; b < qs.batch; ++b) pairs += static_cast<size_t>(qs.length(b)) * ks.length(b);
  return 2 * sizeof(float) * pairs * heads;
}

inline size_t attention_workspace_budget(const Ragged& qs, const Ragged& ks, int heads) {
  return std::max(plain_attention_scores_bytes(qs, ks, heads), kAttentionWorkspaceFloor);
}

// The most scratch attention takes for `tokens` packed rows of sequences up
// to `longest` long (Ops::attention_scratch_bytes): the plain scores, or
// with cuDNN asked (cudnn) its workspace budget and, for a log-length
// scale, the dense copy of q with its factor folded in (and its gradient).
inline size_t attention_scratch_bytes(DType dtype, size_t tokens, size_t longest,
                                      const AttentionConfig& cfg, bool backward, bool cudnn) {
  size_t scores = backward ? 2 * sizeof(float) * cfg.heads * tokens * longest : 0;
  if (!cudnn) return scores;
  scores = std::max(scores, kAttentionWorkspaceFloor);
  const size_t query = cfg.scale == AttentionScale::kLogLength
                           ? tokens * cfg.heads * cfg.head_dim * dtype_bytes(dtype)
                           : 0;
  return scores + query * (backward ? 2 : 1);
}

}  // namespace mpiformer::cuda
