// Decoding with a trained model: greedy and beam search (seq2seq: translate
// a source; lm: continue a prompt) and top-k sampling (lm), for many
// sentences at once. Each self-attention layer keeps the keys and values of
// the tokens already fed (Model::decode_step), so a step runs the decoder
// over one new row per live hypothesis; a seq2seq's cross-attention keys
// and values are computed once per source. Hypotheses of every sentence
// decoding share each step's calls. Sentences join in input order while
// the model's capacity holds them; one that is done leaves at once, and its
// cache and memory rows go to the next to join. With DecodeOptions::cache
// off, every step feeds every token of every hypothesis again: the
// reference the cache is tested against.
//
// A sentence decodes to the same tokens alone or in any batch, with or
// without the cache: the ops run batch-invariant (Ops::set_batch_invariant)
// and each row reads only its own keys.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "src/model/model.h"

namespace mpiformer {

struct DecodeOptions {
  int max_new_tokens = 0;  // 0: up to the model's max-len
  int min_new_tokens = 0;  // EOS is not chosen before this many new tokens
  int beam = 1;            // 1: greedy
  float length_alpha = 1;  // beam scores are log p / length^alpha
  int top_k = 0;           // > 0: sample among the k most likely (lm)
  float temperature = 1;   // sampling temperature
  bool cache = true;       // false: recompute every prefix at every step
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

// What decoding a set of sentences together asks of the model's capacity
// (ModelCapacity): sums over the sentences, so a batch's needs add up.
struct DecodeNeeds {
  int64_t prefill_rows = 0;  // decoder rows of the first step (lm: BOS and the prompt)
  int64_t beam_rows = 0;     // decoder rows of a later step (a row per live hypothesis)
  int64_t cache_rows = 0;    // key/value cache rows written over the whole decoding
  int64_t source_rows = 0;   // encoder rows (seq2seq)
  DecodeNeeds& operator+=(const DecodeNeeds& o) {
    prefill_rows += o.prefill_rows, beam_rows += o.beam_rows;
    cache_rows += o.cache_rows, source_rows += o.source_rows;
    return *this;
  }
};

// The needs of decoding `input` (seq2seq: a source without EOS; lm: a
// prompt without BOS) with these options.
DecodeNeeds decode_needs(const ModelConfig& config, const std::vector<int32_t>& input,
                         const Layout& layout, const DecodeOptions& options);
// A model capacity that holds a batch of these needs.
ModelCapacity decode_capacity(const ModelConfig& config, const DecodeNeeds& needs,
                              const DecodeOptions& options);

// The inputs' order, shortest first, and a capacity that decodes them in
// that order as a stream: the largest group of consecutive inputs whose
// cache, source and first-step rows stay within max_rows (an input larger
// than that alone).
struct DecodePlan {
  std::vector<size_t> order;
  ModelCapacity capacity;
};
DecodePlan plan_decoding(const ModelConfig& config, const std::vector<std::vector<int32_t>>& inputs,
                         const Layout& layout, const DecodeOptions& options, int64_t max_rows);

// Where a decoding's time went, for a rate and its breakdown: the model's
// calls (on a GPU they wait for it, the logits' copy included) against the
// choice of tokens from the logits on the host.
struct DecodeStats {
  int64_t steps = 0;          // decode_step calls
  int64_t rows = 0;           // decoder rows fed, over every step
  int64_t tokens = 0;         // of the hypotheses handed to `done`, each EOS included
  double model_seconds = 0;   // decode_sources and decode_step
  double choose_seconds = 0;  // log-softmax and the choice, on the host
};

// Decodes `inputs` (as for decode_needs), sentence i drawing its samples
// from seeds[i], as many at a time as the model's capacity holds, and
// hands each to `done(i, hypothesis)` as it finishes (any order). The
// capacity must hold decode_needs of each input alone (decode_capacity);
// of them all, and they all decode together. `stats`, when given, adds
// this decoding's figures.
void decode(Model& model, const std::vector<std::vector<int32_t>>& inputs,
            const std::vector<uint64_t>& seeds, const Layout& layout, const DecodeOptions& options,
            const std::function<void(size_t, Hypothesis)>& done, DecodeStats* stats = nullptr);
// The same, returning one hypothesis per input, in order.
std::vector<Hypothesis> decode(Model& model, const std::vector<std::vector<int32_t>>& inputs,
                               const std::vector<uint64_t>& seeds, const Layout& layout,
                               const DecodeOptions& options);

}  // namespace mpiformer
