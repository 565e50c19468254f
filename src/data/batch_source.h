// Where the training loop gets its micro-batches: synthetic tasks or HDF5
// shards. Batch `index` of a stream is a pure function of the source's
// inputs (seed, shard set, options), so every rank can build any of them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "src/data/batch.h"

namespace mpiformer {

class BatchSource {
 public:
  enum Stream : uint64_t { kTrain = 0, kEval = 1 };
  virtual ~BatchSource() = default;

  // Fills `out` with batch `index` of `stream`. With global indexing (the
  // default, --sharding data), index is the global batch number and every
  // rank would build the same batch for it; with --sharding file it numbers
  // this rank's own batches.
  virtual void make_batch(uint64_t stream, uint64_t index, Batch* out) = 0;
  virtual bool global_indices() const { return true; }

  // Tells the source which training batches this rank will ask for next, in
  // order (index0, index0 + stride, ...), so it can prepare them in the
  // background. Optional.
  virtual void prefetch(uint64_t first_index, uint64_t stride) {}

  // Training batches in an epoch of this rank's stream (0: no epochs, synthetic).
  virtual uint64_t batches_per_epoch() const { return 0; }

  // Evaluation batches available (0: any number, synthetic).
  virtual uint64_t eval_batch_count() const { return 0; }

  // The most sequences one batch of any stream holds (0: not known; as many
  // as its tokens): a classifier's per-sequence buffers are sized by it.
  virtual int max_batch_sequences() const { return 0; }

  // The largest batch of each bucket either stream may cut, per side (the
  // encoder's for seq2seq only), so that a backend prepares its attention
  // for every batch shape before the first step (Ops::prepare_attention).
  // Empty: not known (synthetic tasks).
  struct BucketBound {
    SideBound decoder, encoder;
  };
  virtual std::vector<BucketBound> bucket_bounds() const { return {}; }

  // A summary for the run's log (sequences, skipped, batches, padding); may be empty.
  virtual std::string describe() const { return ""; }

  // The ids of this rank's training sequences as stored, and how many of
  // them are reserved ids (pad, bos, eos, unk, mask, sep): data made of
  // little else teaches nothing. {0, 0} where not known (synthetic, images).
  struct IdCounts {
    int64_t ids = 0, reserved = 0;
  };
  virtual IdCounts train_ids() const { return {}; }
};

}  // namespace mpiformer
