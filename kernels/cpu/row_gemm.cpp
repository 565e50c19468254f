// The batch-invariant GEMM of decoding (Ops::set_batch_invariant).
//
// OpenBLAS's bits for one row of a product depend on the rows beside it:
// measured with 0.3.21, a row computed alone, among 16 or among 128 gives
// different last bits, and on its Haswell and Zen kernels so does the place
// of a row inside a block of 16. Decoding one sentence at a time, many at a
// time or without a cache must give the same tokens, so here every row runs
// through the same arithmetic whatever the call holds: each output is the
// K products added in order k = 0, 1, ..., K - 1, then its bias, by the
// same instructions for every row. A row's sums live in registers of its
// own, so neither the rows beside it nor how many there are touch them.
//
// The speed comes from a register block: up to kBlockRows rows times kPanel
// outputs, with the weights of a task's kOutputsPerTask outputs first packed
// k-major, so each step over k loads kPanel weights once for all the rows
// and each row's input once for all the outputs.
#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/vec_math.h"

namespace mpiformer::cpu {
namespace {

constexpr int kBlockRows = 6;
constexpr int kPanel = 16;           // outputs of one register block: two vectors of 8
constexpr int kOutputsPerTask = 64;  // outputs whose packed weights a task shares
constexpr int kPanelsPerTask = kOutputsPerTask / kPanel;

typedef float Vec8 __attribute__((vector_size(32)));

// to[i * kPanel + j] = rows[j][i] for 8 rows j and 8 columns i: an 8x8
// transpose in registers.  rows[j]: (8), to: (8, kPanel)
__attribute__((always_inline)) inline void transpose_8x8(float* to, const float* const* rows) {
  Vec8 r[8];
  for (int j = 0; j < 8; ++j) std::memcpy(&r[j], rows[j], sizeof(Vec8));
  // Pairs of rows interleaved, then pairs of pairs, then the 128-bit halves.
  Vec8 t[8], u[8];
  for (int j = 0; j < 8; j += 2) {
    t[j] = __builtin_shufflevector(r[j], r[j + 1], 0, 8, 1, 9, 4, 12, 5, 13);
    t[j + 1] = __builtin_shufflevector(r[j], r[j + 1], 2, 10, 3, 11, 6, 14, 7, 15);
  }
  for (int j = 0; j < 8; j += 4) {
    u[j] = __builtin_shufflevector(t[j], t[j + 2], 0, 1, 8, 9, 4, 5, 12, 13);
    u[j + 1] = __builtin_shufflevector(t[j], t[j + 2], 2, 3, 10, 11, 6, 7, 14, 15);
    u[j + 2] = __builtin_shufflevector(t[j + 1], t[j + 3], 0, 1, 8, 9, 4, 5, 12, 13);
    u[j + 3] = __builtin_shufflevector(t[j + 1], t[j + 3], 2, 3, 10, 11, 6, 7, 14, 15);
  }
  for (int i = 0; i < 4; ++i) {
    const Vec8 low = __builtin_shufflevector(u[i], u[i + 4], 0, 1, 2, 3, 8, 9, 10, 11);
    const Vec8 high = __builtin_shufflevector(u[i], u[i + 4], 4, 5, 6, 7, 12, 13, 14, 15);
    std::memcpy(to + i * kPanel, &low, sizeof low);
    std::memcpy(to + (i + 4) * kPanel, &high, sizeof high);
  }
}

// packed (kPanelsPerTask, K, kPanel) = the weights of outputs [o0, o1),
// panel p holding outputs o0 + p*kPanel + j at [p][k][j]; outputs past o1
// are zero.  w: (OC, K)
MPIFORMER_HOT void pack_task(float* packed, const float* w, int K, int o0, int o1) {
  for (int p = 0; p < kPanelsPerTask; ++p) {
    float* panel = packed + static_cast<size_t>(p) * K * kPanel;  // (K, kPanel)
    for (int j0 = 0; j0 < kPanel; j0 += 8) {
      const int first = o0 + p * kPanel + j0, count = std::clamp(o1 - first, 0, 8);
      const float* rows[8];  // each output's weights, (K)
      for (int j = 0; j < count; ++j) rows[j] = w + static_cast<size_t>(first + j) * K;
      int k = 0;
      if (count == 8) {
        for (; k + 8 <= K; k += 8) {
          const float* at[8];
          for (int j = 0; j < 8; ++j) at[j] = rows[j] + k;
          transpose_8x8(panel + static_cast<size_t>(k) * kPanel + j0, at);
        }
      }
      for (; k < K; ++k) {
        float* to = panel + static_cast<size_t>(k) * kPanel + j0;
        for (int j = 0; j < 8; ++j) to[j] = j < count ? rows[j][k] : 0.0f;
      }
    }
  }
}

// outs[r][j] = bias[j] + sum over k of xs[r][k] * panel[k][j], for the
// Rows rows xs and the first `count` of the panel's outputs. A row's
// arithmetic is its own: the same bits for any Rows.
// xs[r]: (K), panel: (K, kPanel), outs[r]: (count), bias: (count) or null
template <int Rows>
MPIFORMER_HOT void block_of_rows(float* const* outs, const float* const* xs, const float* panel,
                                 const float* bias, int K, int count) {
  Vec8 acc[Rows][2] = {};
  for (int k = 0; k < K; ++k) {
    Vec8 w0, w1;
    std::memcpy(&w0, panel + static_cast<size_t>(k) * kPanel, sizeof w0);
    std::memcpy(&w1, panel + static_cast<size_t>(k) * kPanel + 8, sizeof w1);
    for (int r = 0; r < Rows; ++r) {
      const float x = xs[r][k];
      acc[r][0] += x * w0;
      acc[r][1] += x * w1;
    }
  }
  if (count == kPanel) {
    Vec8 b0 = {}, b1 = {};
    if (bias) {
      std::memcpy(&b0, bias, sizeof b0);
      std::memcpy(&b1, bias + 8, sizeof b1);
    }
    for (int r = 0; r < Rows; ++r) {
      const Vec8 y0 = bias ? acc[r][0] + b0 : acc[r][0];
      const Vec8 y1 = bias ? acc[r][1] + b1 : acc[r][1];
      std::memcpy(outs[r], &y0, sizeof y0);
      std::memcpy(outs[r] + 8, &y1, sizeof y1);
    }
    return;
  }
  for (int r = 0; r < Rows; ++r) {
    for (int j = 0; j < count; ++j) {
      const float sum = acc[r][j / 8][j % 8];
      outs[r][j] = bias ? sum + bias[j] : sum;
    }
  }
}

// block_of_rows<rows> by its row count.
using BlockKernel = void (*)(float* const*, const float* const*, const float*, const float*, int,
                             int);
const BlockKernel kBlocks[kBlockRows + 1] = {nullptr,          block_of_rows<1>, block_of_rows<2>,
                                             block_of_rows<3>, block_of_rows<4>, block_of_rows<5>,
                                             block_of_rows<6>};

int tasks_of(int OC) {
  return (OC + kOutputsPerTask - 1) / kOutputsPerTask;
}

}  // namespace

size_t packed_weights_size(int K, int OC) {
  return static_cast<size_t>(tasks_of(OC)) * kOutputsPerTask * K;
}

void pack_weights(float* packed, const float* w, int K, int OC) {
  const int tasks = tasks_of(OC);
#pragma omp parallel for schedule( \
    dynamic, 1) if (tasks > 1 && worth_threading(static_cast <size_t>(OC) * K))
  for (int task = 0; task < tasks; ++task) {
    const int o0 = task * kOutputsPerTask;
    pack_task(packed + static_cast<size_t>(o0) * K, w, K, o0, std::min(OC, o0 + kOutputsPerTask));
  }
}

void row_gemm(float* out, int ldo, const float* x, const float* w, const float* bias, int N, int K,
              int OC, const float* packed) {
  if (N <= 0 || OC <= 0) return;
  const int tasks = tasks_of(OC);
  const bool threaded =
      tasks > 1 && worth_threading(static_cast<size_t>(N) * OC * std::max(K, 1) / 64);
  // A task takes a run of outputs' packed weights over every row: they stay
  // in cache. Without `packed` it packs them first.
#pragma omp parallel if (threaded)
  {
    // (panels, K, kPanel); kept by the thread from call to call: no
    // allocation (and no page faults) per call.
    thread_local std::vector<float> own;
    if (!packed && own.size() < static_cast<size_t>(kOutputsPerTask) * K)
      own.resize(static_cast<size_t>(kOutputsPerTask) * K);
#pragma omp for schedule(dynamic, 1)
    for (int task = 0; task < tasks; ++task) {
      const int o0 = task * kOutputsPerTask;
      const int o1 = std::min(OC, o0 + kOutputsPerTask);
      const float* panels = packed ? packed + static_cast<size_t>(o0) * K : own.data();
      if (!packed) pack_task(own.data(), w, K, o0, o1);
      for (int i0 = 0; i0 < N; i0 += kBlockRows) {
        const int rows = std::min(kBlockRows, N - i0);
        const float* xs[kBlockRows];
        for (int r = 0; r < rows; ++r) xs[r] = x + static_cast<size_t>(i0 + r) * K;
        for (int p0 = o0; p0 < o1; p0 += kPanel) {
          float* outs[kBlockRows];
          for (int r = 0; r < rows; ++r) outs[r] = out + static_cast<size_t>(i0 + r) * ldo + p0;
          const float* panel = panels + static_cast<size_t>(p0 - o0) * K;  // (K, kPanel)
          const float* b = bias ? bias + p0 : nullptr;
          const int count = std::min(kPanel, o1 - p0);
          kBlocks[rows](outs, xs, panel, b, K, count);
        }
      }
    }
  }
}

}  // namespace mpiformer::cpu
