// A loss carried as {sum, count} becomes the reported figures here, once, at
// the end: label-smoothed cross entropy over padding (docs/DESIGN.md section
// 4) is computed by kernels' fused softmax-CE, which adds the sums.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/ops.h"
#include "src/io/label_figures.h"

namespace mpiformer {

// Per target token, in nats. `loss` is the training objective (label-smoothed,
// less its constant: 0 for a perfect prediction); `nll` is the true negative
// log-likelihood, whose exp is the perplexity papers report.
// A multi-label classifier's figures from its per-label counts, summed over
// ranks. counts: (3 K) [TP | FP | FN] (Model::take_label_counts); empty: all NaN.
LabelFigures label_figures(const std::vector<int64_t>& counts);

struct LossSummary {
  double loss = 0.0;        // sum / tokens (0 when no tokens)
  double nll = 0.0;         // nll sum / tokens
  double perplexity = 1.0;  // exp(nll)
  double accuracy = 0.0;    // correct / tokens
  int64_t tokens = 0;       // target tokens, or a classifier's examples
  LabelFigures labels;      // zlpr classifiers
};

// label_counts: a multi-label classifier's global (3 K) counts, or empty.
LossSummary summarize(const LossSums& sums, const std::vector<int64_t>& label_counts = {});

// Scalar reference of one row's smoothed loss, for tests and checks:
// logits: host (V)
double label_smoothed_loss_reference(const float* logits, int V, int target, float smoothing);

}  // namespace mpiformer
