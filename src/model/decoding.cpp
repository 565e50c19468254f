#include "src/model/decoding.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <utility>

#include "src/data/mlm_masking.h"

namespace mpiformer {

namespace {

// log-softmax of one row of logits, in place.  x: (V)
void log_softmax(float* x, int V) {
  const float top = *std::max_element(x, x + V);
  double sum = 0;
  for (int i = 0; i < V; ++i) sum += std::exp(static_cast<double>(x[i] - top));
  const float log_sum = static_cast<float>(std::log(sum)) + top;
  for (int i = 0; i < V; ++i) x[i] -= log_sum;
}

// Ids a decoder may emit: never pad, bos, [MASK] or [SEP].
bool emittable(int id, const SpecialTokens& s) {
  return id != s.pad && id != s.bos && id != s.mask && id != s.sep;
}

// Beam search shared by both kinds. `prefix` (BOS included when the layout
// has one) starts every beam; `source`, when not empty, is the encoder side.
Hypothesis search(Model& model, const std::vector<int32_t>& source,
                  const std::vector<int32_t>& prefix, const DecodeOptions& options) {
  const ModelConfig& c = model.config();
  const SpecialTokens& sp = c.special;
  const int V = c.vocab, beam = std::max(1, options.beam);
  // prefix + new tokens fit the positions table.
  const int room = c.max_len - static_cast<int>(prefix.size());
  if (room <= 0) throw std::runtime_error("the prompt fills the model's max-len");
  const int limit = options.max_new_tokens > 0 ? std::min(options.max_new_tokens, room) : room;

  struct Beam {
    std::vector<int32_t> ids;  // new tokens
    double log_prob = 0;
  };
  std::vector<Beam> beams{Beam{}};
  std::vector<Hypothesis> done;
  const auto score = [&](double log_prob, size_t length) {
    return log_prob / std::pow(std::max<size_t>(length, 1), options.length_alpha);
  };
  KeyedRng rng(mix64(options.seed ^ 0x5A4D504C45ull));  // sampling only
  std::vector<float> logits;
  Batch batch;
  for (int t = 0; t < limit && !beams.empty(); ++t) {
    batch.clear();
    std::vector<int32_t> row;
    for (const Beam& b : beams) {
      row.assign(prefix.begin(), prefix.end());
      row.insert(row.end(), b.ids.begin(), b.ids.end());
      batch.decoder.append(row.data(), static_cast<int>(row.size()));
      if (!source.empty()) batch.encoder.append(source.data(), static_cast<int>(source.size()));
    }
    batch.targets.assign(batch.decoder.total(), sp.pad);
    logits.resize(beams.size() * static_cast<size_t>(V));
    model.last_logits(batch, logits.data());

    // Every (beam, token) extension, best first; keep `beam` of them.
    struct Candidate {
      double log_prob;
      int from, token;
    };
    std::vector<Candidate> candidates;
    for (size_t b = 0; b < beams.size(); ++b) {
      float* x = logits.data() + b * V;
      if (options.top_k > 0 && options.temperature > 0)
        for (int i = 0; i < V; ++i) x[i] /= options.temperature;
      log_softmax(x, V);
      for (int id = 0; id < V; ++id) {
        if (!emittable(id, sp)) continue;
        candidates.push_back({beams[b].log_prob + x[id], static_cast<int>(b), id});
      }
    }
    if (options.top_k > 0) {
      // Top-k sampling (one beam): draw among the k most likely.
      const size_t k = std::min<size_t>(options.top_k, candidates.size());
      std::partial_sort(
          candidates.begin(), candidates.begin() + k, candidates.end(),
          [](const Candidate& a, const Candidate& b) { return a.log_prob > b.log_prob; });
      double total = 0;
      for (size_t i = 0; i < k; ++i)
        total += std::exp(candidates[i].log_prob - candidates[0].log_prob);
      double draw = rng.uniform01() * total;
      size_t pick = 0;
      for (; pick + 1 < k; ++pick) {
        draw -= std::exp(candidates[pick].log_prob - candidates[0].log_prob);
        if (draw <= 0) break;
      }
      candidates = {candidates[pick]};
    } else {
      const size_t keep = std::min<size_t>(2 * beam, candidates.size());
      std::partial_sort(candidates.begin(), candidates.begin() + keep, candidates.end(),
                        [](const Candidate& a, const Candidate& b) {
                          return a.log_prob > b.log_prob ||
                                 (a.log_prob == b.log_prob &&
                                  (a.from < b.from || (a.from == b.from && a.token < b.token)));
                        });
      candidates.resize(keep);
    }
    std::vector<Beam> next;
    for (const Candidate& cand : candidates) {
      if (static_cast<int>(next.size()) >= beam) break;
      Beam extended{beams[cand.from].ids, cand.log_prob};
      if (cand.token == sp.eos) {
        done.push_back({extended.ids, extended.log_prob, true});
      } else {
        extended.ids.push_back(cand.token);
        next.push_back(std::move(extended));
      }
    }
    beams = std::move(next);
    // The usual rule: stop once `beam` hypotheses have ended.
    if (static_cast<int>(done.size()) >= beam) break;
  }
  for (const Beam& b : beams) done.push_back({b.ids, b.log_prob, false});
  if (done.empty()) return {};
  return *std::max_element(done.begin(), done.end(), [&](const Hypothesis& a, const Hypothesis& b) {
    return score(a.log_prob, a.ids.size() + a.finished) <
           score(b.log_prob, b.ids.size() + b.finished);
  });
}

}  // namespace

Hypothesis translate(Model& model, const std::vector<int32_t>& source, const Layout& layout,
                     const DecodeOptions& options) {
  const ModelConfig& c = model.config();
  if (c.kind != ModelKind::kSeq2seq) throw std::runtime_error("translate needs a seq2seq model");
  std::vector<int32_t> encoder = source;
  const int room = c.max_len - (layout.source_eos ? 1 : 0);
  // A longer source keeps its first tokens and loses its EOS, as in training.
  if (static_cast<int>(encoder.size()) > room) {
    encoder.resize(c.max_len);
  } else if (layout.source_eos) {
    encoder.push_back(c.special.eos);
  }
  if (encoder.empty()) return {};
  DecodeOptions o = options;
  o.top_k = 0;
  return search(model, encoder, {c.special.bos}, o);
}

Hypothesis continue_text(Model& model, const std::vector<int32_t>& prompt, const Layout& layout,
                         const DecodeOptions& options) {
  const ModelConfig& c = model.config();
  if (c.kind != ModelKind::kLm) throw std::runtime_error("continue_text needs an lm");
  std::vector<int32_t> prefix;
  if (layout.lm_bos) prefix.push_back(c.special.bos);
  prefix.insert(prefix.end(), prompt.begin(), prompt.end());
  if (prefix.empty()) throw std::runtime_error("an empty prompt: this lm starts from a token");
  DecodeOptions o = options;
  if (o.top_k > 0) o.beam = 1;
  return search(model, {}, prefix, o);
}

}  // namespace mpiformer
