// Model::Impl, the model behind src/model/model.h's interface: its stacks,
// heads and buffers. Building and training (forward, backward) are defined
// in model.cpp, the three stacks in stacks.cpp, the language model's head in
// lm_head.cpp, the classifier's
// in classifier_head.cpp, images' entry in image_patches.cpp and decoding
// in model_decoding.cpp.
#pragma once

#include <cmath>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/device.h"
#include "src/model/model.h"
#include "src/model/stack.h"

namespace mpiformer {

struct Model::Impl {
  Ops& ops;
  const ModelConfig& config;
  ModelCapacity capacity;
  ParameterSet& params;
  ActivationArena arena;
  BlockContext ctx;
  BlockScratch scratch;

  bool has_encoder = false;
  Stack encoder;  // seq2seq only
  Stack main;     // decoder (lm, seq2seq) or encoder (mlm): produces predictions
  DeviceSequences enc_seq, dec_seq;
  int32_t* targets = nullptr;  // (N)
  // Decoding (capacity.cache_rows > 0): the key lists of a step, the cache
  // rows of its new rows, and the memory rows of decode_sources's rows.
  int32_t* step_cache_rows = nullptr;  // (N)
  int32_t* memory_slots = nullptr;     // (N)
  int32_t* self_starts = nullptr;      // (N+1)
  int32_t* self_rows = nullptr;        // (N * L)
  int32_t* source_starts = nullptr;    // (N+1)
  int32_t* source_rows = nullptr;      // (N * L)
  // host (chunk_rows, logits_stride) of a decoding step, pinned on a GPU
  std::unique_ptr<HostBuffer> logits_staging;

  int token_table = -1;    // (V, C)
  int output_weight = -1;  // (V, C): token_table when tied
  int output_bias = -1;    // (V); -1 with --output-bias false
  // mlm head: h -> act(dense(h)) -> LN
  int mlm_dense_w = -1, mlm_dense_b = -1;
  LayerNorm mlm_norm;
  Act mlm_dense;  // (N, C) pre-activation
  Act mlm_act;    // (N, C)

  // classify head: pool -> (B, C) -> scores (B, K)
  int class_w = -1, class_b = -1;            // (K, C), (K)
  Act pooled;                                // (B, C)
  Act dpooled;                               // (B, C)
  Act class_logits;                          // (B, K)
  float* label_targets = nullptr;            // (B, K) zlpr targets
  int64_t* train_counts = nullptr;           // backend (3K) zlpr per-label TP, FP, FN
  int64_t* eval_counts = nullptr;            // backend (3K)
  std::vector<unsigned char> patch_staging;  // host (N, F) in the compute precision

  Act sinusoids;  // (L, C) fixed positions
  Act dstream;    // (N, C) gradient of the stream being back-propagated
  Act spare;      // (N, C)
  Act dmemory;    // (Nk, C) gradient of the encoder output
  Act logits;     // (chunk_rows, V) rows logits_stride apart, over scratch
  int chunk_rows = 0;
  int logits_stride = 0;  // V rounded up: aligned rows for the GEMMs
  // Loss sums accumulated on the backend: training and evaluation.
  LossSums* train_sums = nullptr;  // backend (1)
  LossSums* eval_sums = nullptr;   // backend (1)

  size_t upload_bytes = 0;  // staging for uploads in flight
  bool measuring = false;   // Model::measure: nothing is allocated
  DType compute_dtype = DType::kF32;

  // measure: only count the buffers (Model::measure); nothing is allocated.
  Impl(Ops& o, const ModelConfig& c, const ModelCapacity& cap, ParameterSet& p, DType compute,
       bool measure = false)
      : ops(o), config(c), capacity(cap), params(p), arena(o, compute, measure) {
    measuring = measure;
    compute_dtype = compute;
    ctx.ops = &ops;
    ctx.params = &params;
    ctx.config = &config;
    ctx.recompute_activation = cap.recompute == Recompute::kActivation;
    build();
  }

  // The stacks of the model's kind (stacks.cpp), and one of them.
  void build_stacks();
  void build_stack(Stack& stack, const std::string& name, int layers, bool causal, bool cross,
                   int rows, uint64_t site_base);

  void build();

  // The head of --model classify, registered after the stack so that its
  // gradients are final first.
  void build_classifier();

  // The fixed sinusoid positions table, (L, C) in the compute precision.
  void init_tables();

  void check(const PackedSequences& s, const char* side) const;

  Act head_bias() const { return output_bias >= 0 ? params.weight(output_bias) : Act(); }

  // Loss of the vocabulary projection over rows [0, N) of h, fused with its
  // backward: dh (N, C) is written when `backward`. The sums go to *sums.
  // h: (N, C)
  void head(Act h, Act dh, int N, float smoothing, float grad_scale, bool backward, LossSums* sums);
  Act mlm_transform_forward(Act h, int N);
  void mlm_transform_backward(int N, GradientListener* listener);

  // The forward pass up to the main stack's output; the encoder output
  // stays in memory_ / memory_rows_ for the backward pass.
  // returns: backend (decoder.total(), C)
  Act forward(const Batch& batch, bool training);
  Act memory_;  // backend (memory_rows_.total, C)
  Ragged memory_rows_;

  // logits: host (B, V)
  void last_logits(const Batch& batch, float* out);

  // ---- decoding ----

  // Decoding runs batch-invariant (src/model/decoding.h), training does not.
  // On for one call, unless a DecodingSession holds it on already.
  struct BatchInvariant {
    Ops& ops;
    bool was;
    explicit BatchInvariant(Ops& o) : ops(o), was(o.batch_invariant()) {
      ops.set_batch_invariant(true);
    }
    ~BatchInvariant() { ops.set_batch_invariant(was); }
  };

  void decode_sources(const PackedSequences& sources, const std::vector<int32_t>& rows);

  // The key lists of a step, checked against the rows they may name, and
  // uploaded. starts: host (R+1)
  KeyLists upload_lists(const std::vector<int32_t>& starts, const std::vector<int32_t>& rows, int R,
                        int limit, int32_t* device_starts, int32_t* device_rows, const char* what);

  // logits: host (step.logit_rows.size(), V)
  void decode_step(const DecodeStep& step, float* out);
  // decode_step's parts: its rows, tokens and positions checked against
  // the capacity, the vocabulary and the cache;
  void check_decode_step(const DecodeStep& step) const;
  // the logits of the wanted rows (ascending) of h, run by run of
  // consecutive rows, into out. h: backend (R, C), out: host (wanted, V)
  void decode_logits(Act h, const std::vector<int32_t>& wanted, int R, float* out);

  // ---- classify ----

  // The batch's image rows, in the compute precision, into the stack.
  void upload_patches(const Batch& batch);

  void upload_labels(const Batch& batch);

  // Forward to the scores: class_logits (B, K).
  void classify_forward(const Batch& batch, bool training);

  void run_classify(const Batch& batch, float smoothing, float grad_scale, bool training,
                    GradientListener* listener);

  // scores: host (B, K)
  void classify_scores(const Batch& batch, float* scores);

  void run(const Batch& batch, float smoothing, float grad_scale, bool training,
           GradientListener* listener);

  std::vector<int64_t> take_counts(int64_t* counts);

  LossSums take(LossSums* sums);
};

}  // namespace mpiformer
