// A multi-label classifier's figures (--loss zlpr), shared by the loss
// summaries and metrics.h5: micro averages pool every label's counts; macro
// averages the per-label figures over the labels that occur (in the truth or
// the predictions) in what was counted. NaN for other models, or where there
// is nothing to count.
#pragma once

#include <cmath>

namespace mpiformer {

struct LabelFigures {
  double micro_precision = std::nan(""), micro_recall = std::nan(""), micro_f1 = std::nan("");
  double macro_precision = std::nan(""), macro_recall = std::nan(""), macro_f1 = std::nan("");
};

}  // namespace mpiformer
