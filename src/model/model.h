// The Transformer family: lm (decoder-only, causal), seq2seq (encoder-decoder
// with cross-attention), mlm (encoder-only with an MLM head) and classify
// (encoder-only, pooled, K label scores; text or image patches), built from
// the shared blocks of src/model/. The model calls only kernels/ops.h.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/ops.h"
#include "src/core/config.h"
#include "src/core/parameters.h"
#include "src/data/batch.h"
#include "src/data/batch_source.h"
#include "src/model/gradient_listener.h"

namespace mpiformer {

// The largest micro-batch the model must hold; activations are allocated once
// for it, so the step loop never allocates.
struct ModelCapacity {
  int max_tokens = 0;  // packed rows of one side (decoder, or encoder)
  int max_len = 0;     // longest sequence
  // Sequences of one batch, when fewer than max_tokens: a classifier's
  // per-sequence buffers (scores, label targets) are (max_sequences, labels).
  int max_sequences = 0;  // 0: max_tokens (one-row sequences)
  // activation: each MLP keeps its pre-activation alone, and its activation
  // lives in the sub-layers' scratch, made again in backward, as are the
  // pre-LN sub-layers' input norms; layer: the
  // layers of a stack take turns in one set of activation buffers, each
  // keeping only its input; backward reruns a layer's forward before its
  // backward (docs/DESIGN.md section 3).
  Recompute recompute = Recompute::kNone;
  // Decoding (decode_step): rows of the key/value cache of each decoder
  // self-attention layer; 0 for training. max_tokens then bounds the rows
  // of one decoding step, of one decode_sources and of the kept encoder
  // memory.
  int cache_rows = 0;

  int sequences() const {
    return max_sequences > 0 && max_sequences < max_tokens ? max_sequences : max_tokens;
  }
};

// Which dropout masks a forward pass uses: a pass is identified by
// (seed, step, micro-batch), so resumed and re-run steps draw the same masks.
struct PassId {
  uint64_t seed = 0;
  int64_t step = 0;
  int micro = 0;
};

// The memory a model of these dimensions holds, found without allocating it.
struct ModelMemory {
  size_t parameters = 0;        // floats of the flat parameter buffer
  size_t activation_bytes = 0;  // its activation buffers at the capacity
  size_t upload_bytes = 0;      // staging of the batch uploads in flight
  size_t largest_tensor = 0;    // floats of the largest parameter tensor
};

// One step of incremental decoding (src/model/decoding.cpp builds it): R
// new decoder rows, each with its token and position, the cache row its
// keys and values go to, the cache rows its self-attention reads (its own
// new row last) and, for seq2seq, the memory rows of its source (where
// decode_sources put them).
struct DecodeStep {
  std::vector<int32_t> tokens;         // (R)
  std::vector<int32_t> positions;      // (R)
  std::vector<int32_t> cache_rows;     // (R) distinct, in [0, capacity.cache_rows)
  std::vector<int32_t> self_starts;    // (R+1) into self_rows
  std::vector<int32_t> self_rows;      // cache rows
  std::vector<int32_t> source_starts;  // (R+1) into source_rows (seq2seq)
  std::vector<int32_t> source_rows;    // memory rows
  // Rows whose next-token logits are wanted, ascending.
  std::vector<int32_t> logit_rows;
  int rows() const { return static_cast<int>(tokens.size()); }
};

class Model {
 public:
  // compute: the precision of activations and of the weights' compute copy
  // (master weights, gradients and optimizer state are fp32 regardless).
  Model(Ops& ops, const ModelConfig& config, const ModelCapacity& capacity,
        DType compute = DType::kF32);
  ~Model();

  // Allocates the parameters, initialises every one deterministically from
  // `seed`, and fills the fixed tables (sinusoid positions).
  void init_parameters(uint64_t seed);

  // What Model(ops, config, capacity, compute) would allocate, before doing
  // so: the buffers are counted, not allocated (src/train/memory_budget.h).
  static ModelMemory measure(Ops& ops, const ModelConfig& config, const ModelCapacity& capacity,
                             DType compute = DType::kF32);

  // The attention calls this model makes on the largest batch of each
  // bucket (BatchSource::bucket_bounds): what Ops::prepare_attention takes.
  static std::vector<AttentionCase> attention_cases(
      const ModelConfig& config, const std::vector<BatchSource::BucketBound>& bounds);

  // Forward and backward of one micro-batch. Gradients are accumulated into
  // parameters().grads() scaled by grad_scale (1 / global target tokens of the
  // step, times the loss scale), so K micro-batches on W ranks add up to the
  // gradient of the global mean loss. The un-normalised loss sums are added
  // to the training sums on the backend: nothing waits for the device.
  // `listener`, when given, hears during backward which gradients are final
  // (for overlapped reduction).
  void forward_backward(const Batch& batch, float label_smoothing, float grad_scale,
                        const PassId& pass, GradientListener* listener = nullptr);

  // Forward only, dropout off: the loss sums are added to the evaluation sums.
  void evaluate(const Batch& batch, float label_smoothing);

  // The sums accumulated since the last take, copied to the host (this
  // waits for the device), then reset.
  LossSums take_train_sums();
  LossSums take_eval_sums();

  // Forward only, dropout off: the logits of the last position of every
  // decoder sequence, for decoding (batch.targets are not read).
  // logits: host (batch.decoder.batch(), vocab)
  void last_logits(const Batch& batch, float* logits);

  // Incremental decoding (capacity.cache_rows > 0), forward only, dropout
  // off. seq2seq: runs the encoder over `sources` and keeps each
  // cross-attention layer's keys and values of source row i at memory row
  // rows[i] (of capacity.max_tokens; the other rows keep theirs) for the
  // steps that follow (an lm takes none). decode_step runs the decoder over
  // the step's new rows only, keeping their keys and values in the cache.
  // rows: host (sources.total()), logits: host (step.logit_rows.size(), vocab)
  void decode_sources(const PackedSequences& sources, const std::vector<int32_t>& rows);
  void decode_step(const DecodeStep& step, float* logits);
  // Holds the backend batch-invariant (Ops::set_batch_invariant) from
  // construction to destruction, so that what it derives from the weights
  // (the CPU's packed copies) lasts from one decoding call to the next. The
  // weights must not change meanwhile.
  class DecodingSession {
   public:
    explicit DecodingSession(Model& model);
    ~DecodingSession();
    DecodingSession(const DecodingSession&) = delete;
    DecodingSession& operator=(const DecodingSession&) = delete;

   private:
    Ops& ops_;
    bool was_;
  };

  // classify: forward only, dropout off: the K label scores of every
  // sequence (batch.targets and label_targets are not read).
  // scores: host (batch.decoder.batch(), K)
  void classify_scores(const Batch& batch, float* scores);
  // classify --loss zlpr: the per-label true positives, false positives and
  // false negatives (3 K: [TP | FP | FN]) since the last take, then reset;
  // empty for other models. Waits for the device.
  std::vector<int64_t> take_label_counts(bool train);

  ParameterSet& parameters() { return *params_; }
  const ModelConfig& config() const { return config_; }
  const ModelCapacity& capacity() const { return capacity_; }

  // Non-embedding parameters plus the output projection (docs/DESIGN.md section 10).
  int64_t flop_parameters() const;
  // Training FLOPs of one micro-batch (docs/DESIGN.md section 10, per sequence):
  // 6 N per token, N the parameters the token passes through (the encoder's
  // for source tokens; the decoder's and the output projection's for target
  // tokens), plus 12 L d T per token for attention over T = its sequence's
  // length, summed over the sequences of the ragged batch.
  double training_flops(const Batch& batch) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  ModelConfig config_;
  ModelCapacity capacity_;
  std::unique_ptr<ParameterSet> params_;
};

}  // namespace mpiformer
