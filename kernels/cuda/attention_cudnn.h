// cuDNN's fused flash attention (SDPA) on packed ragged sequences, through
// the cuDNN frontend's graph API (attention_cudnn.cpp): causal and
// bidirectional self-attention and cross-attention, forward and backward,
// bf16 or fp16 with fp32 softmax statistics. Graphs are built per shape
// class on first use and cached. The log-length scale, a per-query factor
// f_i = ln(n_i) / ln(ref), is folded exactly into q before the call and into
// dq after it; cuDNN itself only sees 1/sqrt(D).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cuda/attention_plan.h"
#include "kernels/ops.h"

namespace mpiformer {

class CudaOps;

namespace cuda {

class FlashAttention {
 public:
  // Null when cuDNN cannot run here, with the reason in *why_not: the build
  // has no cuDNN frontend, or the cuDNN found is too old.
  static std::unique_ptr<FlashAttention> create(CudaOps& ops, std::string* why_not);
  // Whether this build has the cuDNN frontend.
  static bool built();
  // Whether the cuDNN loaded runs the dense layout (attention=dense): 9.12
  // or newer, as older ones refuse its forward's stats in (N, H) rows.
  static bool takes_dense_layout();
  // Describes the graphs of representative cases (causal and bidirectional
  // self-attention on a fused QKV tensor, with and without a folded q,
  // cross-attention; bf16 and fp16; forward and backward) for a GPU of
  // compute capability `sm` and runs the frontend's validation, which needs
  // no GPU. Returns one line per graph that fails (empty: all valid).
  static std::vector<std::string> validate_graphs(int sm);
  virtual ~FlashAttention() = default;

  // The ops of kernels/ops.h. Return false, having done nothing, when
  // cuDNN cannot run the case (a head size or layout it does not support,
  // a workspace over attention_workspace_budget, attention_plan.h;
  // refusal() says which); the caller then runs
  // the plain kernels. Throw on a cuDNN failure.
  virtual bool forward(Act out, float* stats, Act q, int q_stride, Act k, Act v, int kv_stride,
                       const Ragged& qs, const Ragged& ks, const AttentionConfig& cfg) = 0;
  virtual bool backward(Act dq, Act dk, Act dv, Act dout, Act out, const float* stats, Act q,
                        int q_stride, Act k, Act v, int kv_stride, const Ragged& qs,
                        const Ragged& ks, const AttentionConfig& cfg) = 0;
  // Why the last call returned false.
  virtual const std::string& refusal() const = 0;
  // attention_plan=timed: what the graphs' plan searches found
  // (attention_search::Tally::describe), or empty.
  virtual std::string search_summary() const = 0;
  // Graphs held (prepared and built on first use; bounded).
  virtual int64_t graphs() const = 0;
  // Ops::prepare_attention: builds the graphs of the run's classes of
  // batches (attention_plan.h's PlannedShapes) and reserves the largest
  // workspace. Throws std::runtime_error when the device cannot hold it.
  virtual AttentionPreparation prepare(const std::vector<AttentionCase>& cases, DType dtype,
                                       bool backward) = 0;
  // "cuDNN 9.14.0, frontend 1.32.0".
  virtual std::string version() const = 0;
};

// Kernels the cuDNN path needs (attention.cu), on `stream`.

// Fills the metadata from the batch's token offsets (device (B+1) each).
// q_stride, kv_stride, o_stride, stats_stride: the tensors' token strides.
void launch_attention_meta(const AttentionMeta& meta, const int32_t* q_offsets,
                           const int32_t* k_offsets, int batch, int slots, int64_t q_stride,
                           int64_t kv_stride, int64_t o_stride, int64_t stats_stride,
                           cudaStream_t stream);

// Log-length folding: dst[row, c] = src[row, c] * f(row), c < H*D, where
// f = ln(n) / ln(ref) for the n keys the query sees (0 when n <= 1): the
// per-query part of the log-length scale. dst may be src (in place).
void launch_scale_queries(Act dst, int dst_stride, Act src, int src_stride, const Ragged& qs,
                          const Ragged& ks, const AttentionConfig& cfg, cudaStream_t stream);

// The statistics of a batch of `batch` sequences of `length` in the packed
// (B, H, S) layout that cuDNN's dense backward reads (before 9.26), from
// the (N, H) rows the other kernels keep.  packed, stats: (N * H)
void launch_pack_stats(float* packed, const float* stats, int batch, int length, int heads,
                       cudaStream_t stream);

}  // namespace cuda
}  // namespace mpiformer
