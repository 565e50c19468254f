// Training and evaluation batches from a directory of HDF5 shards written by
// `mpiformer prepare` (DIR/train-NNNNN.h5, DIR/valid-NNNNN.h5, and
// DIR/test-NNNNN.h5 where prepare was given a test split).
//
// Construction validates the whole shard set (vocabulary, special ids,
// tokenizer bytes and kind agree with the first train shard, and with the
// model), loads this rank's sequences into memory once, applies --too-long,
// and sorts the sequences into length buckets. Batches then only gather ids
// from memory.
//
// Layouts (shards store sequences without bos/eos; see Batch):
//   lm:      decoder BOS s, targets s EOS.
//   mlm:     decoder s masked (src/data/mlm_masking.h), targets the originals
//            at chosen positions, pad elsewhere.
//   seq2seq: encoder src EOS, decoder BOS t, targets t EOS.
//   classify: decoder [BOS as CLS] s (or an image's rows), one target per
//            sequence: its label (softmax) or (K) label targets (zlpr).
// A side truncated to --max-len keeps its first tokens and loses its EOS (its
// end is not there): lm decoder BOS s[0, L-1), targets s[0, L).
//
// Training order: the global batch list of an epoch (bucketing.h: each
// bucket shuffled, sorted by length within runs of 8 batches, cut to the
// token budget, the batch list shuffled) is a pure function of (seed, epoch,
// shard set, options); global batch g is batch g % M of epoch g / M, M
// batches per epoch. --sharding file gives each rank the files rank,
// rank + W, ... and its own list, numbered per rank. Evaluation batches are
// the sequences of the evaluated split (valid, or test for `eval --split
// test`), bucketed the same way but not shuffled.
//
// Nothing here calls MPI: a rank that fails throws, and the caller agrees on
// the outcome across ranks.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "src/core/config.h"
#include "src/data/batch_layout.h"
#include "src/data/batch_source.h"
#include "src/data/bucketing.h"
#include "src/data/mlm_masking.h"
#include "src/io/shard.h"

namespace mpiformer {

// What a split kept after the --too-long rule.
struct LoadStats {
  int64_t shards = 0;
  int64_t sequences = 0;       // kept
  int64_t tokens = 0;          // real tokens of the kept sequences as laid out (encoder + decoder)
  int64_t decoder_tokens = 0;  // of them the decoder's: seq2seq's target side (y + EOS)
  int64_t skipped = 0;         // longer than --max-len under --too-long skip
  int64_t truncated = 0;       // cut to --max-len under --too-long truncate
  int64_t empty = 0;           // mlm: empty sequences, nothing to predict
  int64_t ids = 0;             // stored ids of the kept sequences (both sides)
  int64_t reserved_ids = 0;    // of them the reserved ids (SpecialTokens)
};

// The splits a ShardSource reads.
struct SplitChoice {
  std::string eval = "valid";  // the evaluation batches: DIR/<eval>-NNNNN.h5 (valid | test)
  bool train = true;           // false: evaluation alone; the train shards' headers are
                               // checked but their sequences are not loaded
};

class ShardSource : public BatchSource {
 public:
  // cfg.data_dir, model (kind, max_len; reconciled with the shards by the
  // start-up, src/train/shard_config.h, and checked against them), buckets,
  // too_long, sharding, prefetch (depth; 0: no thread), max_tokens,
  // max_sentences, mlm_probability, seed. Throws UsageError for flags that
  // cannot work with this data, ShardError (std::runtime_error) naming the
  // file for faulty or inconsistent shards.
  ShardSource(const TrainConfig& cfg, int rank, int world_size, const SplitChoice& splits = {});
  ~ShardSource() override;
  ShardSource(const ShardSource&) = delete;
  ShardSource& operator=(const ShardSource&) = delete;

  void make_batch(uint64_t stream, uint64_t index, Batch* out) override;
  bool global_indices() const override { return !file_sharding_; }
  void prefetch(uint64_t first_index, uint64_t stride) override;
  uint64_t eval_batch_count() const override { return eval_plan_.batches.size(); }
  int max_batch_sequences() const override { return max_batch_sequences_; }

  // 0 on a rank with no train shard under --sharding file.
  uint64_t batches_per_epoch() const override {
    return train_.planner ? train_.planner->batches_per_epoch() : 0;
  }
  const LoadStats& train_stats() const { return train_.stats; }
  IdCounts train_ids() const override { return {train_.stats.ids, train_.stats.reserved_ids}; }
  std::vector<BucketBound> bucket_bounds() const override;
  const LoadStats& eval_stats() const { return eval_.stats; }
  const std::vector<int>& boundaries() const { return boundaries_; }
  const ModelConfig& model() const { return model_; }
  // Real over padded tokens of epoch 0's batches (padded to each batch's longest).
  double epoch_padding_efficiency() const { return epoch_padding_efficiency_; }
  // Train batches handed over from the prefetch thread so far (the rest were
  // built on the caller's thread).
  uint64_t prefetched_batches() const;
  // Batches built ahead and waiting now (at most --prefetch).
  size_t prefetch_ready() const;
  // One paragraph for the run log: sequences, tokens, skipped, truncated,
  // buckets, batches per epoch, padding efficiency.
  std::string describe() const override;

 private:
  struct Split {
    std::vector<std::string> files;
    std::vector<Shard> shards;
    std::vector<Example> examples;  // (sequences) kept, in file order: the ids of bucketing.h
    std::optional<BatchPlanner> planner;
    // (buckets) the one length every sequence of a bucket has on each side,
    // or -1 where they differ: a bucket of one length is a uniform class
    // of batches (SideBound::one_length).
    std::vector<int> decoder_length, encoder_length;
    LoadStats stats;
  };

  // This rank's training files: all of them, or rank, rank + W, ... under
  // --sharding file (idle_ when that leaves none).
  std::vector<std::string> train_files_of_rank(const std::vector<std::string>& all);
  [[noreturn]] void refuse_nothing_fits(const Split& split, const std::string& what,
                                        TooLong asked) const;
  void load_split(const std::vector<std::string>& files, Split* split) const;
  // load_split's part for sequence i of a shard: false when it is left out
  // (empty where that cannot train, or too long under --too-long skip,
  // counted in *stats); otherwise *e says how much of each side is kept.
  bool example_of(const Shard& shard, size_t i, Example* e, LoadStats* stats) const;
  void plan_split(Split* split);
  double padding_efficiency(const Split& split, const EpochPlan& plan) const;

  std::shared_ptr<const EpochPlan> epoch_plan(uint64_t epoch) const;
  void build_train(uint64_t index, Batch* out) const;
  // Lays a batch of `split` out; its masks drawn with the key of (stream, index).
  void fill_batch(const Split& split, const EpochPlan& plan, uint64_t batch, uint64_t stream,
                  uint64_t index, Batch* out) const;

  // Prefetch machinery; all guarded by mutex_.
  void worker_loop();
  void restart_locked(uint64_t first_index);
  bool take_prefetched(uint64_t index, Batch* out);

  ModelConfig model_;
  std::string dir_;
  std::vector<int> boundaries_;
  TooLong too_long_;
  bool file_sharding_;
  int rank_, world_size_;
  int64_t max_tokens_;
  int max_sentences_;
  uint64_t seed_;
  BatchLayout layout_;
  int64_t train_files_total_ = 0;
  int max_batch_sequences_ = 1;  // the most sequences any bucket's batch holds

  Split train_, eval_;
  // No train batch on this rank, every one empty: --sharding file left it
  // no file, or only evaluation was asked for (SplitChoice::train false).
  bool idle_ = false;
  EpochPlan eval_plan_;
  double epoch_padding_efficiency_ = 1.0;

  // The two most recent epoch plans: the loop and the prefetch thread may
  // straddle an epoch boundary.
  mutable std::mutex plan_mutex_;
  mutable std::vector<std::pair<uint64_t, std::shared_ptr<const EpochPlan>>> plans_;

  // Background builder of train batches sequence_start_ + k stride_. Built
  // batches wait in a ring (depth --prefetch) whose buffers are swapped with
  // the caller's, so steady state allocates nothing.
  struct Ready {
    uint64_t index = 0;
    Batch batch;
  };
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::thread worker_;
  std::vector<Ready> ring_;  // (depth)
  Batch worker_batch_;       // what the worker builds into; only it touches this
  size_t ring_head_ = 0, ring_size_ = 0;
  bool prefetching_ = false;  // prefetch() was called
  bool stopping_ = false;     // the destructor runs
  bool stalled_ = false;      // a build failed: wait for the caller to restart
  bool busy_ = false;         // the worker builds in_flight_ of generation in_flight_generation_
  uint64_t in_flight_ = 0, in_flight_generation_ = 0;
  uint64_t sequence_start_ = 0, next_index_ = 0, stride_ = 1, generation_ = 0;
  uint64_t prefetched_ = 0;
};

}  // namespace mpiformer
