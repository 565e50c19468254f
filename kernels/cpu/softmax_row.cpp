// Row softmax over a count of valid columns, with its log-sum-exp; row log-softmax.
#include "kernels/cpu/softmax_row.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/vec_math.h"

namespace mpiformer::cpu {

MPIFORMER_HOT float softmax_row(float* probs, const float* x, int valid, int L, float scale) {
  valid = std::clamp(valid, 0, L);
  float lse = 0.0f;
  if (valid > 0) {
    // max of x * scale, not scale * max(x): scale may be 0 or negative.
    // (A ternary, not std::max: GCC does not vectorise the reference form.)
    float max_logit = x[0] * scale;
#pragma omp simd reduction(max : max_logit)
    for (int j = 0; j < valid; ++j) {
      const float logit = x[j] * scale;
      max_logit = max_logit > logit ? max_logit : logit;
    }
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < valid; ++j) {
      const float e = fast_exp(x[j] * scale - max_logit);
      probs[j] = e;
      sum += e;
    }
    const float inv_sum = 1.0f / sum;  // sum >= 1: the max contributes exp(0)
#pragma omp simd
    for (int j = 0; j < valid; ++j) probs[j] *= inv_sum;
    lse = max_logit + std::log(sum);
  }
  for (int j = valid; j < L; ++j) probs[j] = 0.0f;
  return lse;
}

MPIFORMER_HOT void softmax_row_from_stats(float* probs, const float* x, int valid, int L,
                                          float scale, float lse) {
  valid = std::clamp(valid, 0, L);
#pragma omp simd
  for (int j = 0; j < valid; ++j) probs[j] = fast_exp(x[j] * scale - lse);
  for (int j = valid; j < L; ++j) probs[j] = 0.0f;
}

MPIFORMER_HOT void log_softmax_row(float* x, int L) {
  float max_logit = x[0];
#pragma omp simd reduction(max : max_logit)
  for (int j = 0; j < L; ++j) max_logit = max_logit > x[j] ? max_logit : x[j];
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int j = 0; j < L; ++j) sum += fast_exp(x[j] - max_logit);
  const float lse = max_logit + std::log(sum);  // sum >= 1: the max contributes exp(0)
#pragma omp simd
  for (int j = 0; j < L; ++j) x[j] -= lse;
}

MPIFORMER_HOT void softmax_backward_row(float* dx, const float* dprobs, const float* probs, int L,
                                        float scale) {
  float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
  for (int j = 0; j < L; ++j) dot += dprobs[j] * probs[j];
#pragma omp simd
  for (int j = 0; j < L; ++j) dx[j] = scale * probs[j] * (dprobs[j] - dot);
}

}  // namespace mpiformer::cpu
