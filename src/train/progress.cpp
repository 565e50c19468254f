#include "src/train/progress.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <stdexcept>

#include "src/core/error.h"
#include "src/core/escape.h"
#include "src/scoring/loss_figures.h"
#include "src/train/held_out.h"

namespace mpiformer {

void ProgressWindow::restart() {
  start_ = Clock::now();
  carried_s_ = 0.0;
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

namespace {

// A rank's row of the saved window: these figures, then its label counts.
// The first kAdditive add up over ranks; the rest are every rank's alike
// (steps are counted by each rank) or its own clock.
enum Figure {
  kLoss,
  kNll,
  kTokens,
  kCorrect,
  kRealTokens,
  kPaddedTokens,
  kWaitS,
  kInFlightS,
  kHiddenS,
  kAdditive,
  kSteps = kAdditive,
  kEmptySteps,
  kOverflows,
  kNonFinite,
  kWallS,
  kOtherS,
  kFigures
};
constexpr const char* kWindowFormat = "mpiformer-progress-window 1";

}  // namespace

std::string ProgressWindow::save(const Communicator& comm) const {
  const int W = comm.size(), rank = comm.rank();
  const int labels = comm.max(static_cast<int>(label_counts_.size()));
  const int F = kFigures + labels;
  // (W, F): each rank fills its own row of zeros, and the sum is every row.
  std::vector<double> rows(static_cast<size_t>(W) * F, 0.0);
  double* row = rows.data() + static_cast<size_t>(rank) * F;
  row[kLoss] = sums_.loss;
  row[kNll] = sums_.nll;
  row[kTokens] = static_cast<double>(sums_.tokens);
  row[kCorrect] = static_cast<double>(sums_.correct);
  row[kRealTokens] = static_cast<double>(real_tokens_);
  row[kPaddedTokens] = static_cast<double>(padded_tokens_);
  row[kWaitS] = reduce_.wait_s;
  row[kInFlightS] = reduce_.in_flight_s;
  row[kHiddenS] = reduce_.hidden_s;
  row[kSteps] = steps_;
  row[kEmptySteps] = empty_steps_;
  row[kOverflows] = overflows_;
  row[kNonFinite] = non_finite_;
  row[kWallS] = carried_s_ + std::chrono::duration<double>(Clock::now() - start_).count();
  row[kOtherS] = other_s_;
  for (size_t i = 0; i < label_counts_.size(); ++i)
    row[kFigures + i] = static_cast<double>(label_counts_[i]);
  comm.allreduce_sum(rows.data(), W * F);
  // Hexadecimal floats: the text gives back every bit.
  std::string text = std::string(kWindowFormat) + "\nranks " + std::to_string(W) + " labels " +
                     std::to_string(labels) + "\n";
  char buf[40];
  for (int r = 0; r < W; ++r) {
    for (int f = 0; f < F; ++f) {
      std::snprintf(buf, sizeof buf, f == 0 ? "%a" : " %a", rows[static_cast<size_t>(r) * F + f]);
      text += buf;
    }
    text += "\n";
  }
  return text;
}

void ProgressWindow::restore(const std::string& text, const Communicator& comm) {
  restart();
  if (text.empty()) return;
  // A damaged window is the checkpoint's fault, as other bad values in the
  // user's files are: exit 2.
  const auto fail = [](const std::string& what) {
    throw UsageError("the checkpoint's progress_window: " + what);
  };
  std::istringstream in(text);
  std::string format, word;
  std::getline(in, format);
  if (format != kWindowFormat) fail("unknown format '" + escaped(format) + "'");
  int saved_ranks = 0, labels = 0;
  std::string labels_word;
  if (!(in >> word >> saved_ranks >> labels_word >> labels) || word != "ranks" ||
      labels_word != "labels" || saved_ranks < 1 || labels < 0) {
    fail("no 'ranks N labels L' line");
  }
  // The counts are the file's word: the text must hold that many values
  // (two bytes each at least) before they are allocated.
  const uint64_t values =
      static_cast<uint64_t>(saved_ranks) * (kFigures + static_cast<uint64_t>(labels));
  if (values > text.size() / 2) {
    fail("'ranks " + std::to_string(saved_ranks) + " labels " + std::to_string(labels) +
         "' declares " + std::to_string(values) + " values, more than its " +
         std::to_string(text.size()) + " bytes can hold");
  }
  const int F = kFigures + labels;
  std::vector<double> rows(static_cast<size_t>(saved_ranks) * F);
  for (double& v : rows) {
    std::string token;
    if (!(in >> token)) fail("fewer values than " + std::to_string(rows.size()));
    char* end = nullptr;
    v = std::strtod(token.c_str(), &end);
    if (end == token.c_str() || *end != '\0') fail("'" + token + "' is not a number");
  }
  // The same ranks: each its own row. Others: rank 0 the sums of the
  // additive figures, every rank rank 0's counts and clock.
  std::vector<double> mine(F, 0.0);
  if (saved_ranks == comm.size()) {
    std::copy_n(rows.begin() + static_cast<ptrdiff_t>(comm.rank()) * F, F, mine.begin());
  } else {
    std::copy_n(rows.begin(), F, mine.begin());
    for (int f = 0; f < F; ++f) {
      if (f >= kAdditive && f < kFigures) continue;
      double sum = 0.0;
      for (int r = 0; r < saved_ranks; ++r) sum += rows[static_cast<size_t>(r) * F + f];
      mine[f] = comm.is_root() ? sum : 0.0;
    }
  }
  sums_.loss = mine[kLoss];
  sums_.nll = mine[kNll];
  sums_.tokens = static_cast<int64_t>(mine[kTokens]);
  sums_.correct = static_cast<int64_t>(mine[kCorrect]);
  real_tokens_ = static_cast<int64_t>(mine[kRealTokens]);
  padded_tokens_ = static_cast<int64_t>(mine[kPaddedTokens]);
  reduce_.wait_s = mine[kWaitS];
  reduce_.in_flight_s = mine[kInFlightS];
  reduce_.hidden_s = mine[kHiddenS];
  steps_ = static_cast<int>(mine[kSteps]);
  empty_steps_ = static_cast<int>(mine[kEmptySteps]);
  overflows_ = static_cast<int>(mine[kOverflows]);
  non_finite_ = static_cast<int>(mine[kNonFinite]);
  carried_s_ = mine[kWallS];
  other_s_ = mine[kOtherS];
  label_counts_.assign(static_cast<size_t>(labels), 0);
  for (int i = 0; i < labels; ++i) label_counts_[i] = static_cast<int64_t>(mine[kFigures + i]);
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
  const double seconds = carried_s_ + std::chrono::duration<double>(Clock::now() - start_).count();
  // The steps' own time: the window's less its evaluations, checkpoint
  // writes and replica checks, so tok/s and ms/step are of training alone.
  const double step_seconds = std::max(0.0, seconds - other_s_);
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
  row.tokens_per_s = step_seconds > 0 ? real / step_seconds : 0.0;
  row.step_ms = 1000.0 * step_seconds / steps;
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
