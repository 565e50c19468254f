#include "src/scoring/loss_figures.h"

#include <algorithm>
#include <cmath>

namespace mpiformer {

LossSummary summarize(const LossSums& sums, const std::vector<int64_t>& label_counts) {
  LossSummary s;
  s.labels = label_figures(label_counts);
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

LabelFigures label_figures(const std::vector<int64_t>& counts) {
  LabelFigures m;
  const size_t K = counts.size() / 3;
  if (K == 0) return m;
  const int64_t* tp = counts.data();
  const int64_t* fp = tp + K;
  const int64_t* fn = fp + K;
  const auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
  int64_t all_tp = 0, all_fp = 0, all_fn = 0;
  double precision = 0, recall = 0, f1 = 0;
  int occurring = 0;
  for (size_t k = 0; k < K; ++k) {
    all_tp += tp[k], all_fp += fp[k], all_fn += fn[k];
    if (tp[k] + fp[k] + fn[k] == 0) continue;
    ++occurring;
    precision += ratio(tp[k], tp[k] + fp[k]);
    recall += ratio(tp[k], tp[k] + fn[k]);
    f1 += ratio(2.0 * tp[k], 2.0 * tp[k] + fp[k] + fn[k]);
  }
  if (occurring == 0) return m;
  m.micro_precision = ratio(all_tp, all_tp + all_fp);
  m.micro_recall = ratio(all_tp, all_tp + all_fn);
  m.micro_f1 = ratio(2.0 * all_tp, 2.0 * all_tp + all_fp + all_fn);
  m.macro_precision = precision / occurring;
  m.macro_recall = recall / occurring;
  m.macro_f1 = f1 / occurring;
  return m;
}

}  // namespace mpiformer
