// The batch-invariant GEMM of decoding (Ops::set_batch_invariant).
//
// OpenBLAS's bits for one row of a product depend on the rows beside it:
// measured with 0.3.21, a row computed alone, among 16 or among 128 gives
// different last bits, and on its Haswell and Zen kernels so does the place
// of a row inside a block of 16. Decoding one sentence at a time, many at a
// time or without a cache must give the same tokens, so here every row runs
// through the same code whatever the call holds: rows go in blocks of
// kBlockRows (a short block repeats its last row and drops the copies), and
// each output sums its K products in kLanes partial sums (k mod kLanes)
// added in a fixed tree at the end.
#include <algorithm>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/vec_math.h"

namespace mpiformer::cpu {
namespace {

constexpr int kLanes = 16;
constexpr int kBlockRows = 4;
constexpr int kOutputsPerTask = 64;

// outs[r][o - o0] = xs[r] . w[o] + bias[o] for the kBlockRows rows xs and
// the outputs [o0, o1).  xs[r]: (K), w: (OC, K), outs[r]: (o1 - o0)
MPIFORMER_HOT void block_of_rows(float* const* outs, const float* const* xs, const float* w,
                                 const float* bias, int K, int o0, int o1) {
  for (int o = o0; o < o1; ++o) {
    const float* wo = w + static_cast<size_t>(o) * K;  // (K)
    float acc[kBlockRows][kLanes] = {};
    int k0 = 0;
    for (; k0 + kLanes <= K; k0 += kLanes) {
      for (int r = 0; r < kBlockRows; ++r) {
        for (int l = 0; l < kLanes; ++l) acc[r][l] += xs[r][k0 + l] * wo[k0 + l];
      }
    }
    for (int r = 0; r < kBlockRows; ++r) {
      for (int l = 0; k0 + l < K; ++l) acc[r][l] += xs[r][k0 + l] * wo[k0 + l];
      for (int width = kLanes / 2; width > 0; width /= 2) {
        for (int l = 0; l < width; ++l) acc[r][l] += acc[r][l + width];
      }
      outs[r][o - o0] = acc[r][0] + (bias ? bias[o] : 0.0f);
    }
  }
}

}  // namespace

void row_gemm(float* out, int ldo, const float* x, const float* w, const float* bias, int N, int K,
              int OC) {
  if (N <= 0 || OC <= 0) return;
  const int tasks = (OC + kOutputsPerTask - 1) / kOutputsPerTask;
  const bool threaded =
      tasks > 1 && worth_threading(static_cast<size_t>(N) * OC * std::max(K, 1) / 64);
  // A task takes a run of outputs over every row: its weights stay in cache.
#pragma omp parallel for schedule(dynamic, 1) if (threaded)
  for (int task = 0; task < tasks; ++task) {
    const int o0 = task * kOutputsPerTask;
    const int o1 = std::min(OC, o0 + kOutputsPerTask);
    float spare[kBlockRows - 1][kOutputsPerTask];  // the dropped copies of a short block
    for (int i0 = 0; i0 < N; i0 += kBlockRows) {
      const float* xs[kBlockRows];
      float* outs[kBlockRows];
      for (int r = 0; r < kBlockRows; ++r) {
        const int i = std::min(i0 + r, N - 1);
        xs[r] = x + static_cast<size_t>(i) * K;
        outs[r] = i0 + r < N ? out + static_cast<size_t>(i) * ldo + o0 : spare[r - 1];
      }
      block_of_rows(outs, xs, w, bias, K, o0, o1);
    }
  }
}

}  // namespace mpiformer::cpu
