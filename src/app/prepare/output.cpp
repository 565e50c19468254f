// The output directory of prepare, all or nothing (output.h): shard names,
// the files each rank has pending under temporary names, their renaming
// once every rank has succeeded, and the rollback when one has not.
#include "src/app/prepare/output.h"

#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <utility>

#include "src/io/atomic_file.h"

namespace mpiformer::prepare {

namespace fs = std::filesystem;

std::string shard_name(const char* prefix, int64_t index) {
  char name[64];
  std::snprintf(name, sizeof(name), "%s-%05lld.h5", prefix, static_cast<long long>(index));
  return name;
}

bool is_prepare_file(const std::string& name) {
  for (const char* prefix : {kTrainPrefix, kValidPrefix, kTestPrefix}) {
    const std::string head = std::string(prefix) + "-";
    if (name.size() > head.size() + 3 && name.compare(0, head.size(), head) == 0 &&
        name.compare(name.size() - 3, 3, ".h5") == 0 &&
        name.find_first_not_of("0123456789", head.size()) == name.size() - 3) {
      return true;
    }
  }
  return name == kTokenizerFile || name == kTokenizerInputFile || name == kTokenizerTargetFile;
}

std::string PendingFiles::add(const std::string& name) {
  const fs::path final_path = dir_ / name;
  const fs::path temporary = temporary_name(final_path.string());
  files_.push_back({temporary, final_path, false, RemovedOnStop(temporary.string()),
                    RemovedOnStop(final_path.string())});
  return temporary.string();
}

std::string PendingFiles::final_name_in(std::string message) const {
  for (const auto& f : files_) {
    const std::string t = f.temporary.string();
    if (const size_t at = message.find(t); at != std::string::npos) {
      message.replace(at, t.size(), f.final_path.string());
    }
  }
  return message;
}

void PendingFiles::commit() {
  for (auto& f : files_) {
    fsync_file(f.temporary.string());
    commit_file(f.temporary.string(), f.final_path.string());
    f.renamed = true;
  }
}

void PendingFiles::remove_all() {
  for (const auto& f : files_) {
    std::error_code ec;
    fs::remove(f.temporary, ec);
    if (f.renamed) fs::remove(f.final_path, ec);
  }
  files_.clear();
}

void OutputDir::create() {
  std::error_code ec;
  // Registered before it is made: a stop in between would leave it behind.
  // A stop removes it only if empty.
  if (!fs::exists(path_, ec)) created_on_stop_ = RemovedOnStop(dir_, true);
  created_ = fs::create_directories(path_, ec);
  if (ec) throw std::runtime_error(dir_ + ": cannot create (" + ec.message() + ")");
  if (!created_) created_on_stop_.forget();
}

int OutputDir::remove_abandoned_temporaries() {
  if (!lock_.enforced()) return 0;
  int removed = 0;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(path_, ec)) {
    std::string final_name;
    if (abandoned_temporary(e.path().filename().string(), &final_name) &&
        is_prepare_file(final_name) && e.is_regular_file(ec) && fs::remove(e.path(), ec)) {
      ++removed;
    }
  }
  return removed;
}

void OutputDir::write_shard(const std::string& name, const Shard& shard) {
  const std::string path = pending_.add(name);
  try {
    mpiformer::write_shard(path, shard);
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(pending_.final_name_in(e.what()));
  }
}

void OutputDir::write_bytes(const std::string& name, const std::string& bytes) {
  const std::string path = pending_.add(name);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) throw std::runtime_error(path + ": cannot write");
}

void OutputDir::let_go() {
  lock_.release();
  created_on_stop_.forget();
  if (created_) {
    std::error_code ec;
    fs::remove(path_, ec);
  }
}

}  // namespace mpiformer::prepare
