// Row kernels of the softmax: attention.cpp's, and decoding's log-probabilities.
#pragma once

namespace mpiformer::cpu {

// probs[j] = softmax_j(x * scale) over j < valid; probs[j] = 0 for valid <= j < L.
// Returns the row's log-sum-exp, log(sum_{j < valid} exp(x_j * scale)) (0
// when valid is 0). probs may alias x.  probs, x: (L)
float softmax_row(float* probs, const float* x, int valid, int L, float scale);

// The same probabilities from a log-sum-exp saved by softmax_row:
// probs[j] = exp(x_j * scale - lse) over j < valid, 0 for valid <= j < L.
// probs may alias x.  probs, x: (L)
void softmax_row_from_stats(float* probs, const float* x, int valid, int L, float scale, float lse);

// x[j] -= log(sum_j exp(x_j)) over the L columns: log-probabilities from
// logits, in place. A row's bits are its own.  x: (L), L >= 1
void log_softmax_row(float* x, int L);

// dx = scale * probs * (dprobs - sum(dprobs * probs)); dx may alias dprobs.
// dx, dprobs, probs: (L)
void softmax_backward_row(float* dx, const float* dprobs, const float* probs, int L, float scale);

}  // namespace mpiformer::cpu
