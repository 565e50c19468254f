// Dense layers on OpenBLAS SGEMM. Weights are stored (OC, IC) as in
// nn.Linear, so the forward pass multiplies by the transposed weight.
#include <cblas.h>

#include <algorithm>

#include "kernels/cpu/cpu_ops.h"

namespace mpiformer {
namespace {

// Columns per task of the bias-gradient reduction.
constexpr int kColumnBlock = 64;

}  // namespace

void CpuOps::matmul_forward(float* out, const float* x, const float* weight, const float* bias,
                            int N, int IC, int OC) {
  if (N == 0 || OC == 0) return;
  float beta = 0.0f;
  if (bias != nullptr) {
    // Seed out with the bias and let SGEMM add x @ W^T onto it (beta = 1):
    // one extra pass over out instead of a second pass after the GEMM.
    const bool threaded = cpu::worth_threading(static_cast<size_t>(N) * OC);
#pragma omp parallel for schedule(static) if (threaded)
    for (int i = 0; i < N; ++i) {
      float* row = out + static_cast<size_t>(i) * OC;  // row: (OC)
      std::copy(bias, bias + OC, row);
    }
    beta = 1.0f;
  }
  if (IC == 0) {
    if (bias == nullptr) std::fill(out, out + static_cast<size_t>(N) * OC, 0.0f);
    return;
  }
  // out (N, OC) = x (N, IC) @ weight^T (IC, OC) [+ out]
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, IC, 1.0f, x, IC, weight, IC, beta,
              out, OC);
}

void CpuOps::matmul_backward(float* dx, float* dweight, float* dbias, const float* dout,
                             const float* x, const float* weight, int N, int IC, int OC,
                             bool accumulate) {
  if (N == 0) return;
  if (dx != nullptr) {
    if (OC == 0) {
      if (!accumulate) std::fill(dx, dx + static_cast<size_t>(N) * IC, 0.0f);
    } else {
      // dx (N, IC) = dout (N, OC) @ weight (OC, IC) [+ dx]
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, IC, OC, 1.0f, dout, OC, weight, IC,
                  accumulate ? 1.0f : 0.0f, dx, IC);
    }
  }
  if (OC == 0) return;
  if (IC > 0) {
    // dweight (OC, IC) += dout^T (OC, N) @ x (N, IC)
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, IC, N, 1.0f, dout, OC, x, IC, 1.0f,
                dweight, IC);
  }
  if (dbias != nullptr) {
    // Column sums of dout: threads split the columns, rows are summed in order.
    const int blocks = (OC + kColumnBlock - 1) / kColumnBlock;
    const bool threaded = cpu::worth_threading(static_cast<size_t>(N) * OC);
#pragma omp parallel for schedule(static) if (threaded)
    for (int block = 0; block < blocks; ++block) {
      const int c0 = block * kColumnBlock;
      const int c1 = std::min(OC, c0 + kColumnBlock);
      float sums[kColumnBlock] = {};
      for (int i = 0; i < N; ++i) {
        const float* row = dout + static_cast<size_t>(i) * OC;  // row: (OC)
#pragma omp simd
        for (int c = c0; c < c1; ++c) sums[c - c0] += row[c];
      }
      for (int c = c0; c < c1; ++c) dbias[c] += sums[c - c0];
    }
  }
}

}  // namespace mpiformer
