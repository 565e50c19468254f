// mpiformer prepare: raw text (or a line-aligned parallel pair) to HDF5 token
// shards, over MPI ranks.
//
//   1. rank 0 validates the inputs; every rank agrees on the verdict before
//      any work (exit 2, one line naming the file and the fault);
//   2. every rank reads the text (rank 0 also the --valid and --test files)
//      and cuts it into splits: training lines first, then the validation
//      lines, then the test lines (unless those come from files); rank 0
//      creates the output directory and locks it (DIR/.lock) until the end,
//      so a second prepare into it is refused; rank 0 trains the
//      SentencePiece model on the training lines alone (or loads
//      --tokenizer) and broadcasts its bytes;
//   3. shard s holds the s-th contiguous block of the training sequences;
//      in round k rank r encodes and writes shard k*W + r, and rank 0 reports
//      the round; then rank 0 writes the validation and test shards and
//      tokenizer.model;
//   4. everything is written under temporary names and renamed only when
//      every rank has succeeded; on any failure every rank removes what it
//      wrote, so the output directory never holds a partial shard set. A
//      stop signal (TERM, INT, HUP) ends every rank at once, removing the
//      same (src/io/stop_cleanup.h): exit 128 + the signal's number.
//
// Rank 0 reports each phase on stdout, and every kProgressSeconds within a
// long one (tokenizer training, encoding), so a large corpus is never silent
// for long while a small one gets only the phase lines.
//
// This file is the command, phase by phase, each agreed by every rank; the
// phases' work is in src/app/prepare/: the checks of the inputs (inputs.h),
// the text and its splits (corpus.h), the tokenizer's training
// (tokenizer.h), the shards (shards.h), the output directory and its
// rollback (output.h), the progress lines (progress.h), and --kind image
// (images.h).
#include <iostream>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "src/app/commands.h"
#include "src/app/prepare/corpus.h"
#include "src/app/prepare/images.h"
#include "src/app/prepare/inputs.h"
#include "src/app/prepare/output.h"
#include "src/app/prepare/progress.h"
#include "src/app/prepare/shards.h"
#include "src/app/prepare/tokenizer.h"
#include "src/core/error.h"
#include "src/data/labels.h"
#include "src/data/tokenizer.h"
#include "src/io/stop_cleanup.h"
#include "src/parallel/agreement.h"

namespace mpiformer::prepare {
namespace {

// The exit code of a step that ends the run on every rank; nothing when the
// ranks go on to the next step.
using EarlyExit = std::optional<int>;

// Every rank removes what it wrote; then rank 0 lets the directory go,
// removing it if it made it (only if empty: never another's files).
int give_up(OutputDir& out, const Communicator& comm, int code) {
  out.remove_written();
  comm.barrier();
  out.let_go();
  return code;
}

// classify: the training lines' labels, the same on every rank; rank 0
// judges them.
EarlyExit agree_on_training_labels(const PrepareConfig& cfg, const Communicator& comm,
                                   const Corpus& corpus, LabelVocabulary* vocabulary) {
  *vocabulary = training_labels(corpus);
  if (agree_on(
          comm, [&] { require_training_labels(cfg, *vocabulary); }, Speaker::kRoot, Blame::kOfInput,
          "prepare") != 0) {
    return kExitUsage;
  }
  return std::nullopt;
}

// 2. Every rank reads the text (it is small next to its tokens) and finds
// the same splits; only rank 0 writes the held-out shards, so only it
// reads --valid and --test. Rank 0 judges it all.
EarlyExit read_text(const PrepareConfig& cfg, const Communicator& comm, Clock::time_point start,
                    const Say& say, Corpus* corpus, LabelVocabulary* vocabulary) {
  if (agree_on(comm, [&] { read_corpus(cfg, comm.is_root(), corpus); }) != 0) return kExitFailure;
  std::vector<std::string> warnings;
  if (agree_on(
          comm, [&] { warnings = validate_corpus(cfg, *corpus); }, Speaker::kRoot, Blame::kOfInput,
          "prepare") != 0) {
    return kExitUsage;
  }
  if (cfg.kind == "classify") {
    if (const EarlyExit exit = agree_on_training_labels(cfg, comm, *corpus, vocabulary)) {
      return exit;
    }
  }
  if (comm.is_root()) {
    for (const std::string& w : warnings) std::cerr << "mpiformer prepare: " << w << std::endl;
    report_corpus(*corpus, start, say);
  }
  return std::nullopt;
}

// The output directory: created by rank 0 now that the inputs are known
// good, and locked until the end, so a second prepare into it is refused
// rather than mixing its files with ours. Step 1 saw it free of shards
// before the lock; only a check under the lock can be trusted.
EarlyExit take_output_dir(const PrepareConfig& cfg, const Communicator& comm, const Say& say,
                          OutputDir& out) {
  if (agree_on(comm, [&] {
        if (comm.is_root()) out.create();
      }) != 0) {
    return kExitFailure;
  }
  if (agree_on(
          comm,
          [&] {
            const std::string refused = out.lock();
            if (!refused.empty()) usage_error("--out", refused);
            require_fresh_output(cfg.out_dir);
            if (const int stale = out.remove_abandoned_temporaries()) {
              say("removed " + std::to_string(stale) + " temporary file(s) left in " + cfg.out_dir +
                  " by a prepare that no longer runs");
            }
          },
          Speaker::kRoot, Blame::kOfInput, "prepare") != 0) {
    return give_up(out, comm, kExitUsage);
  }
  return std::nullopt;
}

// Rank 0 trains the tokenizer on the training lines alone, so the held-out
// splits stay unseen (one vocabulary for both sides of a pair), while the
// other ranks wait; a --vocab-size the text cannot fill is the user's.
EarlyExit train_tokenizer_on_root(const PrepareConfig& cfg, const Communicator& comm,
                                  const Corpus& corpus, const Say& say, OutputDir& out,
                                  std::string* model_bytes) {
  std::string failure;
  if (comm.is_root()) failure = train_tokenizer(cfg, corpus, out.path(), say, model_bytes);
  comm.barrier_without_spinning();
  const bool bad_vocab_size = is_bad_vocab_size(failure);
  if (agree_on(
          comm,
          [&] {
            if (bad_vocab_size) usage_error("--vocab-size", failure);
            if (!failure.empty()) throw std::runtime_error(failure);
          },
          Speaker::kRoot, Blame::kOfInput, "prepare") != 0) {
    return give_up(out, comm, comm.any(bad_vocab_size) ? kExitUsage : kExitFailure);
  }
  return std::nullopt;
}

// 4. Shards, in rounds of W: rank r writes shard k*W + r of round k. Then
// the held-out shards and the tokenizer, from rank 0. False when any rank
// failed.
bool write_shards(const PrepareConfig& cfg, const Communicator& comm,
                  const std::string& model_bytes, Encoding& encoding, OutputDir& out) {
  bool ok = true;
  for (int64_t first = 0; first < cfg.shards && ok; first += comm.size()) {
    ShardFigures mine;
    ok = agree_on(comm, [&] { mine = encoding.write_training_shard(first, &out); }) == 0;
    if (ok) encoding.add_round(first, mine);
  }
  if (ok) {
    ok = agree_on(comm, [&] {
           if (!comm.is_root()) return;
           encoding.write_held_out(&out);
           out.write_bytes(kTokenizerFile, model_bytes);
         }) == 0;
  }
  return ok;
}

}  // namespace
}  // namespace mpiformer::prepare

namespace mpiformer {

int run_prepare(const PrepareConfig& cfg, Communicator& comm) {
  using namespace prepare;
  // SentencePiece cannot be asked to stop: a stop signal ends each rank at
  // once, and what it wrote goes with it.
  const ExitOnStop stop(comm.is_root() ? "mpiformer prepare: stopped by " : "",
                        comm.is_root() ? "; removed its unfinished files from " + cfg.out_dir : "");
  if (cfg.kind == "image") return run_prepare_images(cfg, comm);
  const auto start = Clock::now();
  // Rank 0's report: one line at a time, on stdout, flushed at once.
  const Say say = [&](const std::string& line) {
    if (comm.is_root()) std::cout << line << std::endl;
  };

  // 1. The files, the output directory and --tokenizer, before any work.
  std::string model_bytes;
  if (agree_on(
          comm, [&] { model_bytes = check_text_inputs(cfg); }, Speaker::kRoot, Blame::kOfInput,
          "prepare") != 0) {
    return kExitUsage;
  }

  // 2. The text and its splits.
  Corpus corpus = corpus_of(cfg);
  LabelVocabulary vocabulary;
  if (const EarlyExit exit = read_text(cfg, comm, start, say, &corpus, &vocabulary)) return *exit;
  OutputDir out(cfg.out_dir);
  if (const EarlyExit exit = take_output_dir(cfg, comm, say, out)) return *exit;

  // 3. The tokenizer: trained on rank 0, or the one given; every rank gets
  // its bytes.
  const auto tokenizer_start = Clock::now();
  if (cfg.tokenizer.empty()) {
    if (const EarlyExit exit = train_tokenizer_on_root(cfg, comm, corpus, say, out, &model_bytes)) {
      return *exit;
    }
  }
  comm.broadcast(&model_bytes, 0);
  std::unique_ptr<Tokenizer> tokenizer;
  if (agree_on(comm, [&] { tokenizer = Tokenizer::from_bytes(model_bytes); }) != 0) {
    return give_up(out, comm, kExitFailure);
  }
  if (cfg.tokenizer.empty()) {
    say("tokenizer: " + std::to_string(tokenizer->vocab_size()) + " pieces in " +
        format_seconds(seconds_since(tokenizer_start)));
  }

  // 4. The shards.
  Encoding encoding(cfg, corpus, *tokenizer, model_bytes, vocabulary, comm, say);
  bool ok = write_shards(cfg, comm, model_bytes, encoding, out);

  // 5. All or nothing: rename only when every rank succeeded.
  if (ok) ok = agree_on(comm, [&] { out.commit(); }) == 0;
  if (!ok) return give_up(out, comm, kExitFailure);
  ExitOnStop::finish();  // the set is complete on every rank
  if (comm.is_root()) encoding.print_summary(start);
  return 0;
}

}  // namespace mpiformer
