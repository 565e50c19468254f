#include "src/train/run_directory.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <random>
#include <stdexcept>
#include <vector>

#include "src/core/error.h"
#include "src/core/run_log.h"
#include "src/io/atomic_file.h"
#include "src/io/metrics.h"

namespace mpiformer {

namespace {

namespace fs = std::filesystem;

// RUNDIR/abandoned/<UTC time>, made unique with a suffix.
fs::path new_abandoned_dir(const fs::path& rundir) {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", &utc);
  fs::path dir = rundir / "abandoned" / stamp;
  for (int n = 2; fs::exists(dir); ++n) {
    dir = rundir / "abandoned" / (std::string(stamp) + "-" + std::to_string(n));
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw std::runtime_error(dir.string() + ": cannot create (" + ec.message() + ")");
  return dir;
}

// PATH made absolute, without "." or ".." parts or a trailing separator.
fs::path absolute_path(const std::string& path, std::error_code& ec) {
  fs::path p = fs::absolute(path, ec).lexically_normal();
  if (!p.has_filename() && p.has_parent_path()) p = p.parent_path();
  return p;
}

bool same_file(const fs::path& a, const fs::path& b) {
  std::error_code ec;
  return fs::equivalent(a, b, ec);
}

// The value of config.ini's record line "# KEY = value", or "".
std::string config_record(const fs::path& config_ini, const std::string& key) {
  std::ifstream in(config_ini);
  const std::string prefix = "# " + key + " = ";
  for (std::string line; std::getline(in, line);) {
    if (line.compare(0, prefix.size(), prefix) == 0) return line.substr(prefix.size());
  }
  return "";
}

// 64 random bits as 16 hex digits: unique among runs for any practical count.
std::string new_run_id() {
  std::random_device device;
  const uint64_t bits = (uint64_t{device()} << 32) ^ device();
  char id[17];
  std::snprintf(id, sizeof id, "%016llx", static_cast<unsigned long long>(bits));
  return id;
}

// The run id a checkpoint records; "" when it records none or cannot be read
// (a damaged file is the resume's concern, not this check's).
std::string run_id_of(const std::string& checkpoint) {
  try {
    return read_checkpoint_state(checkpoint).run_id;
  } catch (const CheckpointError&) {
    return "";
  }
}

}  // namespace

Verdict RunDirectory::open() {
  std::error_code ec;
  // What does not exist yet, from the outermost missing directory down, is ours.
  for (fs::path p = absolute_path(path_, ec); !ec && !fs::exists(p, ec); p = p.parent_path()) {
    created_ = p.string();
    if (p == p.parent_path()) break;
  }
  fs::create_directories(path_, ec);
  if (ec || !fs::is_directory(path_)) {
    return {kExitUsage, "mpiformer train: --out: cannot use " + path_ + " as the run directory (" +
                            (ec ? ec.message() : std::string("not a directory")) + ")"};
  }
  const std::string refused = lock_.try_acquire(path_);
  if (!refused.empty()) return {kExitUsage, "mpiformer train: --out: " + refused};
  return {};
}

void RunDirectory::withdraw() {
  lock_.release();
  if (created_.empty()) return;
  std::error_code ec;
  // fs::remove leaves a directory that is not empty, and so do we.
  for (fs::path p = absolute_path(path_, ec); !ec && fs::remove(p, ec) && p.string() != created_;
       p = p.parent_path()) {
  }
  created_.clear();
}

namespace {

// --resume auto's candidates: `latest`, then older checkpoints; later ones
// belong to a branch that was given up (make_head moves them away).
Verdict auto_candidates(const std::string& rundir, const std::vector<std::string>& found,
                        std::vector<std::string>* candidates) {
  std::string head;
  try {
    head = read_latest(rundir);
  } catch (const CheckpointError& e) {
    return {kExitUsage, "mpiformer train: --resume auto: " + std::string(e.what())};
  }
  if (!head.empty()) candidates->push_back(head);
  const int64_t head_step = head.empty() ? INT64_MAX : checkpoint_step(head);
  for (const std::string& path : found) {
    if (checkpoint_step(path) < head_step) candidates->push_back(path);
  }
  return {};
}

// Reads a candidate's layout into *start; false when it cannot be read: a
// refusal in *refusal, or under --resume auto (refusal left empty) a line
// on stderr, so that the caller takes the one before.
bool read_start(const std::string& path, bool auto_resume, StartPoint* start, Verdict* refusal) {
  try {
    // Names, shapes and attributes: the ranks read the data (restore).
    start->checkpoint = read_checkpoint_layout(path);
  } catch (const CheckpointError& e) {
    if (!auto_resume) {
      *refusal = {kExitUsage, std::string("mpiformer train: --resume: cannot resume: ") + e.what()};
      return false;
    }
    // A newest checkpoint that is damaged: say so and take the one before.
    say(stderr, "[rank 0] skipping a damaged checkpoint: %s\n", e.what());
    std::fflush(stderr);
    return false;
  }
  start->state = start->checkpoint.state;
  start->resumed = true;
  return true;
}

}  // namespace

Verdict RunDirectory::choose_start(const std::string& resume, bool other_run, StartPoint* start) {
  const fs::path rundir(path_);
  StartSearch search;
  search.found = list_checkpoints(path_);
  const fs::path metrics = rundir / "metrics.h5";
  std::error_code ec;
  search.has_metrics = fs::exists(metrics, ec);
  // The run the directory holds: config.ini says, else metrics.h5 (else,
  // below, the checkpoint resumed; a directory of an earlier version, none).
  run_id_ = config_record(rundir / "config.ini", "run-id");
  origin_ = config_record(rundir / "config.ini", "started-from");
  search.recorded_in = "config.ini";
  if (resume == "none") {
    if (!search.found.empty() || search.has_metrics) {
      return {kExitUsage, "mpiformer train: --out: " + path_ +
                              " already holds a run; continue it with --resume auto, or choose "
                              "another --out"};
    }
    return {};
  }
  const bool auto_resume = resume == "auto";
  search.flag = auto_resume ? "--resume auto" : "--resume";
  if (search.has_metrics) {
    const Verdict refused = learn_metrics_run(metrics.string(), &search);
    if (refused.code != 0) return refused;
  }
  std::vector<std::string> candidates;
  if (!auto_resume) {
    candidates.push_back(resume);
  } else {
    const Verdict refused = auto_candidates(path_, search.found, &candidates);
    if (refused.code != 0) return refused;
  }
  for (const std::string& path : candidates) {
    if (std::find(damaged_.begin(), damaged_.end(), path) != damaged_.end()) continue;
    Verdict refused;
    if (!read_start(path, auto_resume, start, &refused)) {
      if (refused.code != 0) return refused;
      continue;
    }
    return auto_resume ? check_branch(path, start->state, &search)
                       : check_named_start(path, start->state, other_run, search);
  }
  if (!candidates.empty()) {
    return {kExitFailure, "cannot resume: none of the " + std::to_string(candidates.size()) +
                              " checkpoint(s) in " + (rundir / "checkpoints").string() +
                              " is readable"};
  }
  return {};
}

Verdict RunDirectory::refuse_foreign(const StartSearch& search, const std::string& file,
                                     const std::string& what, const std::string& id,
                                     const std::string& remedy) const {
  return Verdict{kExitUsage, "mpiformer train: " + search.flag + ": " + file + " " + what +
                                 " of run " + id + ", but " + path_ + " holds run " + run_id_ +
                                 " (" + search.recorded_in + "); " + remedy};
}

Verdict RunDirectory::learn_metrics_run(const std::string& metrics, StartSearch* search) {
  std::string metrics_id;
  try {
    metrics_id = read_metrics(metrics).attrs.run_id;
  } catch (const MetricsError&) {
    // A damaged file is refused when the run opens it.
  }
  if (run_id_.empty()) {
    run_id_ = metrics_id;
    search->recorded_in = "metrics.h5";
  } else if (!metrics_id.empty() && metrics_id != run_id_) {
    return refuse_foreign(*search, metrics, "holds the metrics", metrics_id,
                          "move it away or choose another --out");
  }
  return {};
}

Verdict RunDirectory::check_branch(const std::string& path, const CheckpointState& state,
                                   StartSearch* search) {
  // The head and the later checkpoints make_head would move aside as this
  // run's branch must all be this run's.
  if (run_id_.empty()) {
    run_id_ = state.run_id;
    search->recorded_in = path;
  }
  for (const std::string& other : search->found) {
    if (other != path && checkpoint_step(other) <= state.step) continue;
    const std::string other_id = other == path ? state.run_id : run_id_of(other);
    if (!other_id.empty() && !run_id_.empty() && other_id != run_id_) {
      return refuse_foreign(*search, other, "is a checkpoint", other_id,
                            "move it out of " + (fs::path(path_) / "checkpoints").string() +
                                ", or continue that run in a new --out with --resume PATH");
    }
  }
  return {};
}

Verdict RunDirectory::check_named_start(const std::string& path, const CheckpointState& state,
                                        bool other_run, const StartSearch& search) {
  const std::string& id = state.run_id;
  if (id.empty() || id == run_id_) return {};
  // A checkpoint of another run: into a directory that holds a run only
  // when asked; a new directory starts a run of its own either way.
  if (!run_id_.empty() && (!search.found.empty() || search.has_metrics) && !other_run) {
    return refuse_foreign(search, path, "is a checkpoint", id,
                          "continue that run here with --resume-other-run, or choose "
                          "a new --out");
  }
  origin_ = path + " (run " + id + ", step " + std::to_string(state.step) + ")";
  return {};
}

std::string RunDirectory::make_head(const StartPoint& start) {
  const fs::path rundir(path_), checkpoints = rundir / "checkpoints";
  if (run_id_.empty()) run_id_ = new_run_id();
  const int64_t head_step = start.resumed ? start.state.step : 0;
  std::vector<std::string> later;
  for (const std::string& path : list_checkpoints(path_)) {
    if (checkpoint_step(path) > head_step) later.push_back(path);
  }
  std::string line;
  if (!later.empty()) {
    const fs::path dest = new_abandoned_dir(rundir);
    for (const char* file : {"metrics.h5", "config.ini"}) {
      std::error_code ec;
      if (fs::exists(rundir / file, ec)) {
        fs::copy_file(rundir / file, dest / file, ec);
        if (ec) {
          throw std::runtime_error((dest / file).string() + ": cannot copy " +
                                   (rundir / file).string() + " (" + ec.message() + ")");
        }
        fsync_file((dest / file).string());
      }
    }
    for (const std::string& path : later) {
      std::error_code ec;
      fs::rename(path, dest / fs::path(path).filename(), ec);
      if (ec) {
        throw std::runtime_error(path + ": cannot move to " + dest.string() + " (" + ec.message() +
                                 ")");
      }
    }
    fsync_dir(dest.string());
    fsync_dir(checkpoints.string());
    line = "a new branch from step " + std::to_string(head_step) + ": " +
           std::to_string(later.size()) + " later checkpoint(s) (steps " +
           std::to_string(checkpoint_step(later.back())) + " to " +
           std::to_string(checkpoint_step(later.front())) + ") and a copy of metrics.h5 moved to " +
           dest.string();
  }
  // `latest` names the head when it is one of this run's step_*.h5 files
  // (not an average beside them); one naming a file that moved away is dropped.
  if (start.resumed && checkpoint_step(start.checkpoint.path) >= 0 &&
      same_file(fs::path(start.checkpoint.path).parent_path(), checkpoints)) {
    point_latest_at(path_, start.checkpoint.path);
  } else if (fs::exists(checkpoints / "latest") && latest().empty()) {
    std::error_code ec;
    fs::remove(checkpoints / "latest", ec);
  }
  return line;
}

int RunDirectory::remove_unfinished_writes() {
  std::vector<fs::path> unfinished;
  std::error_code ec;
  for (const fs::path& dir : {fs::path(path_), fs::path(path_) / "checkpoints"}) {
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      std::string final_name;
      if (abandoned_temporary(name, &final_name) || older_temporary(name)) {
        unfinished.push_back(it->path());
      }
    }
  }
  int removed = 0;
  for (const fs::path& path : unfinished) removed += fs::remove(path, ec) ? 1 : 0;
  return removed;
}

}  // namespace mpiformer
