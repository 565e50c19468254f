// One micro-batch, packed without padding (see kernels/ops.h, "ragged").
// Host-side; the model copies it to its backend.
#pragma once

#include <cstdint>
#include <vector>

namespace mpiformer {

struct PackedSequences {
  std::vector<int32_t> offsets{0};  // (B+1)
  std::vector<int32_t> tokens;      // (N) input ids
  std::vector<int32_t> positions;   // (N) index within its sequence

  int batch() const { return static_cast<int>(offsets.size()) - 1; }
  int total() const { return offsets.back(); }
  int length(int b) const { return offsets[b + 1] - offsets[b]; }
  int max_len() const;
  void append(const int32_t* ids, int n);  // adds one sequence
  void clear();
};

// lm:      decoder.tokens = x[0..n-1], targets = x[1..n] (pad where no loss)
// mlm:     decoder.tokens = masked x, targets = x at chosen positions, pad elsewhere
// seq2seq: encoder.tokens = source, decoder.tokens = BOS + y, targets = y + EOS
// classify: decoder.tokens = [BOS as CLS with --pool cls] x, one prediction
//          per sequence: targets = its label (softmax, (B)), or label_targets
//          (zlpr, (B, K)); images: decoder.tokens are 0 and `patches` holds
//          each row's pixels and position (ModelConfig::patch_features).
struct Batch {
  PackedSequences encoder;           // seq2seq only
  PackedSequences decoder;           // the sequences that produce predictions
  std::vector<int32_t> targets;      // (decoder.total()); pad id: weight 0. softmax classify: (B)
  bool per_sequence = false;         // classify: one loss term per sequence
  std::vector<float> label_targets;  // zlpr classify: (B, K), each in [0, 1]
  std::vector<float> patches;        // images: (decoder.total(), patch_features)

  // Tokens the batch occupies when padded to its longest sequence (both sides
  // for seq2seq): the budget --max-tokens bounds, and the denominator of
  // padding efficiency.
  int64_t padded_tokens() const;
  int64_t real_tokens() const;  // encoder.total() + decoder.total()
  // The loss weight: targets != pad, or for a classifier its sequences
  // (examples), which divide its loss as target tokens divide the others'.
  int64_t target_tokens(int pad_id) const;
  void clear();
};

}  // namespace mpiformer
