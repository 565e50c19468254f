// Label-smoothed softmax cross entropy fused with its gradient. Per row: one
// pass for the max and the sum of the logits (the only one that reads the
// row from memory; a row of 8192 floats then sits in L2), one for the
// exponentials, kept in place when a gradient is wanted, and one that turns
// them into the gradient. The probabilities are never stored separately.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/vec_math.h"

namespace mpiformer {
namespace {

// First j with x[j] == value (ties go to the lowest class, as argmax), or
// n - 1 if none (NaN). Blocks are tested with a vectorised compare before
// the scalar scan of the one block that holds the value.  x: (n)
__attribute__((always_inline)) inline int first_index_of(const float* x, int n, float value) {
  constexpr int kBlock = 256;
  for (int begin = 0; begin < n; begin += kBlock) {
    const int end = std::min(n, begin + kBlock);
    int found = 0;
#pragma omp simd reduction(| : found)
    for (int j = begin; j < end; ++j) found |= x[j] == value;
    if (found) {
      for (int j = begin; j < end; ++j) {
        if (x[j] == value) return j;
      }
    }
  }
  return n - 1;
}

struct RowLoss {
  double loss = 0.0;
  double nll = 0.0;  // -log p(target), unsmoothed
  bool correct = false;
};

// One row with target t. Smoothed target q: 1-e on t, e/(V-1) elsewhere.
// loss = logsumexp(x) - (1-e) x_t - e/(V-1) (sum(x) - x_t) - constant.
// With compute_grad the row is overwritten by (softmax(x) - q) * grad_scale.
// logits: (V)
MPIFORMER_HOT RowLoss cross_entropy_row(float* logits, int target, int V, float smoothing,
                                        double constant, float grad_scale, bool compute_grad) {
  // One pass for the max and the sum. (A ternary, not std::max: GCC does not
  // vectorise the reference form, and this pass reads the row from memory.)
  float max_logit = logits[0];
  float sum_logits = 0.0f;
#pragma omp simd reduction(max : max_logit) reduction(+ : sum_logits)
  for (int j = 0; j < V; ++j) {
    const float x = logits[j];
    max_logit = max_logit > x ? max_logit : x;
    sum_logits += x;
  }
  const int argmax = first_index_of(logits, V, max_logit);
  const float target_logit = logits[target];

  float sum_exp = 0.0f;
  if (compute_grad) {
#pragma omp simd reduction(+ : sum_exp)
    for (int j = 0; j < V; ++j) {
      const float e = cpu::fast_exp(logits[j] - max_logit);
      logits[j] = e;  // kept for the gradient pass below
      sum_exp += e;
    }
  } else {
#pragma omp simd reduction(+ : sum_exp)
    for (int j = 0; j < V; ++j) sum_exp += cpu::fast_exp(logits[j] - max_logit);
  }

  const double off_target = V > 1 ? static_cast<double>(smoothing) / (V - 1) : 0.0;
  const double on_target = 1.0 - smoothing;
  const double log_sum_exp = max_logit + std::log(static_cast<double>(sum_exp));
  RowLoss row;
  row.loss = log_sum_exp - on_target * target_logit -
             off_target * (static_cast<double>(sum_logits) - target_logit) - constant;
  row.nll = log_sum_exp - target_logit;
  row.correct = argmax == target;

  if (compute_grad) {
    const float prob_scale = grad_scale / sum_exp;
    const float off_grad = static_cast<float>(off_target) * grad_scale;
    const float target_exp = logits[target];
#pragma omp simd
    for (int j = 0; j < V; ++j) logits[j] = logits[j] * prob_scale - off_grad;
    // the target's q is 1-e, not e/(V-1)
    logits[target] = target_exp * prob_scale - static_cast<float>(on_target) * grad_scale;
  }
  return row;
}

}  // namespace

void CpuOps::cross_entropy(Act logits_act, const int32_t* targets, int N, int V, float smoothing,
                           int pad_id, float grad_scale, bool compute_grad, LossSums* sums_out,
                           int stride) {
  Fp32 f(*this);
  const int ld = stride > 0 ? stride : V;
  // Without a gradient the rows are only read.
  float* logits =
      compute_grad ? f.inout(logits_act, N, ld, V) : const_cast<float*>(f.in(logits_act, N, ld, V));
  const double constant = label_smoothing_constant(smoothing, V);
  // Per-row losses are summed afterwards in row order, so the total does not
  // depend on the thread count or on which thread finishes first.
  double* row_loss = grow(double_scratch_, 2 * static_cast<size_t>(N));  // (N)
  double* row_nll = row_loss + N;                                        // (N)
  int64_t tokens = 0;
  int64_t correct = 0;
#pragma omp parallel for schedule(static) reduction(+ : tokens, correct) \
    if (cpu::worth_threading(static_cast<size_t>(N) * V))
  for (int i = 0; i < N; ++i) {
    float* row = logits + static_cast<size_t>(i) * ld;  // (V)
    if (targets[i] == pad_id) {
      row_loss[i] = row_nll[i] = 0.0;
      if (compute_grad) std::fill(row, row + V, 0.0f);
      continue;
    }
    const RowLoss r =
        cross_entropy_row(row, targets[i], V, smoothing, constant, grad_scale, compute_grad);
    row_loss[i] = r.loss;
    row_nll[i] = r.nll;
    tokens += 1;
    correct += r.correct ? 1 : 0;
  }
  LossSums sums;
  for (int i = 0; i < N; ++i) {
    sums.loss += row_loss[i];
    sums.nll += row_nll[i];
  }
  sums.tokens = tokens;
  sums.correct = correct;
  *sums_out += sums;
}

}  // namespace mpiformer
