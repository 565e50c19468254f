#include "kernels/cuda/attention_cudnn_keys.h"

#include <algorithm>
#include <cstdio>

namespace mpiformer::cuda {

int64_t next_pow2(int64_t n, int64_t least) {
  int64_t p = least;
  while (p < n) p *= 2;
  return p;
}

// "backward bf16, 12 heads of 64, 8 slots, lengths 1024/1024".
std::string describe_key(const GraphKey& key) {
  return std::string(key.backward ? "backward " : "forward ") + (key.dense ? "dense " : "") +
         to_string(static_cast<DType>(key.dtype)) + ", " + std::to_string(key.heads) +
         " heads of " + std::to_string(key.head_dim) + ", " + std::to_string(key.slots) +
         " slots, lengths " + std::to_string(key.max_q) + "/" + std::to_string(key.max_kv);
}

std::string mib(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return text;
}

// What cuDNN's flash attention covers here; the rest runs on the plain
// kernels. Head sizes: multiples of 8 up to 256. A query that sees no key
// (an empty source) gives NaN rows before cuDNN 9.25: refused on the host.
// Returns why not, or "" when it does.
std::string unsupported_config(const AttentionConfig& cfg) {
  if (cfg.head_dim % 8 != 0 || cfg.head_dim > 256)
    return "head size " + std::to_string(cfg.head_dim) + " (cuDNN takes multiples of 8 up to 256)";
  return "";
}

std::string unsupported(const Ragged& qs, const Ragged& ks, const AttentionConfig& cfg) {
  if (std::string why = unsupported_config(cfg); !why.empty()) return why;
  if (qs.batch != ks.batch || qs.total == 0) return "an empty batch";
  for (int b = 0; b < qs.batch; ++b)
    if (qs.length(b) > 0 && ks.length(b) == 0) return "a query sequence with no keys";
  return "";
}

// q's token stride in the graph: a folded log-length factor makes a dense
// copy of q.
int q_stride_for(const AttentionConfig& cfg, int q_stride) {
  return cfg.scale == AttentionScale::kLogLength ? cfg.heads * cfg.head_dim : q_stride;
}

GraphLayout layout_of(const AttentionConfig& cfg, int q_stride, int kv_stride) {
  return GraphLayout{cfg.heads, cfg.head_dim, q_stride_for(cfg, q_stride), kv_stride, cfg.causal};
}

// An unprepared call's shape: the batch rounded up to powers of two, so that
// a few graphs serve the calls of a run that prepared none (a benchmark's
// shapes, a test's).
GraphShape rounded_shape(const Ragged& qs, const Ragged& ks, bool causal) {
  GraphShape shape;
  shape.slots = next_pow2(qs.batch, 8);
  shape.max_q = next_pow2(qs.max_len, 64);
  shape.max_kv = next_pow2(ks.max_len, 64);
  if (causal) shape.max_q = shape.max_kv = std::max(shape.max_q, shape.max_kv);
  shape.total_q = next_pow2(qs.total, 1024);
  shape.total_kv = next_pow2(ks.total, 1024);
  return shape;
}

// The key of a graph of `shape` for `layout`.
GraphKey key_of(bool backward, DType dtype, const GraphLayout& layout, const GraphShape& shape,
                bool deterministic) {
  GraphKey key{};
  key.backward = backward;
  key.dtype = static_cast<int>(dtype);
  key.heads = layout.heads;
  key.head_dim = layout.head_dim;
  key.q_stride = layout.q_stride;
  key.kv_stride = layout.kv_stride;
  key.causal = layout.causal;
  key.deterministic = backward && deterministic;
  key.slots = shape.slots;
  key.max_q = shape.max_q;
  key.max_kv = shape.max_kv;
  // The backward's fp32 accumulators are sized by these caps.
  key.total_q = backward ? shape.total_q : 0;
  key.total_kv = backward ? shape.total_kv : 0;
  return key;
}

bool equal_lengths(const Ragged& qs, const Ragged& ks) {
  return qs.batch > 0 && qs.batch == ks.batch && qs.total == int64_t{qs.batch} * qs.max_len &&
         ks.total == int64_t{ks.batch} * ks.max_len;
}

GraphKey dense_key_of(bool backward, DType dtype, const GraphLayout& layout,
                      const GraphShape& shape, bool deterministic) {
  GraphKey key = key_of(backward, dtype, layout, shape, deterministic);
  key.dense = 1;
  return key;
}

}  // namespace mpiformer::cuda
