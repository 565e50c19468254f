#include "src/train/progress.h"

#include <algorithm>
#include <cstdio>

#include "src/app/evaluation.h"
#include "src/loss/cross_entropy.h"

namespace mpiformer {

void ProgressWindow::restart() {
  start_ = Clock::now();
  sums_ = LossSums{};
  reduce_ = ReduceTiming{};
  real_tokens_ = padded_tokens_ = 0;
  other_s_ = 0.0;
  steps_ = empty_steps_ = overflows_ = non_finite_ = 0;
}

void ProgressWindow::add_batch(const Batch& batch) {
  real_tokens_ += batch.real_tokens();
  padded_tokens_ += batch.padded_tokens();
}

void ProgressWindow::add_step(const LossSums& local, const ReduceTiming& reduce) {
  sums_ += local;
  reduce_ += reduce;
  ++steps_;
}

ProgressWindow::Line ProgressWindow::close(int64_t step, int64_t total_steps, float lr,
                                           double grad_norm, float loss_scale, bool dynamic_scaling,
                                           const Communicator& comm) {
  const int W = comm.size();
  const LossSummary train = summarize(allreduce(comm, sums_));
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
  row.accuracy = train.accuracy;
  row.tokens = train.tokens;
  row.lr = lr;
  row.grad_norm = grad_norm;
  row.tokens_per_s = real / seconds;
  row.step_ms = 1000.0 * std::max(0.0, seconds - other_s_) / steps;
  row.padding_efficiency = padded > 0 ? real / padded : 1.0;
  row.loss_scale = loss_scale;
  if (comm.is_root()) {
    std::string extra;
    char buf[128];
    if (W > 1) {
      // Mean over ranks of the wait after backward, and the share of
      // all-reduce time that ran while backward did.
      std::snprintf(buf, sizeof buf, " | comm-wait %.1f ms | hidden %.0f%%",
                    1000.0 * reduce_sums[0] / (W * steps),
                    reduce_sums[1] > 0 ? 100.0 * reduce_sums[2] / reduce_sums[1] : 0.0);
      extra = buf;
    }
    if (empty_steps_ > 0) extra += " | skipped " + std::to_string(empty_steps_);
    if (non_finite_ > 0) extra += " | non-finite steps skipped " + std::to_string(non_finite_);
    if (dynamic_scaling) {
      std::snprintf(buf, sizeof buf, " | loss-scale %g", loss_scale);
      extra += buf;
      if (overflows_ > 0) extra += " (" + std::to_string(overflows_) + " overflow step(s) skipped)";
    }
    std::snprintf(buf, sizeof buf, "step %lld/%lld | loss %.4f | acc %.2f%% | lr %.3e | ",
                  static_cast<long long>(step), static_cast<long long>(total_steps), row.loss,
                  100.0 * row.accuracy, lr);
    line.text = buf;
    std::snprintf(buf, sizeof buf, "grad-norm %.3f | %.0f tok/s | pad-eff %.3f | %.1f ms/step",
                  grad_norm, row.tokens_per_s, row.padding_efficiency, row.step_ms);
    line.text += buf + extra;
  }
  restart();
  return line;
}

}  // namespace mpiformer
