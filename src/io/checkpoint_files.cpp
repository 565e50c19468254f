// The checkpoints of a run directory: their names (step_XXXXXXXX.h5),
// `latest`, and the pruning to the newest K (src/io/checkpoint.h).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "src/io/atomic_file.h"
#include "src/io/checkpoint.h"
#include "src/io/checkpoint_layout.h"
#include "src/io/hdf5_file.h"

namespace mpiformer {

namespace {

namespace fs = std::filesystem;
using hdf5::Faults;

}  // namespace

std::string checkpoint_path_for(const std::string& rundir, int64_t step) {
  const fs::path dir = fs::path(rundir) / "checkpoints";
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    checkpoint_faults(dir.string()).fail("cannot create the directory (" + ec.message() + ")");
  if (step < 0) {
    checkpoint_faults(dir.string())
        .fail("cannot write a checkpoint of step " + std::to_string(step));
  }
  char name[32];
  std::snprintf(name, sizeof name, "step_%08lld.h5", static_cast<long long>(step));
  return (dir / name).string();
}

void prune_checkpoints(const std::string& rundir, const std::string& kept, int keep_last) {
  if (keep_last <= 0) return;
  // Older step_*.h5 by step number; pruning is best effort, a file that will
  // not go is left for the next save.
  std::vector<std::string> others = list_checkpoints(rundir);
  others.erase(std::remove(others.begin(), others.end(), kept), others.end());
  std::error_code ec;
  for (size_t i = static_cast<size_t>(keep_last) - 1; i < others.size(); ++i) {
    fs::remove(others[i], ec);
  }
}

std::vector<std::string> list_checkpoints(const std::string& rundir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  const fs::path dir = fs::path(rundir) / "checkpoints";
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const int64_t step = checkpoint_step(it->path().string());
    if (step >= 0) found.emplace_back(step, it->path().string());
  }
  std::sort(found.begin(), found.end(), std::greater<>());
  std::vector<std::string> paths;
  for (auto& [step, path] : found) paths.push_back(std::move(path));
  return paths;
}

int64_t checkpoint_step(const std::string& path) {
  const std::string file = fs::path(path).filename().string();
  if (file.size() <= 8 || file.compare(0, 5, "step_") != 0 ||
      file.compare(file.size() - 3, 3, ".h5") != 0) {
    return -1;
  }
  const std::string digits = file.substr(5, file.size() - 8);
  if (digits.empty() || digits.size() > 18 ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return -1;
  }
  return std::stoll(digits);
}

std::string latest_checkpoint(const std::string& rundir) {
  const fs::path dir = fs::path(rundir) / "checkpoints";
  std::ifstream in(dir / "latest");
  std::string name;
  if (!in || !std::getline(in, name) || checkpoint_step(name) < 0 ||
      name.find('/') != std::string::npos) {
    return "";
  }
  std::error_code ec;
  return fs::is_regular_file(dir / name, ec) ? (dir / name).string() : "";
}

std::string read_latest(const std::string& rundir) {
  const fs::path dir = fs::path(rundir) / "checkpoints", file = dir / "latest";
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(file, ec))) return "";
  const Faults faults = checkpoint_faults(file.string());
  std::ifstream in(file);
  if (!in) faults.fail_errno("cannot read");
  std::string name;
  std::getline(in, name);
  const std::string hint = "; point it at a checkpoint of this run or remove it";
  if (name.empty()) faults.fail("is empty (it should name the head checkpoint of the run)" + hint);
  if (name.find('/') != std::string::npos) {
    faults.fail("names '" + name + "', outside " + dir.string() + hint);
  }
  if (checkpoint_step(name) < 0) {
    faults.fail("names '" + name + "', which is not a checkpoint file (step_NNNNNNNN.h5)" + hint);
  }
  const fs::path path = dir / name;
  if (!fs::exists(path, ec)) faults.fail("names " + name + ", which does not exist" + hint);
  // A link that leads out of the directory is a file of another run.
  const fs::path real = fs::canonical(path, ec);
  if (ec || real.parent_path() != fs::canonical(dir, ec)) {
    faults.fail("names " + name + ", a link to " + (ec ? std::string("nowhere") : real.string()) +
                " outside " + dir.string() + hint);
  }
  if (!fs::is_regular_file(real, ec)) faults.fail("names " + name + ", which is not a file" + hint);
  return path.string();
}

void point_latest_at(const std::string& rundir, const std::string& path) {
  const fs::path dir = fs::path(rundir) / "checkpoints";
  const std::string name = fs::path(path).filename().string();
  durably([&] { write_file_atomically((dir / "latest").string(), name + "\n"); });
}

}  // namespace mpiformer
