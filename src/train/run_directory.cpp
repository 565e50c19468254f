#include "src/train/run_directory.h"

#include <cstdint>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <stdexcept>
#include <vector>

#include "src/core/error.h"
#include "src/core/run_log.h"
#include "src/io/atomic_file.h"

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

Verdict RunDirectory::choose_start(const std::string& resume, StartPoint* start) const {
  const fs::path rundir(path_);
  const std::vector<std::string> found = list_checkpoints(path_);
  if (resume == "none") {
    if (!found.empty() || fs::exists(rundir / "metrics.h5")) {
      return {kExitUsage, "mpiformer train: --out: " + path_ +
                              " already holds a run; continue it with --resume auto, or choose "
                              "another --out"};
    }
    return {};
  }
  // auto: `latest`, then older checkpoints; later ones belong to a branch
  // that was given up (make_head moves them away).
  std::vector<std::string> candidates;
  if (resume != "auto") {
    candidates.push_back(resume);
  } else {
    const std::string head = latest();
    if (!head.empty()) candidates.push_back(head);
    const int64_t head_step = head.empty() ? INT64_MAX : checkpoint_step(head);
    for (const std::string& path : found) {
      if (checkpoint_step(path) < head_step) candidates.push_back(path);
    }
  }
  for (const std::string& path : candidates) {
    try {
      start->checkpoint = read_checkpoint(path);
      start->state = start->checkpoint.state;
      start->resumed = true;
      return {};
    } catch (const CheckpointError& e) {
      if (resume != "auto") return {kExitFailure, std::string("cannot resume: ") + e.what()};
      // A newest checkpoint that is damaged: say so and take the one before.
      say(stderr, "[rank 0] skipping a damaged checkpoint: %s\n", e.what());
      std::fflush(stderr);
    }
  }
  if (!candidates.empty()) {
    return {kExitFailure, "cannot resume: none of the " + std::to_string(candidates.size()) +
                              " checkpoint(s) in " + (rundir / "checkpoints").string() +
                              " is readable"};
  }
  return {};
}

std::string RunDirectory::make_head(const StartPoint& start) {
  const fs::path rundir(path_), checkpoints = rundir / "checkpoints";
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
  // `latest` names the head when it is one of this run's files; one naming
  // a file that moved away is dropped.
  if (start.resumed && same_file(fs::path(start.checkpoint.path).parent_path(), checkpoints)) {
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
  const fs::path checkpoints = fs::path(path_) / "checkpoints";
  for (fs::directory_iterator it(checkpoints, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0) {
      unfinished.push_back(it->path());
    }
  }
  int removed = 0;
  for (const fs::path& path : unfinished) removed += fs::remove(path, ec) ? 1 : 0;
  return removed;
}

}  // namespace mpiformer
