// SGEMM whose bits do not depend on the thread count.
//
// OpenBLAS splits a GEMM over its threads in ways that change the rounding
// (measured with 0.3.21: 1, 2, 3 and 4 threads give four different results
// for a 64 x 64 x 512 product). So BLAS always runs on one thread here, and
// the parallel product cuts C into tiles whose size is fixed: each tile is
// one single-threaded call, the same call whichever thread runs it, so any
// --threads gives the same bits (docs/DESIGN.md section 6).
#include <cblas.h>
#include <omp.h>

#include <algorithm>

#include "kernels/cpu/ops.h"

namespace mpiformer::cpu {
namespace {

// Tile of C per task. Large enough that packing stays a small share of a
// tile's work, small enough that a d_model-256 layer has several tiles.
constexpr int kTileRows = 128;
constexpr int kTileCols = 256;

}  // namespace

void sgemm_serial(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                  int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  const CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans;
  const CBLAS_TRANSPOSE tb = trans_b ? CblasTrans : CblasNoTrans;
  // OpenBLAS's OpenMP build threads a call made outside a parallel region
  // over omp_get_max_threads(); its other builds were set to one thread
  // by make_cpu_ops.
  const int pool = omp_get_max_threads();
  if (omp_in_parallel() || pool == 1) {
    cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  omp_set_num_threads(1);
  cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  omp_set_num_threads(pool);
}

void sgemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
           const float* B, int ldb, float beta, float* C, int ldc) {
  if (M == 0 || N == 0) return;
  const int row_tiles = (M + kTileRows - 1) / kTileRows;
  const int col_tiles = (N + kTileCols - 1) / kTileCols;
  const int tiles = row_tiles * col_tiles;
  const bool threaded = tiles > 1 && worth_threading(static_cast<size_t>(M) * N * K / 64);
#pragma omp parallel for schedule(dynamic, 1) if (threaded)
  for (int tile = 0; tile < tiles; ++tile) {
    const int i0 = (tile / col_tiles) * kTileRows;
    const int j0 = (tile % col_tiles) * kTileCols;
    const int rows = std::min(kTileRows, M - i0);
    const int cols = std::min(kTileCols, N - j0);
    // Row-major: op(A) rows i0.. are A's rows (no transpose) or columns.
    const float* a = trans_a ? A + i0 : A + static_cast<size_t>(i0) * lda;
    const float* b = trans_b ? B + static_cast<size_t>(j0) * ldb : B + j0;
    float* c = C + static_cast<size_t>(i0) * ldc + j0;  // (rows, cols) ld ldc
    sgemm_serial(trans_a, trans_b, rows, cols, K, alpha, a, lda, b, ldb, beta, c, ldc);
  }
}

}  // namespace mpiformer::cpu
