// Where `mpiformer prepare` writes, all or nothing: the names of a shard
// set's files, and the output directory while prepare works in it. Rank 0
// creates the directory and locks it (DIR/.lock) until the end, so a second
// prepare into it is refused; every rank writes under temporary names and
// renames only when every rank has succeeded; on any failure every rank
// removes what it wrote, so the directory never holds a partial shard set.
// A stop signal ends prepare at once (src/io/stop_cleanup.h): what each
// rank wrote, renamed or not, the lock, and the directory if prepare made it
// are removed on the way out.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "src/io/dir_lock.h"
#include "src/io/shard.h"
#include "src/io/stop_cleanup.h"

namespace mpiformer::prepare {

constexpr const char* kTrainPrefix = "train";
constexpr const char* kValidPrefix = "valid";
constexpr const char* kTestPrefix = "test";
constexpr const char* kTokenizerFile = "tokenizer.model";
// The training lines for SentencePiece, beside the shards while it trains.
constexpr const char* kTokenizerInputFile = "tokenizer-input.txt";
constexpr const char* kTokenizerTargetFile = "tokenizer-target.txt";

// "train-00003.h5"
std::string shard_name(const char* prefix, int64_t index);

// Whether `name` is one of the files prepare writes (shards, the tokenizer,
// the tokenizer's training text), whose temporaries it may clear.
bool is_prepare_file(const std::string& name);

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
    // Both: a stop during the renaming leaves neither (the final name was
    // checked free under the lock).
    RemovedOnStop temporary_on_stop, final_on_stop;
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

  // Rank 0, holding the lock: removes the temporaries of prepare's files
  // that a prepare no longer running (killed) left here; returns how many.
  // Nothing when the lock cannot be enforced: another may be writing.
  int remove_abandoned_temporaries();

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
  RemovedOnStop created_on_stop_;
  DirLock lock_;
  PendingFiles pending_;
};

}  // namespace mpiformer::prepare
