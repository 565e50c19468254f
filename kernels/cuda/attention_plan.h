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
#include <vector>

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

// A call whose shape was not prepared (Ops::prepare_attention) may take the
// workspace reserved for the prepared ones, its own plain scores' worth, or
// a quarter of the device's free memory, whichever is most: the budget comes
// from the device, so a batch of many short sequences is not sent to the
// plain kernels for want of a few MiB.
inline size_t unplanned_workspace_budget(const Ragged& qs, const Ragged& ks, int heads,
                                         size_t reserved, size_t device_free) {
  return std::max({attention_workspace_budget(qs, ks, heads), reserved, device_free / 4});
}

// The workspace reserved before the first step: the largest the prepared
// graphs need (every call then runs in it).
inline size_t reserved_workspace(const std::vector<size_t>& workspaces) {
  size_t most = 0;
  for (size_t w : workspaces) most = std::max(most, w);
  return most;
}

// Free memory a reservation must leave on the device: the library handles,
// cuBLAS's workspace and the scratch that grows on the first steps.
constexpr size_t kWorkspaceHeadroom = size_t{256} << 20;

// Whether `workspace` (more than `held` is already reserved) fits in the
// device's `device_free` bytes with the headroom left.
inline bool workspace_fits(size_t workspace, size_t held, size_t device_free) {
  const size_t more = workspace > held ? workspace - held : 0;
  return more == 0 || more + kWorkspaceHeadroom <= device_free;
}

// ---- graph shapes ----------------------------------------------------------
// A graph is static in its slots (sequences), longest query and key
// sequences and, backward, the packed totals its fp32 accumulators hold.
// Prepared graphs serve classes of buckets: buckets whose longest sequences
// round up (to a multiple of kGraphLengthStep) to the same lengths share a
// class, whose graph holds the largest batch of each of them. A batch goes
// to the class of the shortest limit (its buckets' longest real length)
// that holds its longest sequence, so that every batch of a bucket, whatever
// its lengths and count, takes the same graph: cuDNN's ragged offsets and
// sequence lengths carry the rest.
constexpr int64_t kGraphLengthStep = 16;

struct GraphShape {
  int64_t slots = 0, max_q = 0, max_kv = 0, total_q = 0, total_kv = 0;
  bool operator==(const GraphShape& o) const {
    return slots == o.slots && max_q == o.max_q && max_kv == o.max_kv && total_q == o.total_q &&
           total_kv == o.total_kv;
  }
};

// What else a graph is made for: the heads, the tensors' row strides (q's
// as the graph reads it) and the mask.
struct GraphLayout {
  int heads = 0, head_dim = 0, q_stride = 0, kv_stride = 0;
  bool causal = false;
  bool operator==(const GraphLayout& o) const {
    return heads == o.heads && head_dim == o.head_dim && q_stride == o.q_stride &&
           kv_stride == o.kv_stride && causal == o.causal;
  }
};

constexpr int64_t graph_length(int64_t longest) {
  const int64_t rounded = (longest + kGraphLengthStep - 1) / kGraphLengthStep * kGraphLengthStep;
  return std::max(rounded, kGraphLengthStep);
}

// The prepared classes of a run, by layout.
class PlannedShapes {
 public:
  struct Entry {
    GraphLayout layout;
    int64_t limit_q = 0, limit_kv = 0;  // the longest real lengths of the class's buckets
    GraphShape shape;                   // its graph's
  };

  // Adds the largest batch of a bucket to its class.
  void add(const GraphLayout& layout, const SideBound& q, const SideBound& k) {
    int64_t max_q = graph_length(q.longest), max_kv = graph_length(k.longest);
    if (layout.causal) max_q = max_kv = std::max(max_q, max_kv);
    Entry* entry = nullptr;
    for (Entry& e : entries_)
      if (e.layout == layout && e.shape.max_q == max_q && e.shape.max_kv == max_kv) entry = &e;
    if (!entry) {
      entries_.push_back(Entry{layout, 0, 0, GraphShape{0, max_q, max_kv, 1, 1}});
      entry = &entries_.back();
    }
    GraphShape& s = entry->shape;
    entry->limit_q = std::max<int64_t>(entry->limit_q, q.longest);
    entry->limit_kv = std::max<int64_t>(entry->limit_kv, k.longest);
    s.slots = std::max<int64_t>({s.slots, q.sequences, k.sequences});
    s.total_q = std::max(s.total_q, q.tokens);
    s.total_kv = std::max(s.total_kv, k.tokens);
  }

  // The class that serves a batch (host lengths): the one of its layout with
  // the shortest limits that hold its longest sequences; null when none
  // does, or that one is too small for the batch.
  const Entry* covering(const GraphLayout& layout, const Ragged& qs, const Ragged& ks) const {
    const Entry* best = nullptr;
    for (const Entry& e : entries_) {
      if (!(e.layout == layout) || e.limit_q < qs.max_len || e.limit_kv < ks.max_len) continue;
      if (best && (e.limit_q > best->limit_q ||
                   (e.limit_q == best->limit_q && e.limit_kv > best->limit_kv)))
        continue;
      best = &e;
    }
    if (!best) return nullptr;
    const GraphShape& s = best->shape;
    if (s.slots < std::max(qs.batch, ks.batch) || s.total_q < qs.total || s.total_kv < ks.total)
      return nullptr;
    return best;
  }

  // Adds the shape of the full batches of a class of one length on both
  // sides (SideBound::one_length) to those whose graph in the dense layout
  // is prepared (attention=dense); any other class is left out.
  void add_uniform(const GraphLayout& layout, const SideBound& q, const SideBound& k) {
    if (q.one_length <= 0 || k.one_length <= 0 || q.sequences != k.sequences) return;
    const int64_t n = q.sequences;
    const Uniform u{layout,
                    GraphShape{n, q.one_length, k.one_length, n * q.one_length, n * k.one_length}};
    if (!holds_uniform(u.layout, u.shape)) uniform_.push_back(u);
  }

  // Whether a batch of this exact shape (dense_shape) is a uniform class's.
  bool holds_uniform(const GraphLayout& layout, const GraphShape& shape) const {
    for (const Uniform& u : uniform_)
      if (u.layout == layout && u.shape == shape) return true;
    return false;
  }

  struct Uniform {
    GraphLayout layout;
    GraphShape shape;  // the batch's own
  };

  const std::vector<Entry>& entries() const { return entries_; }
  const std::vector<Uniform>& uniform() const { return uniform_; }

 private:
  std::vector<Entry> entries_;
  std::vector<Uniform> uniform_;
};

// A batch's own shape, unrounded: the dense layout's graph of a batch of
// equal lengths (qs, ks: host lengths).
inline GraphShape dense_shape(const Ragged& qs, const Ragged& ks) {
  return GraphShape{qs.batch, qs.max_len, ks.max_len, qs.total, ks.total};
}

}  // namespace mpiformer::cuda
