#include "src/loss/cross_entropy.h"

#include <algorithm>
#include <cmath>

namespace mpiformer {

LossSummary summarize(const LossSums& sums) {
  LossSummary s;
  s.tokens = sums.tokens;
  if (sums.tokens > 0) {
    s.loss = sums.loss / static_cast<double>(sums.tokens);
    s.nll = sums.nll / static_cast<double>(sums.tokens);
    s.accuracy = static_cast<double>(sums.correct) / static_cast<double>(sums.tokens);
  }
  s.perplexity = std::exp(s.nll);
  return s;
}

double label_smoothed_loss_reference(const float* logits, int V, int target, float smoothing) {
  // log p_j = x_j - logsumexp(x), with the max subtracted for range.
  double max_logit = logits[0];
  for (int j = 1; j < V; ++j) max_logit = std::max(max_logit, static_cast<double>(logits[j]));
  double sum_exp = 0.0;
  for (int j = 0; j < V; ++j) sum_exp += std::exp(static_cast<double>(logits[j]) - max_logit);
  const double log_z = max_logit + std::log(sum_exp);

  // q: 1 - e on the target, e / (V - 1) on every other class.
  const double e = smoothing;
  const double q_other = V > 1 ? e / (V - 1) : 0.0;
  double cross = 0.0;  // -sum_j q_j log p_j
  for (int j = 0; j < V; ++j) {
    const double q = j == target ? 1.0 - e : q_other;
    cross -= q * (static_cast<double>(logits[j]) - log_z);
  }
  return cross - label_smoothing_constant(smoothing, V);
}

}  // namespace mpiformer
