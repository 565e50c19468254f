// mpiformer prepare: raw text (or a line-aligned parallel pair) to HDF5 token
// shards, over MPI ranks.
//
//   1. rank 0 validates the inputs; every rank agrees on the verdict before
//      any work (exit 2, one line naming the file and the fault);
//   2. every rank reads the text; rank 0 creates the output directory and
//      locks it (DIR/.lock) until the end, so a second prepare into it is
//      refused; rank 0 trains the SentencePiece model (or loads --tokenizer)
//      and broadcasts its bytes;
//   3. shard s holds the s-th contiguous block of the training sequences;
//      in round k rank r encodes and writes shard k*W + r, and rank 0 reports
//      the round; then rank 0 writes the validation shard and tokenizer.model;
//   4. everything is written under temporary names and renamed only when
//      every rank has succeeded; on any failure every rank removes what it
//      wrote, so the output directory never holds a partial shard set.
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "src/app/commands.h"
#include "src/core/error.h"
#include "src/data/tokenizer.h"
#include "src/io/atomic_file.h"
#include "src/io/dir_lock.h"
#include "src/io/shard.h"

namespace mpiformer {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr const char* kTrainPrefix = "train";
constexpr const char* kValidPrefix = "valid";
constexpr const char* kTokenizerFile = "tokenizer.model";

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string shard_name(const char* prefix, int64_t index) {
  char name[64];
  std::snprintf(name, sizeof(name), "%s-%05lld.h5", prefix, static_cast<long long>(index));
  return name;
}

// 1234567 -> "1,234,567": the summary's figures are read by people.
std::string grouped(int64_t n) {
  std::string digits = std::to_string(n < 0 ? -n : n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return (n < 0 ? "-" : "") + out;
}

bool is_blank(const std::string& line) {
  return line.find_first_not_of(" \t\r\v\f") == std::string::npos;
}

// Every line of a text file, without its line ending (LF or CRLF).
std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot read");
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(std::move(line));
  }
  if (in.bad()) throw std::runtime_error(path + ": read error");
  return lines;
}

// ---- agreement ---------------------------------------------------------------

// Runs `step` on rank 0 only; every rank learns whether it failed. Rank 0
// prints the fault as a usage line: these are faults of the given files and
// values, found before any work.
bool root_validates(const Communicator& comm, const std::function<void()>& step) {
  bool failed = false;
  if (comm.is_root()) {
    try {
      step();
    } catch (const std::exception& e) {
      std::cerr << "mpiformer prepare: " << e.what() << std::endl;
      failed = true;
    }
  }
  return !comm.any(failed);
}

// Runs `step` on every rank; every rank learns whether any rank failed. A
// failing rank prints "[rank r] message".
bool all_succeed(const Communicator& comm, const std::function<void()>& step) {
  bool failed = false;
  try {
    step();
  } catch (const std::exception& e) {
    std::cerr << "[rank " << comm.rank() << "] " << e.what() << std::endl;
    failed = true;
  }
  return !comm.any(failed);
}

// A barrier that sleeps instead of spinning: while rank 0 trains the
// tokenizer alone, the waiting ranks leave their cores to its threads.
void barrier_without_spinning() {
  MPI_Request request;
  MPI_Ibarrier(MPI_COMM_WORLD, &request);
  int done = 0;
  for (MPI_Test(&request, &done, MPI_STATUS_IGNORE); !done;
       MPI_Test(&request, &done, MPI_STATUS_IGNORE)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

// Rank 0's string on every rank (MPI_Bcast of the size, then the bytes).
void broadcast_from_root(std::string* bytes) {
  uint64_t size = bytes->size();
  MPI_Bcast(&size, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  bytes->resize(size);
  constexpr uint64_t kChunk = uint64_t{1} << 30;  // MPI counts are int
  for (uint64_t at = 0; at < size; at += kChunk) {
    const int n = static_cast<int>(std::min(kChunk, size - at));
    MPI_Bcast(bytes->data() + at, n, MPI_CHAR, 0, MPI_COMM_WORLD);
  }
}

// ---- validation (rank 0) -----------------------------------------------------

// A pipe or device is refused before it is opened: opening a pipe blocks
// until it has a writer, and what it gives is gone once read. `why`, when
// given, says who reads the file twice.
void require_readable_file(const std::string& flag, const std::string& path,
                           const std::string& why = "") {
  std::error_code ec;
  if (!fs::exists(path, ec)) usage_error(flag, path + ": no such file");
  if (fs::is_directory(path, ec)) usage_error(flag, path + ": is a directory, not a file");
  if (!fs::is_regular_file(path, ec)) {
    usage_error(flag, path + " is not a regular file" + (why.empty() ? "" : " (" + why + ")"));
  }
  if (!std::ifstream(path, std::ios::binary)) usage_error(flag, path + ": cannot read");
}

// Every rank reads the text, and SentencePiece reads it again.
void require_text_file(const std::string& flag, const std::string& path) {
  require_readable_file(flag, path, "SentencePiece reads it more than once");
}

void require_fresh_output(const std::string& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) return;
  if (!fs::is_directory(dir, ec)) usage_error("--out", dir + ": exists and is not a directory");
  if (!list_shards(dir, kTrainPrefix).empty() || !list_shards(dir, kValidPrefix).empty() ||
      fs::exists(fs::path(dir) / kTokenizerFile, ec)) {
    usage_error("--out", dir + " already holds shards; choose another directory");
  }
}

// The --tokenizer model's bytes, after checking it keeps mpiformer's ids.
std::string load_given_tokenizer(const PrepareConfig& cfg) {
  require_readable_file("--tokenizer", cfg.tokenizer);
  std::unique_ptr<Tokenizer> tokenizer;
  try {
    tokenizer = Tokenizer::from_file(cfg.tokenizer);
  } catch (const std::runtime_error& e) {
    usage_error("--tokenizer", e.what());
  }
  const std::string mismatch = tokenizer->special_ids_mismatch();
  if (!mismatch.empty()) {
    usage_error("--tokenizer", cfg.tokenizer + ": its special ids differ from mpiformer's (" +
                                   mismatch + "); train one with `mpiformer prepare`");
  }
  if (cfg.vocab_size != 0 && cfg.vocab_size != tokenizer->vocab_size()) {
    usage_error("--vocab-size", std::to_string(cfg.vocab_size) + ", but --tokenizer " +
                                    cfg.tokenizer + " has " +
                                    std::to_string(tokenizer->vocab_size()) + " pieces");
  }
  return tokenizer->model_bytes();
}

// ---- the corpus --------------------------------------------------------------

// At most one line (pair) in kHoldOut is held out for validation.
constexpr size_t kHoldOut = 10;

// SentencePiece trains only on lines up to this many bytes (its
// max_sentence_length) and skips longer ones; they are still encoded. A
// longer limit would let one huge line stall training for minutes.
constexpr size_t kLongestTrainedLine = kTrainedLineLimit;

struct Corpus {
  std::vector<std::string> input, target;  // all lines; target empty for lm
  std::vector<size_t> sequences;           // line numbers (0-based) of the usable lines/pairs
  size_t blank = 0;                        // lines (pairs) skipped because a side was blank
  size_t valid = 0;                        // the last `valid` sequences are held out
  size_t too_long = 0;  // usable sequences with a side longer than kLongestTrainedLine
  size_t train() const { return sequences.size() - valid; }
};

void select_sequences(const PrepareConfig& cfg, Corpus* c) {
  const bool seq2seq = cfg.kind == "seq2seq";
  for (size_t i = 0; i < c->input.size(); ++i) {
    const bool usable = !is_blank(c->input[i]) && !(seq2seq && is_blank(c->target[i]));
    if (usable) {
      c->sequences.push_back(i);
      if (c->input[i].size() > kLongestTrainedLine ||
          (seq2seq && c->target[i].size() > kLongestTrainedLine)) {
        ++c->too_long;
      }
    } else {
      ++c->blank;
    }
  }
  // At most a tenth is held out, so training always keeps at least one.
  c->valid = std::min<size_t>(static_cast<size_t>(cfg.valid_lines), c->sequences.size() / kHoldOut);
}

void validate_corpus(const PrepareConfig& cfg, const Corpus& c) {
  const bool seq2seq = cfg.kind == "seq2seq";
  const auto all_blank = [](const std::vector<std::string>& lines) {
    return std::all_of(lines.begin(), lines.end(), is_blank);
  };
  if (all_blank(c.input))
    throw std::runtime_error(cfg.input + ": empty input (no non-blank lines)");
  if (seq2seq) {
    if (all_blank(c.target)) {
      throw std::runtime_error(cfg.target + ": empty input (no non-blank lines)");
    }
    if (c.target.size() != c.input.size()) {
      usage_error("--target", cfg.target + " has " + std::to_string(c.target.size()) +
                                  " lines but --input " + cfg.input + " has " +
                                  std::to_string(c.input.size()));
    }
    if (c.sequences.empty()) {
      throw std::runtime_error(cfg.input + " and " + cfg.target +
                               ": no line pair has both sides non-blank");
    }
  }
  // train --data refuses a set without a validation shard, so one is needed.
  if (c.valid == 0) {
    const size_t n = c.sequences.size();
    usage_error("--input", (seq2seq ? cfg.input + " and " + cfg.target : cfg.input) + " " +
                               (seq2seq ? "have " : "has ") + std::to_string(n) + " usable " +
                               (seq2seq ? "line pair" : "line") + (n == 1 ? "" : "s") +
                               "; at least " + std::to_string(kHoldOut) +
                               " are needed to hold one out for validation");
  }
  if (cfg.tokenizer.empty() && c.too_long == c.sequences.size()) {
    usage_error("--input", (seq2seq ? cfg.input + " and " + cfg.target : cfg.input) +
                               ": every line is longer than the " +
                               std::to_string(kLongestTrainedLine) +
                               " bytes a tokenizer trains on; put one sentence (or paragraph) "
                               "per line");
  }
  if (static_cast<size_t>(cfg.shards) > c.train()) {
    usage_error("--shards", std::to_string(cfg.shards) + " shards but only " +
                                std::to_string(c.train()) +
                                " training sequences; each shard needs at least one");
  }
}

// ---- encoding ----------------------------------------------------------------

struct ShardFigures {
  int64_t sequences = 0;
  int64_t tokens = 0;   // source and target
  int64_t skipped = 0;  // non-blank lines that encode to no token at all
  int64_t unknown = 0;  // unk tokens: characters the tokenizer lacks
};

// Encodes sequences [begin, end) of the corpus into one shard.
Shard encode_block(const PrepareConfig& cfg, const Corpus& c, const Tokenizer& tokenizer,
                   const ShardHeader& header, size_t begin, size_t end, ShardFigures* figures) {
  const bool seq2seq = cfg.kind == "seq2seq";
  const auto encode = [&](const std::string& file, const std::vector<std::string>& lines,
                          size_t line) {
    try {
      return tokenizer.encode(lines[line]);
    } catch (const std::runtime_error& e) {
      throw std::runtime_error(file + ":" + std::to_string(line + 1) + ": " + e.what());
    }
  };
  Shard shard;
  shard.header = header;
  for (size_t s = begin; s < end; ++s) {
    const size_t line = c.sequences[s];
    const std::vector<int> target =
        encode(seq2seq ? cfg.target : cfg.input, seq2seq ? c.target : c.input, line);
    std::vector<int> source;
    if (seq2seq) source = encode(cfg.input, c.input, line);
    // A line of, say, only control characters normalises to nothing; an
    // empty sequence teaches nothing, so it is counted and left out.
    if (target.empty() || (seq2seq && source.empty())) {
      ++figures->skipped;
      continue;
    }
    static_assert(sizeof(int) == sizeof(int32_t));
    shard.target.append(reinterpret_cast<const int32_t*>(target.data()), target.size());
    if (seq2seq) {
      shard.source.append(reinterpret_cast<const int32_t*>(source.data()), source.size());
    }
    ++figures->sequences;
    figures->tokens += static_cast<int64_t>(target.size() + source.size());
    const int unk = header.special.unk;
    figures->unknown += std::count(target.begin(), target.end(), unk) +
                        std::count(source.begin(), source.end(), unk);
  }
  if (figures->sequences == 0) {
    throw std::runtime_error(cfg.input + ": lines " + std::to_string(c.sequences[begin] + 1) +
                             " to " + std::to_string(c.sequences[end - 1] + 1) +
                             " all encode to nothing, so their shard would be empty");
  }
  return shard;
}

// Files this rank has written under temporary names, and their final names.
class PendingFiles {
 public:
  explicit PendingFiles(fs::path dir) : dir_(std::move(dir)) {}

  // Where to write `name` for now.
  std::string add(const std::string& name) {
    const fs::path final_path = dir_ / name;
    fs::path temporary = final_path;
    temporary += ".tmp-" + std::to_string(::getpid());
    files_.push_back({temporary, final_path, false});
    return temporary.string();
  }

  // A fault message naming the file as the user will know it.
  std::string final_name_in(std::string message) const {
    for (const auto& f : files_) {
      const std::string t = f.temporary.string();
      if (const size_t at = message.find(t); at != std::string::npos) {
        message.replace(at, t.size(), f.final_path.string());
      }
    }
    return message;
  }

  // Durably: a crash after prepare's success line leaves the whole set.
  void commit() {
    for (auto& f : files_) {
      fsync_file(f.temporary.string());
      commit_file(f.temporary.string(), f.final_path.string());
      f.renamed = true;
    }
  }

  // Removes whatever this rank wrote, renamed or not.
  void remove_all() {
    for (const auto& f : files_) {
      std::error_code ec;
      fs::remove(f.temporary, ec);
      if (f.renamed) fs::remove(f.final_path, ec);
    }
    files_.clear();
  }

 private:
  struct File {
    fs::path temporary, final_path;
    bool renamed;
  };
  fs::path dir_;
  std::vector<File> files_;
};

void write_file_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) throw std::runtime_error(path + ": cannot write");
}

}  // namespace

int run_prepare(const PrepareConfig& cfg, Communicator& comm) {
  const auto start = Clock::now();
  const bool seq2seq = cfg.kind == "seq2seq";
  const int W = comm.size(), rank = comm.rank();

  // 1. The files, the output directory and --tokenizer, before any work.
  std::string model_bytes;
  if (!root_validates(comm, [&] {
        require_text_file("--input", cfg.input);
        if (seq2seq) require_text_file("--target", cfg.target);
        require_fresh_output(cfg.out_dir);
        if (!cfg.tokenizer.empty()) model_bytes = load_given_tokenizer(cfg);
      })) {
    return kExitUsage;
  }

  // 2. Every rank reads the text (it is small next to its tokens); rank 0
  // judges it.
  Corpus corpus;
  if (!all_succeed(comm, [&] {
        corpus.input = read_lines(cfg.input);
        if (seq2seq) corpus.target = read_lines(cfg.target);
        // Files of different lengths are refused below; nothing to pair.
        if (!seq2seq || corpus.target.size() == corpus.input.size()) {
          select_sequences(cfg, &corpus);
        }
      })) {
    return kExitFailure;
  }
  if (!root_validates(comm, [&] { validate_corpus(cfg, corpus); })) return kExitUsage;

  // The output directory: created by rank 0 now that the inputs are known
  // good, and locked until the end, so a second prepare into it is refused
  // rather than mixing its files with ours. Step 1 saw it free of shards
  // before the lock; only a check under the lock can be trusted.
  const fs::path out_dir(cfg.out_dir);
  bool created_out_dir = false;
  DirLock lock;
  PendingFiles pending(out_dir);
  // Every rank removes what it wrote; then rank 0 lets the directory go,
  // removing it if it made it (only if empty: never another's files).
  const auto give_up = [&](int code) {
    pending.remove_all();
    comm.barrier();
    lock.release();
    if (created_out_dir) {
      std::error_code ec;
      fs::remove(out_dir, ec);
    }
    return code;
  };
  if (!all_succeed(comm, [&] {
        if (!comm.is_root()) return;
        std::error_code ec;
        created_out_dir = fs::create_directories(out_dir, ec);
        if (ec) throw std::runtime_error(cfg.out_dir + ": cannot create (" + ec.message() + ")");
      })) {
    return kExitFailure;
  }
  if (!root_validates(comm, [&] {
        const std::string refused = lock.try_acquire(cfg.out_dir);
        if (!refused.empty()) usage_error("--out", refused);
        require_fresh_output(cfg.out_dir);
      })) {
    return give_up(kExitUsage);
  }

  // 3. The tokenizer: trained on rank 0 (one vocabulary for both sides of a
  // pair) or the one given; every rank gets its bytes.
  const auto tokenizer_start = Clock::now();
  if (cfg.tokenizer.empty()) {
    if (comm.is_root()) {
      std::cout << "training a " << cfg.model_type << " tokenizer of " << cfg.vocab_size
                << " pieces on " << cfg.input << (seq2seq ? " and " + cfg.target : "") << " ..."
                << std::endl;
      if (corpus.too_long > 0) {
        std::cout << "  " << corpus.too_long << " line(s) longer than " << kLongestTrainedLine
                  << " bytes are left out of the tokenizer's training (they are still encoded)"
                  << std::endl;
      }
    }
    std::string failure;
    if (comm.is_root()) {
      TokenizerTrainOptions options;
      options.vocab_size = cfg.vocab_size;
      options.model_type = cfg.model_type;
      options.seed = cfg.seed;
      std::vector<std::string> files{cfg.input};
      if (seq2seq) files.push_back(cfg.target);
      try {
        model_bytes = Tokenizer::train(files, options);
      } catch (const std::exception& e) {
        failure = e.what();
      }
    }
    barrier_without_spinning();
    // More pieces than the text can fill, or fewer than its characters, is
    // a bad --vocab-size (exit 2); SentencePiece's message says which.
    const bool bad_vocab_size = failure.find("Vocabulary size") != std::string::npos;
    if (!root_validates(comm, [&] {
          if (bad_vocab_size) usage_error("--vocab-size", failure);
          if (!failure.empty()) throw std::runtime_error(failure);
        })) {
      return give_up(comm.any(bad_vocab_size) ? kExitUsage : kExitFailure);
    }
  }
  broadcast_from_root(&model_bytes);
  std::unique_ptr<Tokenizer> tokenizer;
  if (!all_succeed(comm, [&] { tokenizer = Tokenizer::from_bytes(model_bytes); })) {
    return give_up(kExitFailure);
  }
  const double tokenizer_seconds = seconds_since(tokenizer_start);
  if (comm.is_root() && cfg.tokenizer.empty()) {
    std::printf("tokenizer: %d pieces in %.1f s\n", tokenizer->vocab_size(), tokenizer_seconds);
    std::fflush(stdout);
  }

  ShardHeader header;
  header.kind = cfg.kind;
  header.vocab_size = tokenizer->vocab_size();
  // header.special: the reserved ids the tokenizer was checked to have
  header.tokenizer = model_bytes;

  // 4. Shards, in rounds of W: rank r writes shard k*W + r of round k.
  const auto encode_start = Clock::now();
  const int64_t shards = cfg.shards;
  const size_t train_sequences = corpus.train();
  ShardFigures total;
  bool ok = true;
  for (int64_t first = 0; first < shards && ok; first += W) {
    const int64_t mine = first + rank;
    ShardFigures figures;
    ok = all_succeed(comm, [&] {
      if (mine >= shards) return;
      const size_t begin = static_cast<size_t>(mine * train_sequences / shards);
      const size_t end = static_cast<size_t>((mine + 1) * train_sequences / shards);
      const Shard shard = encode_block(cfg, corpus, *tokenizer, header, begin, end, &figures);
      const std::string path = pending.add(shard_name(kTrainPrefix, mine));
      try {
        write_shard(path, shard);
      } catch (const std::runtime_error& e) {
        throw std::runtime_error(pending.final_name_in(e.what()));
      }
    });
    if (!ok) break;
    // Every rank's figures for this round, so rank 0 can report each shard.
    constexpr int kFigures = 4;
    std::vector<double> round(kFigures * static_cast<size_t>(W), 0.0);
    double* own = &round[kFigures * rank];
    own[0] = static_cast<double>(figures.sequences);
    own[1] = static_cast<double>(figures.tokens);
    own[2] = static_cast<double>(figures.skipped);
    own[3] = static_cast<double>(figures.unknown);
    comm.allreduce_sum(round.data(), static_cast<int>(round.size()));
    for (int r = 0; r < W && first + r < shards; ++r) {
      const double* of_r = &round[kFigures * r];
      const auto sequences = static_cast<int64_t>(of_r[0]);
      const auto tokens = static_cast<int64_t>(of_r[1]);
      total.sequences += sequences;
      total.tokens += tokens;
      total.skipped += static_cast<int64_t>(of_r[2]);
      total.unknown += static_cast<int64_t>(of_r[3]);
      if (comm.is_root()) {
        std::printf("  %s: %s sequences, %s tokens (%.1f s)\n",
                    shard_name(kTrainPrefix, first + r).c_str(), grouped(sequences).c_str(),
                    grouped(tokens).c_str(), seconds_since(encode_start));
      }
    }
    if (comm.is_root()) std::fflush(stdout);
  }

  // The validation shard and the tokenizer, from rank 0.
  ShardFigures valid;
  if (ok) {
    ok = all_succeed(comm, [&] {
      if (!comm.is_root()) return;
      if (corpus.valid > 0) {
        const Shard shard = encode_block(cfg, corpus, *tokenizer, header, train_sequences,
                                         corpus.sequences.size(), &valid);
        const std::string path = pending.add(shard_name(kValidPrefix, 0));
        try {
          write_shard(path, shard);
        } catch (const std::runtime_error& e) {
          throw std::runtime_error(pending.final_name_in(e.what()));
        }
      }
      write_file_bytes(pending.add(kTokenizerFile), model_bytes);
    });
  }

  // 5. All or nothing: rename only when every rank succeeded.
  if (ok) ok = all_succeed(comm, [&] { pending.commit(); });
  if (!ok) return give_up(kExitFailure);

  if (comm.is_root()) {
    const double encode_seconds = seconds_since(encode_start);
    const int64_t tokens = total.tokens + valid.tokens;
    const int64_t skipped = static_cast<int64_t>(corpus.blank) + total.skipped + valid.skipped;
    std::printf(
        "prepared %s: %s training sequences in %lld shard(s), %s validation; %s tokens "
        "(%s unknown), vocabulary %d\n",
        cfg.out_dir.c_str(), grouped(total.sequences).c_str(), static_cast<long long>(shards),
        grouped(valid.sequences).c_str(), grouped(tokens).c_str(),
        grouped(total.unknown + valid.unknown).c_str(), header.vocab_size);
    std::printf(
        "  %s %s read, %s skipped (blank or encoding to nothing); %.1f s in all, "
        "encoding %.1f s (%s tokens/s)\n",
        grouped(static_cast<int64_t>(corpus.input.size())).c_str(),
        seq2seq ? "line pairs" : "lines", grouped(skipped).c_str(), seconds_since(start),
        encode_seconds,
        grouped(static_cast<int64_t>(tokens / std::max(encode_seconds, 1e-9))).c_str());
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace mpiformer
