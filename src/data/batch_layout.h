// How a model kind lays the sequences of shards out in a Batch (the layouts
// of src/data/shard_source.h): lm, mlm (masked, src/data/mlm_masking.h),
// seq2seq, and classify over text or an image's patches. Pure functions of
// the examples and a masking key: no I/O, no threads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "src/core/config.h"
#include "src/data/batch.h"
#include "src/data/mlm_masking.h"
#include "src/io/shard.h"

namespace mpiformer {

// A kept sequence: where it lives and how much of each side the layout uses.
struct Example {
  static constexpr uint32_t kSourceEnds = 1, kTargetEnds = 2;
  uint32_t shard = 0;
  uint32_t flags = 0;     // kSourceEnds | kTargetEnds: that side keeps its EOS
  uint64_t sequence = 0;  // index within the shard
  int32_t source_kept = 0;
  int32_t target_kept = 0;
};

class BatchLayout {
 public:
  // max_tokens: the budget every batch fits (--max-tokens).
  BatchLayout(const ModelConfig& model, const MlmMasking& masking, int64_t max_tokens);

  // Tokens of `e` laid out on each side (encoder 0 outside seq2seq).
  int encoder_length(const Example& e) const;
  int decoder_length(const Example& e) const;

  // Lays examples ids[0, count) of `examples` (over `shards`) out in `out`,
  // mlm's masks drawn from `key`; `max_sequences` is the most any batch holds.
  void fill(const std::vector<Shard>& shards, const std::vector<Example>& examples,
            const uint32_t* ids, uint32_t count, uint64_t key, int max_sequences, Batch* out) const;

  // Sizes `out` for any batch of the budget, so it allocates once.
  void reserve_for_budget(int max_sequences, Batch* out) const;

  // classify: refuses labels the loss cannot take (UsageError naming --loss).
  void check_labels(const Shard& shard, const std::string& file) const;

 private:
  void add_example(const Shard& shard, const Example& e, Batch* out) const;

  ModelConfig model_;
  MlmMasking masking_;
  int64_t max_tokens_;
};

}  // namespace mpiformer
