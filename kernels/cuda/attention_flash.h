// The CUDA backend's flash attention for its plain path (attention.cu):
// FlashAttention-2's tiling in fp32, bf16 and fp16 for head sizes up to
// 128, on tensor cores for bf16 and fp16 heads up to 64
// (attention_flash_mma_kernels.cuh: mma.sync, fp32 accumulation) and on
// CUDA cores otherwise (attention_flash_kernels.cuh: fp32 throughout, no
// TF32). Unlike the naive kernels it keeps no score matrix in global
// memory: backward recomputes each tile of P from the forward's
// log-sum-exp. No float atomics: deterministic.
//
// Scratch, given by the caller (CudaOps's slots): the tile starts of both
// sides, 2 (B+1) int32 (forward and backward), and delta = rowsum(dO * O),
// (Nq, H) fp32 (backward). Nothing is copied from the host and nothing
// waits for the stream.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/ops.h"

namespace mpiformer::cuda {

// MPIFORMER_PLAIN_ATTENTION: flash (or unset) or naive. Throws
// std::runtime_error on another value.
PlainAttention plain_attention_from_environment();

// Whether the flash kernels take heads of head_dim on the current device:
// up to 128, where the device has the shared memory they ask for.
bool flash_attention_covers(int head_dim);

// Bytes of the tile starts for a batch of `batch` sequences.
size_t flash_attention_tiles_bytes(int batch);
// Bytes of delta for `tokens` query rows.
size_t flash_attention_delta_bytes(size_t tokens, int heads);
// The most scratch of a call on `tokens` packed query rows (for
// Ops::attention_scratch_bytes): delta, and tile starts for at most
// `tokens` non-empty sequences.
size_t flash_attention_scratch_bytes(size_t tokens, const AttentionConfig& cfg, bool backward);

// Ops::attention_forward's contract. tiles: device scratch of
// flash_attention_tiles_bytes(qs.batch)
void flash_attention_forward(Act out, float* stats, Act q, int q_stride, Act k, Act v,
                             int kv_stride, const Ragged& qs, const Ragged& ks,
                             const AttentionConfig& cfg, int32_t* tiles, cudaStream_t stream);

// Ops::attention_backward's contract. tiles: as above; delta: device
// scratch of flash_attention_delta_bytes(qs.total, cfg.heads)
void flash_attention_backward(Act dq, Act dk, Act dv, Act dout, Act out, const float* stats, Act q,
                              int q_stride, Act k, Act v, int kv_stride, const Ragged& qs,
                              const Ragged& ks, const AttentionConfig& cfg, int32_t* tiles,
                              float* delta, cudaStream_t stream);

}  // namespace mpiformer::cuda
