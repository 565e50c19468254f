// Row kernels of the softmax, shared by softmax.cpp and attention.cpp.
#pragma once

namespace mpiformer::cpu {

// probs[j] = softmax_j(x * scale) over j < valid; probs[j] = 0 for valid <= j < L.
// probs may alias x.  probs, x: (L)
void softmax_row(float* probs, const float* x, int valid, int L, float scale);

// dx = scale * probs * (dprobs - sum(dprobs * probs)); dx may alias dprobs.
// dx, dprobs, probs: (L)
void softmax_backward_row(float* dx, const float* dprobs, const float* probs, int L, float scale);

}  // namespace mpiformer::cpu
