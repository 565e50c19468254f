// Flash-style attention in plain C++ on the tiling of
// kernels/attention_tiling.h: the twin of the CUDA flash kernels
// (kernels/cuda/attention_flash.cu), with the same tiles, loop order and
// recurrences, so that the tiling is tested against CpuOps's attention
// where no GPU is. fp32 on host memory; the contract of
// Ops::attention_forward and Ops::attention_backward (kernels/ops.h).
//
// Each (tile, head) is a task of its own, as each is a CUDA block: tasks run
// on OpenMP threads and a task's sums are its own, so the bits do not
// depend on the thread count.
//
// A twin for tests, not the CPU backend's attention: its loops are scalar
// where CpuOps's run on serial SGEMMs, and on 2 cores (fp32, 16 sequences
// of 128, H 12, D 64) it took 5x the time forward and 6-12x backward. The
// CPU keeps no score matrix larger than a sequence's per thread anyway.
#pragma once

#include "kernels/ops.h"

namespace mpiformer::cpu {

// out: (Nq, H*D) dense, stats: (Nq, H); q: (Nq, H*D) rows q_stride apart;
// k, v: (Nk, H*D) rows kv_stride apart. qs, ks: host offsets.
void tiled_attention_forward(float* out, float* stats, const float* q, int q_stride, const float* k,
                             const float* v, int kv_stride, const Ragged& qs, const Ragged& ks,
                             const AttentionConfig& cfg);

// dq: (Nq, H*D) stride q_stride; dk, dv: (Nk, H*D) stride kv_stride; all
// written (=), columns outside each head's slice untouched. dout, out:
// (Nq, H*D) dense; stats: (Nq, H) from the forward.
void tiled_attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                              const float* stats, const float* q, int q_stride, const float* k,
                              const float* v, int kv_stride, const Ragged& qs, const Ragged& ks,
                              const AttentionConfig& cfg);

}  // namespace mpiformer::cpu
