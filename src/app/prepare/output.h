// Where `mpiformer prepare` writes, all or nothing: the names of a shard
// set's files, and the output directory while prepare works in it. Rank 0
// creates the directory and locks it (DIR/.lock) until the end, so a second
// prepare into it is refused; every rank writes under temporary names and
// renames only when every rank has succeeded; on any failure every rank
// removes what it wrote, so the directory never holds a partial shard set.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "src/io/dir_lock.h"
#include "src/io/shard.h"

namespace mpiformer::prepare {

constexpr const char* kTrainPrefix = "train";
constexpr const char* kValidPrefix = "valid";
constexpr const char* kTestPrefix = "test";
constexpr const char* kTokenizerFile = "tokenizer.model";

// "train-00003.h5"
std::string shard_name(const char* prefix, int64_t index);

// Files this rank has written under temporary names, and their final names.
class PendingFiles {
 public:
  explicit PendingFiles(std::filesystem::path dir) : dir_(std::move(dir)) {}

  // Where to write `name` for now.
  std::string add(const std::string& name);

  // A fault message naming the file as the user will know it.
  std::string final_name_in(std::string message) const;

  // Durably: a crash after prepare's success line leaves the whole set.
  void commit();

  // Removes whatever this rank wrote, renamed or not.
  void remove_all();

 private:
  struct File {
    std::filesystem::path temporary, final_path;
    bool renamed;
  };
  std::filesystem::path dir_;
  std::vector<File> files_;
};

// The output directory (--out) of one prepare, on every rank.
class OutputDir {
 public:
  explicit OutputDir(const std::string& dir) : dir_(dir), path_(dir), pending_(path_) {}

  const std::filesystem::path& path() const { return path_; }

  // Rank 0: creates it (and its parents), remembering whether it did.
  void create();

  // Rank 0: locks it; "" or one line saying why not (DirLock::try_acquire).
  std::string lock() { return lock_.try_acquire(dir_); }

  // Writes `shard` as `name`, under its temporary name for now; a fault
  // names the file as the user will know it.
  void write_shard(const std::string& name, const Shard& shard);

  // Writes `bytes` as `name`, under its temporary name for now.
  void write_bytes(const std::string& name, const std::string& bytes);

  // Renames what this rank wrote to the final names.
  void commit() { pending_.commit(); }

  // Giving up is in two halves, so that every rank can remove what it wrote
  // before rank 0 lets the directory go: first this...
  void remove_written() { pending_.remove_all(); }
  // ...then the lock is dropped and the directory removed if this rank made
  // it (only if empty: never another's files).
  void let_go();

 private:
  std::string dir_;
  std::filesystem::path path_;
  bool created_ = false;
  DirLock lock_;
  PendingFiles pending_;
};

}  // namespace mpiformer::prepare
