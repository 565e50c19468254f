#include "src/model/decoding.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <utility>

#include "kernels/cpu/softmax_row.h"
#include "src/data/mlm_masking.h"

namespace mpiformer {

namespace {

// Ids a decoder may emit: never pad, bos, [MASK] or [SEP]; EOS only once
// DecodeOptions::min_new_tokens are out.
bool emittable(int id, const SpecialTokens& s, bool eos_allowed) {
  return id != s.pad && id != s.bos && id != s.mask && id != s.sep && (eos_allowed || id != s.eos);
}

// The options as a model kind reads them: a seq2seq never samples, and
// sampling keeps one hypothesis.
DecodeOptions for_kind(const ModelConfig& c, DecodeOptions o) {
  if (c.kind == ModelKind::kSeq2seq) o.top_k = 0;
  if (o.top_k > 0) o.beam = 1;
  o.beam = std::max(1, o.beam);
  return o;
}

// What one input becomes: the decoder's prefix (BOS included when the
// layout has one), the encoder's rows (seq2seq) and the most new tokens.
struct Framed {
  std::vector<int32_t> prefix;
  std::vector<int32_t> source;
  int limit = 0;  // 0: nothing to decode (an empty source)
};

Framed frame(const ModelConfig& c, const std::vector<int32_t>& input, const Layout& layout,
             const DecodeOptions& options) {
  Framed f;
  if (c.kind == ModelKind::kSeq2seq) {
    f.source = input;
    const int room = c.max_len - (layout.source_eos ? 1 : 0);
    // A longer source keeps its first tokens and loses its EOS, as in training.
    if (static_cast<int>(f.source.size()) > room) {
      f.source.resize(c.max_len);
    } else if (layout.source_eos) {
      f.source.push_back(c.special.eos);
    }
    if (f.source.empty()) return f;
    f.prefix = {c.special.bos};
  } else if (c.kind == ModelKind::kLm) {
    if (layout.lm_bos) f.prefix.push_back(c.special.bos);
    f.prefix.insert(f.prefix.end(), input.begin(), input.end());
    if (f.prefix.empty()) throw std::runtime_error("an empty prompt: this lm starts from a token");
  } else {
    throw std::runtime_error("decoding needs an lm or a seq2seq model");
  }
  // prefix + new tokens fit the positions table.
  const int room = c.max_len - static_cast<int>(f.prefix.size());
  if (room <= 0) throw std::runtime_error("the prompt fills the model's max-len");
  f.limit = options.max_new_tokens > 0 ? std::min(options.max_new_tokens, room) : room;
  return f;
}

struct Beam {
  std::vector<int32_t> ids;  // new tokens
  double log_prob = 0;
  std::vector<int32_t> rows;  // with the cache: the cache rows of the tokens fed so far
};

// What decoding one framed input asks (decode_needs).
DecodeNeeds needs_of(const Framed& f, const DecodeOptions& o) {
  DecodeNeeds needs;
  if (f.limit == 0) return needs;
  const int64_t P = static_cast<int64_t>(f.prefix.size());
  needs.prefill_rows = P;
  needs.beam_rows = o.beam;
  needs.source_rows = static_cast<int64_t>(f.source.size());
  // With the cache: the prefix, then a row per hypothesis at each later
  // step. Without: every row of every hypothesis at the last step.
  needs.cache_rows = o.cache ? P + o.beam * static_cast<int64_t>(f.limit - 1)
                             : std::max<int64_t>(P, o.beam * (P + f.limit - 1));
  return needs;
}

// What a sentence holds of the model's capacity while it decodes: cache
// rows, rows of a step (ModelCapacity::max_tokens) and memory rows (its
// source's, in the same max_tokens).
struct Holding {
  int64_t cache = 0, step = 0, memory = 0;
  Holding(const DecodeNeeds& n, const DecodeOptions& o)
      : cache(n.cache_rows),
        step(o.cache ? std::max(n.prefill_rows, n.beam_rows) : n.cache_rows),
        memory(n.source_rows) {}
  Holding() = default;
  Holding& operator+=(const Holding& h) {
    cache += h.cache, step += h.step, memory += h.memory;
    return *this;
  }
  Holding& operator-=(const Holding& h) {
    cache -= h.cache, step -= h.step, memory -= h.memory;
    return *this;
  }
};

struct Sentence {
  Framed framed;
  DecodeNeeds needs;
  KeyedRng rng{0};  // sampling only
  std::vector<Beam> beams{Beam{}};
  std::vector<Hypothesis> done;
  int step = 0;                      // new tokens chosen so far
  std::vector<int32_t> cache_rows;   // the cache rows it was given (with the cache)
  std::vector<int32_t> memory_rows;  // seq2seq: the memory rows of its source, in order
  bool active = false;
};

// The rows of a buffer, given out one at a time and given back (the
// key/value cache; the encoder memory). Rows go out lowest first.
class RowPool {
 public:
  explicit RowPool(int rows) : rows_(rows) { reset(); }
  // Every row free again.
  void reset() {
    free_.resize(static_cast<size_t>(rows_));
    for (int i = 0; i < rows_; ++i) free_[static_cast<size_t>(i)] = rows_ - 1 - i;
  }
  int32_t take() {
    // Sentences join only while the capacity holds their needs: never empty.
    if (free_.empty()) throw std::logic_error("decode: more rows taken than the capacity holds");
    const int32_t row = free_.back();
    free_.pop_back();
    return row;
  }
  void give_back(std::vector<int32_t>& rows) {
    free_.insert(free_.end(), rows.rbegin(), rows.rend());
    rows.clear();
  }

 private:
  int rows_;
  std::vector<int32_t> free_;  // a stack: its last is the next given
};

// The decoder rows of a step, each with its key lists, as they are added.
class StepRows {
 public:
  // Starts `step` afresh; its vectors keep their capacity from step to step.
  explicit StepRows(DecodeStep& step) : step_(step) {
    for (std::vector<int32_t>* v :
         {&step_.tokens, &step_.positions, &step_.cache_rows, &step_.self_starts, &step_.self_rows,
          &step_.source_starts, &step_.source_rows, &step_.logit_rows})
      v->clear();
    step_.self_starts.push_back(0);
    step_.source_starts.push_back(0);
  }
  // A row of `token` at `position`, kept at cache row `cache_row`, that
  // attends `keys` and then itself, and the memory rows `source`.
  // Returns its cache row.
  int32_t add(int32_t token, int position, int32_t cache_row, const std::vector<int32_t>& keys,
              size_t key_count, const std::vector<int32_t>& source, bool want_logits) {
    if (want_logits) step_.logit_rows.push_back(step_.rows());
    step_.tokens.push_back(token);
    step_.positions.push_back(position);
    step_.cache_rows.push_back(cache_row);
    step_.self_rows.insert(step_.self_rows.end(), keys.begin(),
                           keys.begin() + static_cast<std::ptrdiff_t>(key_count));
    step_.self_rows.push_back(cache_row);
    step_.self_starts.push_back(static_cast<int32_t>(step_.self_rows.size()));
    step_.source_rows.insert(step_.source_rows.end(), source.begin(), source.end());
    step_.source_starts.push_back(static_cast<int32_t>(step_.source_rows.size()));
    return cache_row;
  }

 private:
  DecodeStep& step_;
};

// The rows sentence s feeds this step, their cache rows from `pool`.
// cache: the prefix at its first step, then each hypothesis's newest token
// against its cached rows; without: every token of every hypothesis,
// attending the rows fed now.
void feed(Sentence& s, StepRows& rows, bool cache, RowPool& pool) {
  const std::vector<int32_t>& prefix = s.framed.prefix;
  const int P = static_cast<int>(prefix.size());
  const auto take = [&] {
    const int32_t row = pool.take();
    if (cache) s.cache_rows.push_back(row);
    return row;
  };
  if (cache) {
    if (s.step == 0) {
      Beam& first = s.beams[0];
      for (int j = 0; j < P; ++j) {
        first.rows.push_back(rows.add(prefix[j], j, take(), first.rows, first.rows.size(),
                                      s.memory_rows, j + 1 == P));
      }
      return;
    }
    for (Beam& b : s.beams) {
      b.rows.push_back(rows.add(b.ids.back(), P + s.step - 1, take(), b.rows, b.rows.size(),
                                s.memory_rows, true));
    }
    return;
  }
  std::vector<int32_t> fed;  // this hypothesis's rows so far
  for (const Beam& b : s.beams) {
    fed.clear();
    const int length = P + static_cast<int>(b.ids.size());
    for (int j = 0; j < length; ++j) {
      const int32_t token = j < P ? prefix[j] : b.ids[j - P];
      fed.push_back(rows.add(token, j, take(), fed, fed.size(), s.memory_rows, j + 1 == length));
    }
  }
}

// An extension of hypothesis `from` by `token`, and its log-probability.
struct Candidate {
  double log_prob;
  int from, token;
};

// Best first; ties go to the earlier hypothesis, then the smaller id.
bool better(const Candidate& a, const Candidate& b) {
  return a.log_prob > b.log_prob ||
         (a.log_prob == b.log_prob && (a.from < b.from || (a.from == b.from && a.token < b.token)));
}

// Appends the `keep` best emittable extensions of beam `from` (better()
// order) to `out`; none of the others can be among a step's best `keep`.
// log_probs: (V)
void best_extensions(const float* log_probs, int V, double base, int from, size_t keep,
                     const SpecialTokens& sp, bool eos_allowed, std::vector<Candidate>& out) {
  const size_t first = out.size();
  if (keep > 32) {
    // Many: every extension, then a partial sort.
    for (int id = 0; id < V; ++id)
      if (emittable(id, sp, eos_allowed)) out.push_back({base + log_probs[id], from, id});
    const size_t n = std::min(keep, out.size() - first);
    std::partial_sort(out.begin() + first, out.begin() + first + n, out.end(), better);
    out.resize(first + n);
    return;
  }
  // Few (beams, greedy): a short sorted list that most ids fail to enter.
  // Ids come in ascending order, so one that only ties the list's last
  // is not better: a float below `floor` can be passed over at once.
  // A run of kRun ids whose largest is below it is passed over whole.
  constexpr int kRun = 16;
  float floor = -std::numeric_limits<float>::infinity();
  for (int run = 0; run < V; run += kRun) {
    const int end = std::min(V, run + kRun);
    float top = floor;
#pragma omp simd reduction(max : top)
    for (int id = run; id < end; ++id) top = top > log_probs[id] ? top : log_probs[id];
    if (top <= floor) continue;
    for (int id = run; id < end; ++id) {
      if (log_probs[id] <= floor || !emittable(id, sp, eos_allowed)) continue;
      const Candidate c{base + log_probs[id], from, id};
      if (out.size() - first == keep && !better(c, out.back())) continue;
      out.insert(std::upper_bound(out.begin() + first, out.end(), c, better), c);
      if (out.size() - first > keep) out.pop_back();
      if (out.size() - first == keep) floor = log_probs[out.back().token];
    }
  }
}

// Chooses sentence s's next tokens from its hypotheses' logits, (beams, V)
// row by row, overwritten by log-probabilities.
void advance(Sentence& s, float* logits, const ModelConfig& c, const DecodeOptions& options) {
  const SpecialTokens& sp = c.special;
  const int V = c.vocab, beam = options.beam;
  // Each hypothesis's best extensions: `beam` of them are kept, and up to
  // `beam` more may end at EOS. Sampling draws among the top k.
  const size_t keep = options.top_k > 0 ? static_cast<size_t>(options.top_k) : 2 * beam;
  const bool eos_allowed = s.step >= options.min_new_tokens;
  std::vector<Candidate> candidates;
  for (size_t b = 0; b < s.beams.size(); ++b) {
    float* x = logits + b * V;
    if (options.top_k > 0 && options.temperature > 0)
      for (int i = 0; i < V; ++i) x[i] /= options.temperature;
    cpu::log_softmax_row(x, V);
    best_extensions(x, V, s.beams[b].log_prob, static_cast<int>(b), keep, sp, eos_allowed,
                    candidates);
  }
  const size_t n = std::min(keep, candidates.size());
  std::partial_sort(candidates.begin(), candidates.begin() + n, candidates.end(), better);
  candidates.resize(n);
  if (options.top_k > 0 && !candidates.empty()) {
    // Top-k sampling (one beam): draw among the k most likely.
    double total = 0;
    for (const Candidate& cand : candidates)
      total += std::exp(cand.log_prob - candidates[0].log_prob);
    double draw = s.rng.uniform01() * total;
    size_t pick = 0;
    for (; pick + 1 < n; ++pick) {
      draw -= std::exp(candidates[pick].log_prob - candidates[0].log_prob);
      if (draw <= 0) break;
    }
    candidates = {candidates[pick]};
  }
  std::vector<Beam> next;
  for (const Candidate& cand : candidates) {
    if (static_cast<int>(next.size()) >= beam) break;
    const Beam& parent = s.beams[cand.from];
    if (cand.token == sp.eos) {
      s.done.push_back({parent.ids, cand.log_prob, true});
    } else {
      Beam extended{parent.ids, cand.log_prob, parent.rows};
      extended.ids.push_back(cand.token);
      next.push_back(std::move(extended));
    }
  }
  s.beams = std::move(next);
  ++s.step;
  // The usual rule: stop once `beam` hypotheses have ended.
  if (s.beams.empty() || static_cast<int>(s.done.size()) >= beam || s.step >= s.framed.limit)
    s.active = false;
}

// The best of a finished sentence's hypotheses, by length-normalised score.
Hypothesis best(Sentence& s, const DecodeOptions& options) {
  for (const Beam& b : s.beams) s.done.push_back({b.ids, b.log_prob, false});
  if (s.done.empty()) return {};
  const auto score = [&](const Hypothesis& h) {
    const size_t length = h.ids.size() + (h.finished ? 1 : 0);
    return h.log_prob / std::pow(std::max<size_t>(length, 1), options.length_alpha);
  };
  return *std::max_element(
      s.done.begin(), s.done.end(),
      [&](const Hypothesis& a, const Hypothesis& b) { return score(a) < score(b); });
}

}  // namespace

DecodeNeeds decode_needs(const ModelConfig& config, const std::vector<int32_t>& input,
                         const Layout& layout, const DecodeOptions& options) {
  const DecodeOptions o = for_kind(config, options);
  return needs_of(frame(config, input, layout, o), o);
}

DecodePlan plan_decoding(const ModelConfig& config, const std::vector<std::vector<int32_t>>& inputs,
                         const Layout& layout, const DecodeOptions& options, int64_t max_rows) {
  const size_t n = inputs.size();
  std::vector<DecodeNeeds> needs(n);
  for (size_t i = 0; i < n; ++i) needs[i] = decode_needs(config, inputs[i], layout, options);
  DecodePlan plan;
  std::vector<size_t>& order = plan.order;
  order.resize(n);
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return inputs[a].size() < inputs[b].size(); });
  DecodeNeeds batch, largest;
  size_t members = 0;
  const auto close = [&] {
    if (members == 0) return;
    largest.prefill_rows = std::max(largest.prefill_rows, batch.prefill_rows);
    largest.beam_rows = std::max(largest.beam_rows, batch.beam_rows);
    largest.cache_rows = std::max(largest.cache_rows, batch.cache_rows);
    largest.source_rows = std::max(largest.source_rows, batch.source_rows);
    members = 0;
    batch = DecodeNeeds{};
  };
  for (size_t i : order) {
    DecodeNeeds with = batch;
    with += needs[i];
    if (members > 0 && std::max({with.cache_rows, with.source_rows, with.prefill_rows}) > max_rows)
      close();
    batch += needs[i];
    ++members;
  }
  close();
  plan.capacity = decode_capacity(config, largest, options);
  return plan;
}

ModelCapacity decode_capacity(const ModelConfig& config, const DecodeNeeds& needs,
                              const DecodeOptions& options) {
  int64_t step_rows = std::max({needs.prefill_rows, needs.beam_rows, needs.source_rows});
  if (!options.cache) step_rows = std::max(step_rows, needs.cache_rows);
  const int64_t most = std::numeric_limits<int32_t>::max();
  if (step_rows > most || needs.cache_rows > most)
    throw std::runtime_error("decoding needs more than 2^31 - 1 rows at once");
  ModelCapacity capacity;
  capacity.max_tokens = static_cast<int>(std::max<int64_t>(step_rows, 1));
  capacity.max_len = config.max_len;
  capacity.cache_rows = static_cast<int>(std::max<int64_t>(needs.cache_rows, 1));
  return capacity;
}

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The sentences of one decode() call as a stream through the model's
// capacity: they join in order while it holds them beside the live ones,
// decode a step at a time together, and leave when done.
class Stream {
 public:
  Stream(Model& model, std::vector<Sentence>& sentences, const DecodeOptions& o,
         const std::function<void(size_t, Hypothesis)>& done, DecodeStats& figures)
      : model_(model),
        c_(model.config()),
        room_(model.capacity()),
        o_(o),
        sentences_(sentences),
        done_(done),
        figures_(figures),
        logits_(model.parameters().ops().device()),
        cache_pool_(room_.cache_rows),
        memory_pool_(c_.kind == ModelKind::kSeq2seq ? room_.max_tokens : 0) {}

  // Until every sentence is done.
  void run() {
    while (next_ < sentences_.size() || !live_.empty()) {
      join();
      if (live_.empty()) break;
      // Without the cache every step starts from nothing: every source again.
      if (!o_.cache) {
        cache_pool_.reset();
        memory_pool_.reset();
        for (size_t i : live_) sentences_[i].memory_rows.clear();
      }
      if (c_.kind == ModelKind::kSeq2seq) encode(o_.cache ? joining_ : live_);
      step();
      leave();
    }
  }

 private:
  // Sentences join in order while the capacity holds them beside the live
  // ones; one with nothing to decode is done at once.
  void join() {
    joining_.clear();
    for (; next_ < sentences_.size(); ++next_) {
      Sentence& s = sentences_[next_];
      if (s.framed.limit == 0) {
        done_(next_, Hypothesis{});
        continue;
      }
      Holding with = held_;
      with += Holding(s.needs, o_);
      if (with.cache > room_.cache_rows || with.step > room_.max_tokens ||
          with.memory > room_.max_tokens) {
        if (live_.empty())
          throw std::runtime_error("decode: a sentence needs more than the model's capacity");
        break;
      }
      held_ = with;
      s.active = true;
      live_.push_back(next_);
      joining_.push_back(next_);
    }
  }

  // The encoder over these sentences' sources, each given its memory rows.
  void encode(const std::vector<size_t>& which) {
    PackedSequences sources;
    std::vector<int32_t> rows;
    for (size_t i : which) {
      Sentence& s = sentences_[i];
      for (size_t j = 0; j < s.framed.source.size(); ++j)
        s.memory_rows.push_back(memory_pool_.take());
      sources.append(s.framed.source.data(), static_cast<int>(s.framed.source.size()));
      rows.insert(rows.end(), s.memory_rows.begin(), s.memory_rows.end());
    }
    if (which.empty()) return;
    const auto start = Clock::now();
    model_.decode_sources(sources, rows);
    figures_.model_seconds += seconds_since(start);
  }

  // One decoder step over the live sentences' new rows, then each chooses.
  void step() {
    StepRows rows(step_);
    for (size_t i : live_) feed(sentences_[i], rows, o_.cache, cache_pool_);
    const size_t V = static_cast<size_t>(c_.vocab);
    // (wanted rows, V), where the device copies them at the bus's pace
    auto* logits =
        static_cast<float*>(logits_.reserve(step_.logit_rows.size() * V * sizeof(float)));
    const auto model_start = Clock::now();
    model_.decode_step(step_, logits);
    const auto choose_start = Clock::now();
    figures_.model_seconds += std::chrono::duration<double>(choose_start - model_start).count();
    ++figures_.steps;
    figures_.rows += step_.rows();
    // The wanted rows come sentence by sentence, a row per hypothesis.
    // Each sentence chooses on its own (its rows, its draws): in parallel.
    first_logit_row_.clear();
    size_t row = 0;
    for (size_t i : live_) {
      first_logit_row_.push_back(row);
      row += sentences_[i].beams.size();
    }
    const int n = static_cast<int>(live_.size());
#pragma omp parallel for schedule(dynamic, 1) if (n > 1)
    for (int a = 0; a < n; ++a)
      advance(sentences_[live_[a]], logits + first_logit_row_[a] * V, c_, o_);
    figures_.choose_seconds += seconds_since(choose_start);
  }

  // A finished sentence leaves: its rows go to the sentences that join.
  void leave() {
    staying_.clear();
    for (size_t i : live_) {
      Sentence& s = sentences_[i];
      if (s.active) {
        staying_.push_back(i);
        continue;
      }
      cache_pool_.give_back(s.cache_rows);
      memory_pool_.give_back(s.memory_rows);
      held_ -= Holding(s.needs, o_);
      Hypothesis chosen = best(s, o_);
      figures_.tokens += static_cast<int64_t>(chosen.ids.size()) + (chosen.finished ? 1 : 0);
      done_(i, std::move(chosen));
      s.beams = {};
      s.done = {};
    }
    live_.swap(staying_);
  }

  Model& model_;
  const ModelConfig& c_;
  const ModelCapacity& room_;
  const DecodeOptions& o_;
  std::vector<Sentence>& sentences_;
  const std::function<void(size_t, Hypothesis)>& done_;
  DecodeStats& figures_;
  HostBuffer logits_;  // a step's logits, (wanted rows, V)
  RowPool cache_pool_, memory_pool_;
  size_t next_ = 0;                               // the next sentence to join
  std::vector<size_t> live_, joining_, staying_;  // decoding, joining now, staying on
  Holding held_;                                  // by the live sentences
  DecodeStep step_;
  std::vector<size_t> first_logit_row_;  // of each live sentence
};

}  // namespace

void decode(Model& model, const std::vector<std::vector<int32_t>>& inputs,
            const std::vector<uint64_t>& seeds, const Layout& layout, const DecodeOptions& options,
            const std::function<void(size_t, Hypothesis)>& done, DecodeStats* stats) {
  const ModelConfig& c = model.config();
  const DecodeOptions o = for_kind(c, options);
  if (seeds.size() != inputs.size()) throw std::invalid_argument("decode: a seed per input");
  std::vector<Sentence> sentences(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    Sentence& s = sentences[i];
    s.framed = frame(c, inputs[i], layout, o);
    s.needs = needs_of(s.framed, o);
    s.rng = KeyedRng(mix64(seeds[i] ^ 0x5A4D504C45ull));
  }
  DecodeStats own;
  // The weights stay as they are: the backend keeps what it derives from them.
  const Model::DecodingSession session(model);
  Stream(model, sentences, o, done, stats ? *stats : own).run();
}

std::vector<Hypothesis> decode(Model& model, const std::vector<std::vector<int32_t>>& inputs,
                               const std::vector<uint64_t>& seeds, const Layout& layout,
                               const DecodeOptions& options) {
  std::vector<Hypothesis> results(inputs.size());
  decode(model, inputs, seeds, layout, options,
         [&](size_t i, Hypothesis h) { results[i] = std::move(h); });
  return results;
}

}  // namespace mpiformer
