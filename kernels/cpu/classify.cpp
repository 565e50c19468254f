// The classifier's ops: pooling a sequence's rows into one vector, and the
// multi-label ZLPR loss fused with its gradient. Both are small next to the
// encoder they sit on, so they are written for clarity; the loss works in
// double throughout, as it must stay exact at scores of any size.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/ops.h"

namespace mpiformer {
namespace {

struct ZlprRow {
  double loss = 0.0;
  bool correct = false;  // predicted set == true set
};

// log(e^0 + sum_j e^{terms[j]}) without overflow: the 0 bounds the max from
// below, so the sum of exponentials is in [1, count + 1].  terms: (count)
double log_one_plus_sum_exp(const double* terms, int count) {
  double top = 0.0;
  for (int j = 0; j < count; ++j) top = std::max(top, terms[j]);
  double sum = std::exp(-top);
  for (int j = 0; j < count; ++j) sum += std::exp(terms[j] - top);
  return top + std::log(sum);
}

// One row: loss = A + B with
//   A = log(1 + sum_{t_i < 1} e^{s_i + log(1 - t_i)}),
//   B = log(1 + sum_{t_i > 0} e^{-s_i + log t_i}).
// Labels with weight 0 leave their term out (log 0 is not taken). With
// compute_grad the row becomes ((1-t_i) e^{s_i - A} - t_i e^{-s_i - B}) *
// grad_scale, each factor an exponent <= 0.
// logits: (K), targets: (K), scratch: (2 K)
ZlprRow zlpr_row(float* logits, const float* targets, int K, float grad_scale, bool compute_grad,
                 double* scratch) {
  double* pos_terms = scratch;      // (K) s_i + log(1 - t_i), or -inf where t_i = 1
  double* neg_terms = scratch + K;  // (K) -s_i + log t_i, or -inf where t_i = 0
  ZlprRow row;
  row.correct = true;
  for (int i = 0; i < K; ++i) {
    const double s = logits[i], t = targets[i];
    pos_terms[i] = t < 1.0 ? s + std::log1p(-t) : -INFINITY;
    neg_terms[i] = t > 0.0 ? -s + std::log(t) : -INFINITY;
    if ((logits[i] > 0.0f) != (targets[i] >= 0.5f)) row.correct = false;
  }
  // exp(-inf - top) is 0: excluded labels add nothing.
  const double A = log_one_plus_sum_exp(pos_terms, K);
  const double B = log_one_plus_sum_exp(neg_terms, K);
  row.loss = A + B;
  if (compute_grad) {
    for (int i = 0; i < K; ++i) {
      const double g = std::exp(pos_terms[i] - A) - std::exp(neg_terms[i] - B);
      logits[i] = static_cast<float>(g * grad_scale);
    }
  }
  return row;
}

}  // namespace

void CpuOps::pool_forward(Act out_act, Act x_act, const Ragged& rows, int C, PoolKind kind) {
  const int B = rows.batch;
  if (B == 0 || C == 0) return;
  Fp32 f(*this);
  const float* x = f.in(x_act, static_cast<size_t>(rows.total) * C);  // (N, C)
  float* out = f.out(out_act, static_cast<size_t>(B) * C);            // (B, C)
  const int32_t* offsets = rows.host_offsets;                         // (B+1)
  const bool threaded = cpu::worth_threading(static_cast<size_t>(rows.total) * C);
#pragma omp parallel for schedule(static) if (threaded)
  for (int b = 0; b < B; ++b) {
    float* dst = out + static_cast<size_t>(b) * C;                 // (C)
    const float* first = x + static_cast<size_t>(offsets[b]) * C;  // (length, C)
    const int length = offsets[b + 1] - offsets[b];
    // An empty sequence has no first row either: 0 for both kinds.
    if (length == 0) {
      std::fill(dst, dst + C, 0.0f);
    } else if (kind == PoolKind::kCls) {
      std::memcpy(dst, first, sizeof(float) * C);
    } else {
      // Rows added in order, then one division: the GPU's order and rounding.
      std::fill(dst, dst + C, 0.0f);
      for (int r = 0; r < length; ++r) {
        const float* src = first + static_cast<size_t>(r) * C;  // (C)
        for (int c = 0; c < C; ++c) dst[c] += src[c];
      }
      const float count = static_cast<float>(length);
      for (int c = 0; c < C; ++c) dst[c] /= count;
    }
  }
}

void CpuOps::pool_backward(Act dx_act, Act dout_act, const Ragged& rows, int C, PoolKind kind) {
  const int B = rows.batch;
  if (rows.total == 0 || C == 0) return;
  Fp32 f(*this);
  const float* dout = f.in(dout_act, static_cast<size_t>(B) * C);  // (B, C)
  float* dx = f.out(dx_act, static_cast<size_t>(rows.total) * C);  // (N, C)
  const int32_t* offsets = rows.host_offsets;                      // (B+1)
  const bool threaded = cpu::worth_threading(static_cast<size_t>(rows.total) * C);
#pragma omp parallel for schedule(static) if (threaded)
  for (int b = 0; b < B; ++b) {
    const float* src = dout + static_cast<size_t>(b) * C;     // (C)
    float* first = dx + static_cast<size_t>(offsets[b]) * C;  // (length, C)
    const int length = offsets[b + 1] - offsets[b];
    if (length == 0) continue;
    if (kind == PoolKind::kCls) {
      std::memcpy(first, src, sizeof(float) * C);
      std::fill(first + C, first + static_cast<size_t>(length) * C, 0.0f);
    } else {
      const float count = static_cast<float>(length);
      for (int r = 0; r < length; ++r) {
        float* dst = first + static_cast<size_t>(r) * C;  // (C)
        for (int c = 0; c < C; ++c) dst[c] = src[c] / count;
      }
    }
  }
}

void CpuOps::zlpr_loss(Act logits_act, const float* targets, int B, int K, float grad_scale,
                       bool compute_grad, LossSums* sums_out, int64_t* label_counts, int stride) {
  if (B == 0 || K == 0) return;
  Fp32 f(*this);
  const int ld = stride > 0 ? stride : K;
  // Without a gradient the rows are only read.
  float* logits =  // (B, K) rows ld apart
      compute_grad ? f.inout(logits_act, B, ld, K) : const_cast<float*>(f.in(logits_act, B, ld, K));
  const bool threaded = cpu::worth_threading(static_cast<size_t>(B) * K);

  // Label counts first, while the logits are still scores: one label per
  // iteration, so no two threads add to one count.
  int64_t* true_pos = label_counts;           // (K)
  int64_t* false_pos = label_counts + K;      // (K)
  int64_t* false_neg = label_counts + 2 * K;  // (K)
#pragma omp parallel for schedule(static) if (threaded)
  for (int i = 0; i < K; ++i) {
    int64_t tp = 0, fp = 0, fn = 0;
    for (int b = 0; b < B; ++b) {
      const bool predicted = logits[static_cast<size_t>(b) * ld + i] > 0.0f;
      const bool truth = targets[static_cast<size_t>(b) * K + i] >= 0.5f;
      tp += predicted && truth;
      fp += predicted && !truth;
      fn += !predicted && truth;
    }
    true_pos[i] += tp;
    false_pos[i] += fp;
    false_neg[i] += fn;
  }

  // Per-row losses are summed afterwards in row order, so the total does not
  // depend on the thread count.
  const size_t row_terms = 2 * static_cast<size_t>(K);
  double* row_loss = grow(double_scratch_, static_cast<size_t>(B) * (1 + row_terms));  // (B)
  double* terms = row_loss + B;  // (B, 2 K): each row's exponents
  int64_t correct = 0;
#pragma omp parallel for schedule(static) reduction(+ : correct) if (threaded)
  for (int b = 0; b < B; ++b) {
    const ZlprRow r =
        zlpr_row(logits + static_cast<size_t>(b) * ld, targets + static_cast<size_t>(b) * K, K,
                 grad_scale, compute_grad, terms + b * row_terms);
    row_loss[b] = r.loss;
    correct += r.correct ? 1 : 0;
  }
  LossSums sums;
  for (int b = 0; b < B; ++b) sums.loss += row_loss[b];
  sums.nll = sums.loss;  // the loss is not smoothed: it is its own nll
  sums.tokens = B;
  sums.correct = correct;
  *sums_out += sums;
}

}  // namespace mpiformer
