// Length buckets and token-budget batches: which sequences share a batch, and
// the order in which an epoch visits the batches. Pure functions of their
// inputs, so every rank computes the same global batch list.
#pragma once

#include <cstdint>
#include <vector>

namespace mpiformer {

// Inclusive upper bounds of the length buckets for sequences up to max_len.
// Empty `requested`: tensor2tensor's boundaries, 8 then max(b + 1,
// floor(1.1 b)) while below max_len, with max_len last. Otherwise the
// --buckets list, which must be positive, strictly increasing and at most
// max_len; max_len is appended when the list stops short of it, so longer
// sequences still have a bucket. Throws UsageError naming --buckets.
std::vector<int> bucket_boundaries(const std::vector<int>& requested, int max_len);

// Index of the first boundary >= length; -1 when length is above the last.
int bucket_index(const std::vector<int>& boundaries, int length);

// One epoch's batches. Batch k of the epoch holds the sequence ids
// order[batches[k].begin, batches[k].begin + batches[k].size).
struct EpochPlan {
  struct Span {
    uint64_t begin = 0;
    uint32_t size = 0;
  };
  std::vector<uint32_t> order;  // (sequences) ids, each batch's ids contiguous
  std::vector<Span> batches;    // (M) in the order the epoch visits them
};

class BatchPlanner {
 public:
  // bucket_of[i]: the bucket of sequence i, a dense id below bucket_cost.size()
  // (seq2seq numbers its 2-D buckets src * n + tgt). bucket_cost[b]: the padded
  // tokens one sequence of bucket b may occupy (its boundary; both sides' for
  // seq2seq). A batch holds at most max_tokens / cost sequences, and at most
  // max_sentences when that is positive. Throws std::invalid_argument when a
  // used bucket's cost exceeds max_tokens.
  //
  // length_key[i] (optional; empty: none) orders sequences by exact length
  // inside a bucket: shuffled() then sorts each run of sort_window batches'
  // worth of shuffled ids by it before cutting, so a batch holds nearly equal
  // lengths while which sequences meet still changes every epoch. A bucket
  // spans 10% of lengths, the first one 1..8: without this, short sequences
  // waste a third of their batch on padding.
  BatchPlanner(const std::vector<uint32_t>& bucket_of, const std::vector<int>& bucket_cost,
               int64_t max_tokens, int max_sentences, std::vector<uint64_t> length_key = {},
               int sort_window = 0);

  // M: the same every epoch, the sum over buckets of ceil(members / capacity).
  uint64_t batches_per_epoch() const { return batches_per_epoch_; }
  uint64_t sequences() const { return members_.size(); }
  int buckets() const { return static_cast<int>(capacity_.size()); }
  int buckets_used() const;
  int capacity(int bucket) const { return capacity_[bucket]; }
  // Sequences of bucket b.
  uint64_t members(int bucket) const { return bucket_start_[bucket + 1] - bucket_start_[bucket]; }

  // Training order of `epoch`: each bucket's ids shuffled (then sorted by
  // length within windows, see above), cut into batches, and the batch list
  // shuffled, all keyed by (seed, epoch) alone.
  EpochPlan shuffled(uint64_t seed, uint64_t epoch) const;

  // Evaluation order, not shuffled: ids ascending within a bucket, batches
  // ordered by their first id, so any prefix of the list samples every length
  // in proportion to how often it occurs.
  EpochPlan in_order() const;

 private:
  // Appends the batches of bucket b, whose ids sit at order[start, start + n).
  void cut_bucket(int b, uint64_t start, uint64_t n, EpochPlan* plan) const;

  std::vector<uint64_t> bucket_start_;  // (buckets + 1) CSR offsets into members_
  std::vector<uint32_t> members_;       // (sequences) ids grouped by bucket, ascending
  std::vector<int> capacity_;           // (buckets) sequences per batch
  std::vector<uint64_t> length_key_;    // (sequences) or empty
  int sort_window_ = 0;                 // batches per sorted window; 0: no sorting
  uint64_t batches_per_epoch_ = 0;
};

}  // namespace mpiformer
