// Encoding prepare's text into shards. Shard s holds the s-th contiguous
// block of the training sequences; in round k rank r encodes and writes
// shard k*W + r, and rank 0 reports the round; then rank 0 writes the
// validation and test shards. The figures of every shard add up to the
// summary rank 0 prints at the end.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "src/app/prepare/corpus.h"
#include "src/app/prepare/output.h"
#include "src/app/prepare/progress.h"
#include "src/core/config.h"
#include "src/data/labels.h"
#include "src/data/tokenizer.h"
#include "src/io/shard.h"
#include "src/parallel/communicator.h"

namespace mpiformer::prepare {

struct ShardFigures {
  int64_t sequences = 0;
  int64_t tokens = 0;          // source and target
  int64_t skipped = 0;         // non-blank lines that encode to no token at all
  int64_t unknown = 0;         // unk tokens: characters the tokenizer lacks
  int64_t labels = 0;          // classify: labels kept
  int64_t unknown_labels = 0;  // classify: labels the training lines never had, dropped
};

// The shards of one prepare, on every rank, from the moment the tokenizer
// is known: what each shard's header holds, the figures so far, and rank
// 0's progress lines.
class Encoding {
 public:
  // Says (on rank 0) what is about to be encoded.
  Encoding(const PrepareConfig& cfg, const Corpus& corpus, const Tokenizer& tokenizer,
           const std::string& model_bytes, const LabelVocabulary& vocabulary,
           const Communicator& comm, Say say);

  // This rank's shard of the round that starts at shard `first`, written
  // under its temporary name; returns its figures (none when the round has
  // no shard for this rank).
  ShardFigures write_training_shard(int64_t first, OutputDir* out);

  // Every rank's figures of the round (a collective), added to the total;
  // rank 0 reports each shard.
  void add_round(int64_t first, const ShardFigures& mine);

  // Rank 0: the validation and test shards.
  void write_held_out(OutputDir* out);

  // Rank 0: the summary, `start` being when prepare began.
  void print_summary(Clock::time_point start) const;

 private:
  // Rank 0's running count within the shard it encodes, every
  // kProgressSeconds.
  std::function<void(size_t)> count_encoded(const std::string& name, size_t sequences);

  const PrepareConfig& cfg_;
  const Corpus& corpus_;
  const Tokenizer& tokenizer_;
  const LabelVocabulary& vocabulary_;
  const Communicator& comm_;
  const Say say_;
  ShardHeader header_;
  const Clock::time_point start_ = Clock::now();
  Throttle throttle_;
  ShardFigures total_;
  ShardFigures held_out_[2];     // valid, test
  int64_t test_sequences_ = -1;  // -1: no test split
};

}  // namespace mpiformer::prepare
