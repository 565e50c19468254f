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
struct Batch {
  PackedSequences encoder;       // seq2seq only
  PackedSequences decoder;       // the sequences that produce predictions
  std::vector<int32_t> targets;  // (decoder.total()); pad id: weight 0

  // Tokens the batch occupies when padded to its longest sequence (both sides
  // for seq2seq): the budget --max-tokens bounds, and the denominator of
  // padding efficiency.
  int64_t padded_tokens() const;
  int64_t real_tokens() const;              // encoder.total() + decoder.total()
  int64_t target_tokens(int pad_id) const;  // targets != pad: the loss weight
  void clear();
};

}  // namespace mpiformer
