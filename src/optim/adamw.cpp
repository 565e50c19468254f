#include "src/optim/adamw.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <utility>

namespace mpiformer {

AdamW::AdamW(ParameterSet& params, const OptimConfig& config, ShardLink* shards)
    : params_(params), config_(config), shards_(shards) {
  Ops& ops = params_.ops();
  begin_ = 0;
  end_ = params_.count();
  if (shards_) {
    const std::vector<size_t>& bounds = shards_->bounds();
    if (bounds.empty() || bounds.back() != params_.count())
      throw std::logic_error("AdamW: slices that do not cover the parameters");
    begin_ = bounds[shards_->rank()];
    end_ = bounds[shards_->rank() + 1];
    // Beside a compute copy, the masters of the slice are all this rank needs.
    if (params_.compute_copy()) params_.keep_masters_of(begin_, end_);
  }
  // An empty slice still gets a float, so no pointer is null.
  const size_t bytes = std::max<size_t>(end_ - begin_, 1) * sizeof(float);
  m_ = static_cast<float*>(ops.device().allocate(bytes));  // zero-filled
  v_ = static_cast<float*>(ops.device().allocate(bytes));
  partials_ = static_cast<double*>(
      ops.device().allocate(std::max<size_t>(norm_blocks(params_.count()), 1) * sizeof(double)));
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
    // Clipped to the slice and counted from its start.
    range.begin = std::max(range.begin, begin_);
    range.end = std::min(range.end, end_);
    for (size_t begin = range.begin; begin < range.end; begin += kAdamWRangeFloats) {
      host_ranges_.push_back({begin - begin_,
                              std::min(range.end, begin + kAdamWRangeFloats) - begin_,
                              range.weight_decay});
    }
    i = j;
  }
  ranges_ = static_cast<AdamWRange*>(
      ops.device().allocate(std::max<size_t>(host_ranges_.size(), 1) * sizeof(AdamWRange)));
  ops.device().copy_to_device(ranges_, host_ranges_.data(),
                              host_ranges_.size() * sizeof(AdamWRange));
}

AdamW::~AdamW() {
  Ops& ops = params_.ops();
  ops.device().release(m_);
  ops.device().release(v_);
  ops.device().release(ranges_);
  ops.device().release(partials_);
  ops.device().release(norm_sq_);
  ops.device().release(check_sq_);
}

const char* AdamW::non_finite_state() {
  // A sum of squares in double is finite exactly when every float is: the
  // largest float squared, times any count of them, stays far below 1e308.
  const std::pair<const char*, const float*> groups[] = {
      {"params", params_.master_at(begin_)}, {"optimizer/m", m_}, {"optimizer/v", v_}};
  for (const auto& [name, data] : groups) {
    params_.ops().sum_squares(check_sq_, data, end_ - begin_);
    double sum_sq = 0.0;
    params_.ops().device().copy_to_host(&sum_sq, check_sq_, sizeof sum_sq);
    if (!std::isfinite(sum_sq)) return name;
  }
  return nullptr;
}

void AdamW::measure_gradients() {
  // One partial per norm block, added in block order: sharded, each rank
  // fills its own blocks of a zeroed array and the ranks sum the arrays
  // (adding zeros is exact), so every rank adds the unsharded partials.
  Ops& ops = params_.ops();
  const size_t blocks = norm_blocks(params_.count());
  if (shards_) {
    ops.device().fill_zero(partials_, blocks * sizeof(double));
    ops.sum_squares_blocks(partials_ + begin_ / kNormBlockFloats, params_.grads() + begin_,
                           end_ - begin_);
    shards_->sum_partials(partials_, blocks);
  } else {
    ops.sum_squares_blocks(partials_, params_.grads(), params_.count());
  }
  ops.sum_doubles(norm_sq_, partials_, blocks);
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
  params_.ops().adamw_update(params_.master_at(begin_), params_.grads() + begin_, m_, v_,
                             params_.compute_copy() + begin_, end_ - begin_, ranges_,
                             static_cast<int>(host_ranges_.size()), cfg, norm_sq_);
  if (shards_) start_gather();
}

void AdamW::start_gather() {
  const Act compute = params_.compute_copy();
  if (params_.masters_sliced()) {
    shards_->start_gather(compute.data, dtype_bytes(compute.dtype));
  } else {
    shards_->start_gather(params_.params(), sizeof(float));
  }
  gather_pending_ = true;
}

void AdamW::await_weights() {
  if (!gather_pending_) return;
  gather_pending_ = false;
  shards_->finish_gather();
  // Sliced masters: the compute copy itself arrived. Otherwise the other
  // ranks' slices arrived as fp32 masters, the only copy in fp32.
  if (!params_.masters_sliced()) params_.refresh_compute();
}

void AdamW::refresh_weights() {
  params_.refresh_compute();
  if (params_.masters_sliced()) {
    start_gather();
    await_weights();
  }
}

}  // namespace mpiformer
