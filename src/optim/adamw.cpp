#include "src/optim/adamw.h"

#include <cmath>

namespace mpiformer {

float clip_factor(double norm, float max_norm) {
  // The 1e-6 keeps the clipped norm just under max_norm, as torch's clip does.
  if (max_norm > 0.0f && norm > max_norm) {
    return static_cast<float>(max_norm / (norm + 1e-6));
  }
  return 1.0f;
}

AdamW::AdamW(ParameterSet& params, const OptimConfig& config) : params_(params), config_(config) {
  const size_t bytes = params_.count() * sizeof(float);
  m_ = static_cast<float*>(params_.ops().allocate(bytes));  // zero-filled
  v_ = static_cast<float*>(params_.ops().allocate(bytes));
}

AdamW::~AdamW() {
  if (m_) params_.ops().release(m_);
  if (v_) params_.ops().release(v_);
}

double AdamW::grad_norm() {
  return std::sqrt(params_.ops().sum_squares(params_.grads(), params_.count()));
}

void AdamW::step(float lr, float grad_scale) {
  ++step_;
  AdamWConfig cfg;
  cfg.lr = lr;
  cfg.beta1 = config_.beta1;
  cfg.beta2 = config_.beta2;
  cfg.eps = config_.eps;
  cfg.step = step_;
  cfg.grad_scale = grad_scale;

  // Tensors are packed back to back, so a run of neighbours with the same
  // weight decay is one contiguous range: one update call (one kernel launch
  // on a GPU) per run instead of one per tensor.
  const auto& info = params_.info();
  const auto decay_of = [&](const ParamInfo& t) {
    return (t.decay || config_.decay_all) ? config_.weight_decay : 0.0f;
  };
  Ops& ops = params_.ops();
  size_t i = 0;
  while (i < info.size()) {
    const float wd = decay_of(info[i]);
    const size_t begin = info[i].offset;
    size_t end = begin + info[i].size;
    size_t j = i + 1;
    while (j < info.size() && info[j].offset == end && decay_of(info[j]) == wd) {
      end += info[j].size;
      ++j;
    }
    cfg.weight_decay = wd;
    ops.adamw_update(params_.params() + begin, params_.grads() + begin, m_ + begin, v_ + begin,
                     end - begin, cfg);
    i = j;
  }
}

}  // namespace mpiformer
