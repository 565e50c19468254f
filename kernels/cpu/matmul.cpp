// Dense layers on OpenBLAS SGEMM (cpu::sgemm: the same bits for any thread count). Weights are
// stored (OC, IC) as in nn.Linear, so the forward pass multiplies by the transposed weight.
#include <algorithm>

#include "kernels/cpu/ops.h"

namespace mpiformer {
namespace {

// out (N, OC) rows ldo apart = x (N, IC) @ weight^T + bias, all fp32.
// batch_invariant: each row on cpu::row_gemm, the same bits in any batch
// (packed: the weight as cpu::pack_weights laid it out, or null).
void matmul_forward_f32(float* out, int ldo, const float* x, const float* weight, const float* bias,
                        int N, int IC, int OC, bool batch_invariant,
                        const float* packed = nullptr) {
  if (batch_invariant) {
    cpu::row_gemm(out, ldo, x, weight, bias, N, IC, OC, packed);
    return;
  }
  float beta = 0.0f;
  if (bias != nullptr) {
    // Seed out with the bias and let SGEMM add x @ W^T onto it (beta = 1):
    // one extra pass over out instead of a second pass after the GEMM.
    const bool threaded = cpu::worth_threading(static_cast<size_t>(N) * OC);
#pragma omp parallel for schedule(static) if (threaded)
    for (int i = 0; i < N; ++i) {
      float* row = out + static_cast<size_t>(i) * ldo;  // row: (OC)
      std::copy(bias, bias + OC, row);
    }
    beta = 1.0f;
  }
  if (IC == 0) {
    if (bias == nullptr)
      for (int i = 0; i < N; ++i) std::fill_n(out + static_cast<size_t>(i) * ldo, OC, 0.0f);
    return;
  }
  // out (N, OC) = x (N, IC) @ weight^T (IC, OC) [+ out]
  cpu::sgemm(false, true, N, OC, IC, 1.0f, x, IC, weight, IC, beta, out, ldo);
}

}  // namespace

namespace cpu {

void add_column_sums(float* sums, const float* rows, int N, int C, int ld) {
  constexpr int kColumnBlock = 64;  // columns per task
  const int blocks = (C + kColumnBlock - 1) / kColumnBlock;
  const bool threaded = worth_threading(static_cast<size_t>(N) * C);
#pragma omp parallel for schedule(static) if (threaded)
  for (int block = 0; block < blocks; ++block) {
    const int c0 = block * kColumnBlock;
    const int c1 = std::min(C, c0 + kColumnBlock);
    float block_sums[kColumnBlock] = {};
    for (int i = 0; i < N; ++i) {
      const float* row = rows + static_cast<size_t>(i) * ld;  // row: (C)
#pragma omp simd
      for (int c = c0; c < c1; ++c) block_sums[c - c0] += row[c];
    }
    for (int c = c0; c < c1; ++c) sums[c] += block_sums[c - c0];
  }
}

}  // namespace cpu

// What decoding may keep: packing a weight costs a pass over it on every
// call, as much as multiplying a few rows by it.
constexpr size_t kMaxPackedFloats = size_t{1} << 28;  // 1 GiB

void CpuOps::set_batch_invariant(bool on) {
  if (!on) {
    packed_weights_.clear();
    packed_floats_ = 0;
  }
  batch_invariant_ = on;
}

size_t CpuOps::batch_invariant_bytes(size_t weight_floats) const {
  // Packing pads each weight's outputs to 64: a little more than the weights.
  return std::min(weight_floats + weight_floats / 16, kMaxPackedFloats) * sizeof(float);
}

const float* CpuOps::packed_weight(const float* w, int K, int OC) {
  const auto found = packed_weights_.find(w);
  if (found != packed_weights_.end() && found->second.K == K && found->second.OC == OC)
    return found->second.floats.data();
  const size_t size = cpu::packed_weights_size(K, OC);
  if (found != packed_weights_.end()) {
    packed_floats_ -= found->second.floats.size();
    packed_weights_.erase(found);
  }
  if (packed_floats_ + size > kMaxPackedFloats) return nullptr;  // packed call by call
  Packed& kept = packed_weights_[w];
  kept.K = K;
  kept.OC = OC;
  kept.floats.resize(size);
  cpu::pack_weights(kept.floats.data(), w, K, OC);
  packed_floats_ += size;
  return kept.floats.data();
}

void CpuOps::matmul_forward(Act out, Act x, Act weight, Act bias, int N, int IC, int OC,
                            const FusedActivation& fused, int out_stride) {
  if (N == 0 || OC == 0) return;
  Fp32 f(*this);
  const float* xf = f.in(x, static_cast<size_t>(N) * IC);
  const float* w = f.in(weight, static_cast<size_t>(OC) * IC);
  const float* b = f.in(bias, OC);
  const size_t n = static_cast<size_t>(N) * OC;
  const int ldo = out_stride > 0 ? out_stride : OC;
  // An fp32 weight is itself (not a widened copy): its packing can be kept.
  const float* packed = batch_invariant_ && w == weight.data ? packed_weight(w, IC, OC) : nullptr;
  if (!fused.pre) {
    matmul_forward_f32(f.out(out, N, ldo, OC), ldo, xf, w, b, N, IC, OC, batch_invariant_, packed);
    return;
  }
  // The activation reads the fp32 pre-activation, not its rounded copy.
  // pre is dense (N, OC); out keeps its row stride.
  float* pre = f.out(fused.pre, n);
  matmul_forward_f32(pre, OC, xf, w, b, N, IC, OC, batch_invariant_, packed);
  if (ldo == OC) {
    cpu::activation_forward(f.out(out, n), pre, n, fused.act);
    return;
  }
  float* y = f.out(out, N, ldo, OC);
  for (int i = 0; i < N; ++i) {
    cpu::activation_forward(y + static_cast<size_t>(i) * ldo, pre + static_cast<size_t>(i) * OC, OC,
                            fused.act);
  }
}

void CpuOps::matmul_backward(Act dx, float* dweight, float* dbias, Act dout, Act x, Act weight,
                             int N, int IC, int OC, bool accumulate, const FusedActivation& fused,
                             int dout_stride) {
  if (N == 0) return;
  const size_t nx = static_cast<size_t>(N) * IC;
  {
    Fp32 f(*this);
    const int ldd = dout_stride > 0 ? dout_stride : OC;
    const float* dy = f.in(dout, N, ldd, OC);
    const float* xf = f.in(x, nx);
    const float* w = f.in(weight, static_cast<size_t>(OC) * IC);
    const float* pre = f.in(fused.pre, nx);
    float* d = !dx ? nullptr : (accumulate ? f.inout(dx, nx) : f.out(dx, nx));
    matmul_backward_f32(d, dweight, dbias, dy, ldd, xf, w, N, IC, OC, accumulate);
    if (d && pre) cpu::activation_backward(d, d, pre, nx, fused.act);
  }
  if (fused.pre_bias_grad && dx) {
    // The sums of dx as stored (rounded, in bf16), as the previous layer's
    // weight gradient would take them from it: the same bits either way.
    Fp32 f(*this);
    cpu::add_column_sums(fused.pre_bias_grad, f.in(dx, nx), N, IC, IC);
  }
}

void CpuOps::matmul_backward_f32(float* dx, float* dweight, float* dbias, const float* dout,
                                 int ldd, const float* x, const float* weight, int N, int IC,
                                 int OC, bool accumulate) {
  if (N == 0) return;
  if (dx != nullptr) {
    if (OC == 0) {
      if (!accumulate) std::fill(dx, dx + static_cast<size_t>(N) * IC, 0.0f);
    } else {
      // dx (N, IC) = dout (N, OC) @ weight (OC, IC) [+ dx]
      cpu::sgemm(false, false, N, IC, OC, 1.0f, dout, ldd, weight, IC, accumulate ? 1.0f : 0.0f, dx,
                 IC);
    }
  }
  if (OC == 0) return;
  if (IC > 0) {
    // dweight (OC, IC) += dout^T (OC, N) @ x (N, IC)
    cpu::sgemm(true, false, OC, IC, N, 1.0f, dout, ldd, x, IC, 1.0f, dweight, IC);
  }
  if (dbias != nullptr) cpu::add_column_sums(dbias, dout, N, OC, ldd);
}

}  // namespace mpiformer
