#include "src/train/model_choice.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "src/io/atomic_file.h"
#include "src/io/checkpoint.h"

namespace mpiformer {

namespace {

namespace fs = std::filesystem;

constexpr const char* kHistoryHeader = "# step\tmetric\tvalue (mpiformer train's evaluations)";

// `to` becomes another name of `from` (a hard link; a copy where the file
// system has none), replacing what was there.
void link_or_copy(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  if (fs::equivalent(from, to, ec)) return;  // rename() would leave the temporary
  const fs::path tmp = temporary_name(to.string());
  fs::remove(tmp, ec);
  if (::link(from.c_str(), tmp.c_str()) != 0) {
    fs::copy_file(from, tmp, ec);
    if (ec) {
      throw std::runtime_error(to.string() + ": cannot link or copy " + from.string() + " (" +
                               ec.message() + ")");
    }
  }
  fs::rename(tmp, to, ec);
  if (ec) throw std::runtime_error(to.string() + ": cannot write (" + ec.message() + ")");
}

// Steps of the checkpoints in `dir` (step_X.h5), ascending.
std::vector<int64_t> kept_steps(const fs::path& dir) {
  std::vector<int64_t> steps;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const int64_t step = checkpoint_step(it->path().string());
    if (step >= 0) steps.push_back(step);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

}  // namespace

fs::path ModelChoice::kept_path(int64_t step) const {
  // The run's own name for the checkpoint of `step`, in best/.
  const fs::path rundir = fs::path(dir_).parent_path();
  return fs::path(dir_) / "best" / fs::path(checkpoint_path_for(rundir.string(), step)).filename();
}

ModelChoice::ModelChoice(const std::string& rundir, const std::string& metric, int keep_best,
                         int64_t resumed_step)
    : dir_((fs::path(rundir) / "checkpoints").string()), metric_(metric), keep_best_(keep_best) {
  std::error_code ec;
  fs::create_directories(fs::path(dir_) / "best", ec);
  if (ec) throw std::runtime_error(dir_ + "/best: cannot create (" + ec.message() + ")");
  const fs::path history = fs::path(dir_) / "validation.tsv";
  bool dropped = false;
  if (fs::exists(history, ec)) {
    std::ifstream in(history);
    if (!in) throw std::runtime_error(history.string() + ": cannot read");
    std::string line;
    for (int number = 1; std::getline(in, line); ++number) {
      if (line.empty() || line[0] == '#') continue;
      std::istringstream fields(line);
      ValidationScore score;
      std::string name;
      if (!(fields >> score.step >> name >> score.value)) {
        throw std::runtime_error(history.string() + " line " + std::to_string(number) +
                                 ": not 'step metric value'; remove the file to start the "
                                 "record anew");
      }
      // Rows of a given-up branch, or of the other metric, are not this record's.
      if (score.step > resumed_step || name != metric_) {
        dropped = true;
        continue;
      }
      history_.push_back(score);
    }
  }
  if (dropped) write_history();
  // Kept files of evaluations no longer in the record go.
  const fs::path best_dir = fs::path(dir_) / "best";
  for (int64_t step : kept_steps(best_dir)) {
    const bool recorded = std::any_of(history_.begin(), history_.end(),
                                      [&](const ValidationScore& s) { return s.step == step; });
    if (!recorded) fs::remove(kept_path(step), ec);
  }
  refresh_links();
}

bool ModelChoice::better(double a, double b) const {
  if (std::isnan(a)) return false;
  if (std::isnan(b)) return true;
  return metric_ == "bleu" ? a > b : a < b;
}

std::vector<ValidationScore> ModelChoice::ranked() const {
  const std::vector<int64_t> steps = kept_steps(fs::path(dir_) / "best");
  std::vector<ValidationScore> kept;
  for (const ValidationScore& s : history_) {
    if (std::binary_search(steps.begin(), steps.end(), s.step)) kept.push_back(s);
  }
  std::stable_sort(
      kept.begin(), kept.end(),
      [&](const ValidationScore& a, const ValidationScore& b) { return better(a.value, b.value); });
  return kept;
}

bool ModelChoice::would_keep(double value) const {
  if (keep_best_ <= 0 || std::isnan(value)) return false;
  const std::vector<ValidationScore> kept = ranked();
  return static_cast<int>(kept.size()) < keep_best_ || better(value, kept.back().value);
}

void ModelChoice::record(int64_t step, double value, const std::string& checkpoint) {
  const bool keep = would_keep(value) && !checkpoint.empty();
  history_.push_back({step, value});
  write_history();
  if (keep) {
    link_or_copy(checkpoint, kept_path(step));
  }
  refresh_links();
}

void ModelChoice::refresh_links() const {
  std::vector<ValidationScore> kept = ranked();
  std::error_code ec;
  for (size_t i = std::max(keep_best_, 0); i < kept.size(); ++i) {
    fs::remove(kept_path(kept[i].step), ec);
  }
  const fs::path best = fs::path(dir_) / "best.h5";
  if (kept.empty() || keep_best_ <= 0) {
    fs::remove(best, ec);
  } else {
    link_or_copy(kept_path(kept.front().step), best);
  }
}

void ModelChoice::write_history() const {
  std::string text = std::string(kHistoryHeader) + "\n";
  char line[96];
  for (const ValidationScore& s : history_) {
    std::snprintf(line, sizeof line, "%lld\t%s\t%.17g\n", static_cast<long long>(s.step),
                  metric_.c_str(), s.value);
    text += line;
  }
  write_file_atomically((fs::path(dir_) / "validation.tsv").string(), text);
}

ValidationScore ModelChoice::best() const {
  ValidationScore best;
  for (const ValidationScore& s : history_) {
    if (best.step == 0 || better(s.value, best.value)) best = s;
  }
  return best;
}

int ModelChoice::evaluations_since_best() const {
  const ValidationScore b = best();
  int since = 0;
  for (const ValidationScore& s : history_) since = s.step > b.step ? since + 1 : 0;
  return since;
}

std::string ModelChoice::describe(const ValidationScore& score) const {
  char text[96];
  std::snprintf(text, sizeof text,
                metric_ == "bleu" ? "BLEU %.2f at step %lld" : "nll %.4f at step %lld", score.value,
                static_cast<long long>(score.step));
  return text;
}

}  // namespace mpiformer
