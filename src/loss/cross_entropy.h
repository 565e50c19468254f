// Label-smoothed cross entropy over padding, as in the official Transformer
// (docs/DESIGN.md section 4): the op itself is kernels' fused softmax-CE; this
// header holds how its sums become reported figures, once, at the end.
#pragma once

#include "kernels/ops.h"

namespace mpiformer {

struct LossSummary {
  double loss = 0.0;        // sum / tokens (0 when no tokens)
  double perplexity = 1.0;  // exp(loss)
  double accuracy = 0.0;    // correct / tokens
  int64_t tokens = 0;
};

LossSummary summarize(const LossSums& sums);

// Scalar reference of one row's smoothed loss, for tests and checks:
// logits: host (V)
double label_smoothed_loss_reference(const float* logits, int V, int target, float smoothing);

}  // namespace mpiformer
