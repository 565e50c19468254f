// The keys of cuDNN's attention graphs and the checks that need no cuDNN:
// what a graph is built for, how a batch's shape rounds to one, and what
// cuDNN's fused attention covers (kernels/cuda/attention_cudnn.cpp, the one
// file that includes the cuDNN frontend, builds the graphs).
#pragma once

#include <cstdint>
#include <string>

#include "kernels/cuda/attention_plan.h"
#include "kernels/ops.h"

namespace mpiformer::cuda {

// What a graph is built for; batches that round to the same key share it.
struct GraphKey {
  // deterministic: backward without atomics in dQ (--deterministic true)
  int backward, dtype, heads, head_dim, q_stride, kv_stride, causal, deterministic;
  int64_t slots, max_q, max_kv, total_q, total_kv;
  // dense: a batch of equal lengths in the plain (b, s, h, d) layout, no
  // ragged offsets or padding mask (MPIFORMER_KERNELS=attention=dense);
  // the shape is then the batch's own. (64 bits: the key has no padding.)
  int64_t dense;
  std::string text() const {
    return std::string(reinterpret_cast<const char*>(this), sizeof *this);
  }
};

// The least power-of-two multiple of `least` that holds n.
int64_t next_pow2(int64_t n, int64_t least);

// "backward bf16, 12 heads of 64, 8 slots, lengths 1024/1024".
std::string describe_key(const GraphKey& key);

// "12.5 MiB".
std::string mib(int64_t bytes);

// What cuDNN's flash attention covers here; the rest runs on the plain
// kernels. Head sizes: multiples of 8 up to 256. A query that sees no key
// (an empty source) gives NaN rows before cuDNN 9.25: refused on the host.
// Returns why not, or "" when it does.
std::string unsupported_config(const AttentionConfig& cfg);

// As unsupported_config, for a batch too: none empty, every query with keys.
std::string unsupported(const Ragged& qs, const Ragged& ks, const AttentionConfig& cfg);

// q's token stride in the graph: a folded log-length factor makes a dense
// copy of q.
int q_stride_for(const AttentionConfig& cfg, int q_stride);

// The layout a call of `cfg` with these row strides builds its graphs for.
GraphLayout layout_of(const AttentionConfig& cfg, int q_stride, int kv_stride);

// An unprepared call's shape: the batch rounded up to powers of two, so that
// a few graphs serve the calls of a run that prepared none (a benchmark's
// shapes, a test's).
GraphShape rounded_shape(const Ragged& qs, const Ragged& ks, bool causal);

// The key of a graph of `shape` for `layout`.
GraphKey key_of(bool backward, DType dtype, const GraphLayout& layout, const GraphShape& shape,
                bool deterministic);

// Whether a batch's sequences all have its longest length, on both sides:
// what the dense layout takes.
bool equal_lengths(const Ragged& qs, const Ragged& ks);

// The key of the dense graph of such a batch: its own shape, unrounded
// (dense_shape).
GraphKey dense_key_of(bool backward, DType dtype, const GraphLayout& layout,
                      const GraphShape& shape, bool deterministic);

}  // namespace mpiformer::cuda
