// Tiny model shapes and random ragged batches shared by the model, reducer
// and data-parallel tests.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "src/core/config.h"
#include "src/data/batch.h"

namespace mpiformer::testing {

inline ModelConfig tiny(ModelKind kind) {
  ModelConfig m;
  m.kind = kind;
  m.layers = 2;
  m.enc_layers = 2;
  m.dec_layers = 2;
  m.d_model = 16;
  m.heads = 2;
  m.d_ff = 32;
  m.vocab = 24;
  m.max_len = 12;
  return m;
}

// A ragged batch of the given decoder (and encoder) lengths with random ids;
// every third target is pad so padding is exercised.
inline Batch random_batch(const ModelConfig& m, const std::vector<int>& lengths,
                          const std::vector<int>& src_lengths, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> symbol(SpecialTokens::kCount, m.vocab - 1);
  Batch batch;
  std::vector<int32_t> ids;
  for (size_t b = 0; b < lengths.size(); ++b) {
    if (m.kind == ModelKind::kSeq2seq) {
      ids.assign(src_lengths[b], 0);
      for (int32_t& t : ids) t = symbol(rng);
      batch.encoder.append(ids.data(), src_lengths[b]);
    }
    ids.assign(lengths[b], 0);
    for (int32_t& t : ids) t = symbol(rng);
    batch.decoder.append(ids.data(), lengths[b]);
    for (int i = 0; i < lengths[b]; ++i)
      batch.targets.push_back((batch.targets.size() % 3 == 2) ? m.special.pad : symbol(rng));
  }
  return batch;
}

// Appends every sequence of `b` to `out`.
inline void append_batch(Batch* out, const Batch& b) {
  for (int s = 0; s < b.decoder.batch(); ++s) {
    if (b.encoder.batch() > 0)
      out->encoder.append(&b.encoder.tokens[b.encoder.offsets[s]], b.encoder.length(s));
    out->decoder.append(&b.decoder.tokens[b.decoder.offsets[s]], b.decoder.length(s));
  }
  out->targets.insert(out->targets.end(), b.targets.begin(), b.targets.end());
}

}  // namespace mpiformer::testing
