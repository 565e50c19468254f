// Synthetic tasks for every model kind, generated deterministically from the
// seed: the i-th batch of a stream is the same whoever asks for it.
//
// Each example is a pair (x, y) of random data symbols, |x| drawn uniformly
// from [min_len, longest that fits max_len]:
//   reverse: y = reversed x;  copy: y = x;  sort: y = x sorted ascending.
// Layout per model kind (see Batch):
//   seq2seq: source x, decoder BOS y, targets y EOS.
//   lm:      decoder x SEP y, targets pad on the x part, then y EOS: loss and
//            accuracy count only the predictable half.
//   mlm:     decoder x SEP y with --mlm-probability of the real tokens chosen
//            (at least one): 80% MASK, 10% a random symbol, 10% kept; targets
//            the original token at chosen positions, pad elsewhere.
#pragma once

#include <cstdint>

#include "src/core/config.h"
#include "src/data/batch.h"
#include "src/data/batch_source.h"

namespace mpiformer {

class SyntheticSource : public BatchSource {
 public:
  // max_tokens bounds the padded tokens of a batch; max_sentences (0: no
  // limit) its number of sequences. Throws std::invalid_argument when no
  // example fits (max_len too small for the layout, or max_tokens < one example).
  SyntheticSource(SyntheticTask task, const ModelConfig& model, int max_tokens, int max_sentences,
                  int min_len, float mlm_probability, uint64_t seed);

  // Fills `out` with micro-batch `index` of `stream`.
  void make_batch(uint64_t stream, uint64_t index, Batch* out) override;

  // Longest x that fits the model's max_len for this layout.
  int max_example_len() const { return max_x_len_; }

 private:
  SyntheticTask task_;
  ModelConfig model_;
  int max_tokens_;
  int max_sentences_;
  int min_len_;
  float mlm_probability_;
  uint64_t seed_;
  int max_x_len_;
};

}  // namespace mpiformer
