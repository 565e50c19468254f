#include "src/train/progress.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "src/loss/cross_entropy.h"
#include "src/train/held_out.h"

namespace mpiformer {

void ProgressWindow::restart() {
  start_ = Clock::now();
  sums_ = LossSums{};
  std::fill(label_counts_.begin(), label_counts_.end(), 0);
  reduce_ = ReduceTiming{};
  real_tokens_ = padded_tokens_ = 0;
  other_s_ = 0.0;
  steps_ = empty_steps_ = overflows_ = non_finite_ = 0;
}

void ProgressWindow::add_batch(const Batch& batch) {
  real_tokens_ += batch.real_tokens();
  padded_tokens_ += batch.padded_tokens();
}

void ProgressWindow::add_label_counts(const std::vector<int64_t>& local) {
  if (label_counts_.size() < local.size()) label_counts_.resize(local.size(), 0);
  for (size_t i = 0; i < local.size(); ++i) label_counts_[i] += local[i];
}

void ProgressWindow::add_step(const LossSums& local, const ReduceTiming& reduce) {
  sums_ += local;
  reduce_ += reduce;
  ++steps_;
}

std::string format_duration(double seconds) {
  const long long s = std::llround(std::max(0.0, seconds));
  char buf[48];
  if (s >= 3600) {
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%lld:%02lld", s / 60, s % 60);
  }
  return buf;
}

ProgressWindow::Line ProgressWindow::close(int64_t step, int64_t total_steps, float lr,
                                           double grad_norm, float loss_scale, bool dynamic_scaling,
                                           const Position& at, const Communicator& comm) {
  const int W = comm.size();
  const LossSummary train = summarize(allreduce(comm, sums_), allreduce(comm, label_counts_));
  const double seconds = std::chrono::duration<double>(Clock::now() - start_).count();
  const double real = static_cast<double>(comm.allreduce_sum(real_tokens_));
  const double padded = static_cast<double>(comm.allreduce_sum(padded_tokens_));
  double reduce_sums[3] = {reduce_.wait_s, reduce_.in_flight_s, reduce_.hidden_s};
  comm.allreduce_sum(reduce_sums, 3);
  const int steps = std::max(steps_, 1);

  Line line;
  TrainRow& row = line.row;
  row.step = step;
  row.loss = train.loss;
  row.nll = train.nll;
  row.accuracy = train.accuracy;
  row.tokens = train.tokens;
  row.labels = train.labels;
  row.lr = lr;
  row.grad_norm = grad_norm;
  row.tokens_per_s = real / seconds;
  row.step_ms = 1000.0 * std::max(0.0, seconds - other_s_) / steps;
  row.padding_efficiency = padded > 0 ? real / padded : 1.0;
  row.loss_scale = loss_scale;
  row.elapsed_s = at.elapsed_s;
  row.epoch = at.epoch >= 0 ? at.epoch : std::nan("");
  // Mean over ranks of the wait after backward, and the share of all-reduce
  // time that ran while backward did.
  row.comm_wait_ms = 1000.0 * reduce_sums[0] / (W * steps);
  row.hidden_share = W > 1 && reduce_sums[1] > 0 ? reduce_sums[2] / reduce_sums[1] : std::nan("");
  if (comm.is_root()) {
    std::string extra;
    char buf[128];
    if (W > 1) {
      std::snprintf(buf, sizeof buf, " | comm-wait %.1f ms | hidden %.0f%%", row.comm_wait_ms,
                    std::isfinite(row.hidden_share) ? 100.0 * row.hidden_share : 0.0);
      extra = buf;
    }
    if (empty_steps_ > 0) extra += " | skipped " + std::to_string(empty_steps_);
    if (non_finite_ > 0) extra += " | non-finite steps skipped " + std::to_string(non_finite_);
    if (dynamic_scaling) {
      std::snprintf(buf, sizeof buf, " | loss-scale %g", loss_scale);
      extra += buf;
      if (overflows_ > 0) extra += " (" + std::to_string(overflows_) + " overflow step(s) skipped)";
    }
    std::snprintf(buf, sizeof buf, "step %lld/%lld | ", static_cast<long long>(step),
                  static_cast<long long>(total_steps));
    line.text = buf;
    if (at.epoch >= 0) {
      std::snprintf(buf, sizeof buf, "epoch %.2f | ", at.epoch);
      line.text += buf;
    }
    std::snprintf(buf, sizeof buf, "loss %.4f | ", row.loss);
    line.text += buf;
    if (show_nll_) {
      std::snprintf(buf, sizeof buf, "nll %.4f | ", row.nll);
      line.text += buf;
    }
    std::snprintf(buf, sizeof buf, "acc %.2f%% | ", 100.0 * row.accuracy);
    line.text += buf;
    if (!label_counts_.empty()) {
      std::snprintf(buf, sizeof buf, "micro-F1 %.4f | macro-F1 %.4f | ", row.labels.micro_f1,
                    row.labels.macro_f1);
      line.text += buf;
    }
    std::snprintf(buf, sizeof buf, "lr %.3e | ", lr);
    line.text += buf;
    std::snprintf(buf, sizeof buf, "grad-norm %.3f | %.0f tok/s | pad-eff %.3f | %.1f ms/step",
                  grad_norm, row.tokens_per_s, row.padding_efficiency, row.step_ms);
    line.text += buf + extra;
    line.text += " | " + format_duration(at.elapsed_s);
    if (at.eta_s >= 0) line.text += ", ETA " + format_duration(at.eta_s);
  }
  restart();
  return line;
}

}  // namespace mpiformer
