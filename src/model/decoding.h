// Decoding with a trained model: greedy and beam search (seq2seq: translate a
// source; lm: continue a prompt) and top-k sampling (lm). Each step runs the
// whole prefix through the model again (no key/value cache yet): simple and
// exact, quadratic in the output length, fine for sentences.
#pragma once

#include <cstdint>
#include <vector>

#include "src/model/model.h"

namespace mpiformer {

struct DecodeOptions {
  int max_new_tokens = 0;  // 0: up to the model's max-len
  int beam = 1;            // 1: greedy
  float length_alpha = 1;  // beam scores are log p / length^alpha
  int top_k = 0;           // > 0: sample among the k most likely (lm)
  float temperature = 1;   // sampling temperature
  uint64_t seed = 1;       // sampling: the same seed, the same output
};

// A decoded sequence: its ids (without BOS, without the final EOS) and its
// total log-probability.
struct Hypothesis {
  std::vector<int32_t> ids;
  double log_prob = 0;
  bool finished = false;  // ended with EOS (else cut at the length limit)
};

// How the training data laid sequences out (src/data/shard_source.h and
// synthetic.h): text from shards has an EOS after the source and a BOS
// before an lm's text; the synthetic tasks have neither.
struct Layout {
  bool source_eos = true;  // seq2seq encoder: source EOS
  bool lm_bos = true;      // lm decoder: BOS text
};

// seq2seq: translates `source` (ids without EOS). The model's capacity must
// hold beam x max-len decoder tokens and beam x (source + 1) encoder tokens.
Hypothesis translate(Model& model, const std::vector<int32_t>& source, const Layout& layout,
                     const DecodeOptions& options);

// lm: continues `prompt` (ids without BOS), greedily, by beam search or by
// top-k sampling. The returned ids are the continuation only.
Hypothesis continue_text(Model& model, const std::vector<int32_t>& prompt, const Layout& layout,
                         const DecodeOptions& options);

}  // namespace mpiformer
