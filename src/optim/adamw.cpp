#include "src/optim/adamw.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace mpiformer {

AdamW::AdamW(ParameterSet& params, const OptimConfig& config) : params_(params), config_(config) {
  Ops& ops = params_.ops();
  const size_t bytes = params_.count() * sizeof(float);
  m_ = static_cast<float*>(ops.device().allocate(bytes));  // zero-filled
  v_ = static_cast<float*>(ops.device().allocate(bytes));
  norm_sq_ = static_cast<double*>(ops.device().allocate(sizeof(double)));
  check_sq_ = static_cast<double*>(ops.device().allocate(sizeof(double)));

  // Tensors are packed back to back, so a run of neighbours with the same
  // weight decay is one contiguous range; long runs are cut into pieces of
  // kAdamWRangeFloats (one block each on a GPU).
  const auto& info = params_.info();
  const auto decay_of = [&](const ParamInfo& t) {
    return (t.decay || config_.decay_all) ? config_.weight_decay : 0.0f;
  };
  size_t i = 0;
  while (i < info.size()) {
    AdamWRange range{info[i].offset, info[i].offset + info[i].size, decay_of(info[i])};
    size_t j = i + 1;
    while (j < info.size() && info[j].offset == range.end &&
           decay_of(info[j]) == range.weight_decay) {
      range.end += info[j].size;
      ++j;
    }
    for (size_t begin = range.begin; begin < range.end; begin += kAdamWRangeFloats) {
      host_ranges_.push_back(
          {begin, std::min(range.end, begin + kAdamWRangeFloats), range.weight_decay});
    }
    i = j;
  }
  ranges_ =
      static_cast<AdamWRange*>(ops.device().allocate(host_ranges_.size() * sizeof(AdamWRange)));
  ops.device().copy_to_device(ranges_, host_ranges_.data(),
                              host_ranges_.size() * sizeof(AdamWRange));
}

AdamW::~AdamW() {
  Ops& ops = params_.ops();
  ops.device().release(m_);
  ops.device().release(v_);
  ops.device().release(ranges_);
  ops.device().release(norm_sq_);
  ops.device().release(check_sq_);
}

const char* AdamW::non_finite_state() {
  // A sum of squares in double is finite exactly when every float is: the
  // largest float squared, times any count of them, stays far below 1e308.
  const std::pair<const char*, const float*> groups[] = {
      {"params", params_.params()}, {"optimizer/m", m_}, {"optimizer/v", v_}};
  for (const auto& [name, data] : groups) {
    params_.ops().sum_squares(check_sq_, data, params_.count());
    double sum_sq = 0.0;
    params_.ops().device().copy_to_host(&sum_sq, check_sq_, sizeof sum_sq);
    if (!std::isfinite(sum_sq)) return name;
  }
  return nullptr;
}

void AdamW::measure_gradients() {
  params_.ops().sum_squares(norm_sq_, params_.grads(), params_.count());
}

double AdamW::measured_norm() {
  double norm_sq = 0.0;
  params_.ops().device().copy_to_host(&norm_sq, norm_sq_, sizeof norm_sq);
  return std::sqrt(norm_sq);
}

void AdamW::step(float lr, float inv_loss_scale) {
  ++step_;
  AdamWConfig cfg;
  cfg.lr = lr;
  cfg.beta1 = config_.beta1;
  cfg.beta2 = config_.beta2;
  cfg.eps = config_.eps;
  cfg.step = step_;
  cfg.inv_loss_scale = inv_loss_scale;
  cfg.max_norm = config_.clip_norm;
  params_.ops().adamw_update(params_.params(), params_.grads(), m_, v_, params_.compute_copy(),
                             params_.count(), ranges_, static_cast<int>(host_ranges_.size()), cfg,
                             norm_sq_);
}

}  // namespace mpiformer
