// Decoding: last_logits agrees with the training forward pass, and so does
// a decoding step; greedy search is the step-by-step argmax, beam search
// finds a score at least greedy's, top-k with k = 1 is greedy, sampling
// repeats with its seed, and a sentence decodes to the same bits with or
// without the key/value cache, alone or in a batch.
#include "src/model/decoding.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "kernels/backend.h"
#include "src/model/model.h"
#include "tests/test_batches.h"

namespace mpiformer {
namespace {

struct TinyModel {
  std::unique_ptr<Ops> ops = make_cpu_ops(1);
  std::unique_ptr<Model> model;
  explicit TinyModel(ModelKind kind, uint64_t seed = 3, ModelCapacity capacity = {}) {
    const ModelConfig c = testing::tiny(kind);
    if (capacity.cache_rows == 0) {
      capacity = ModelCapacity{64 * c.max_len, c.max_len};
      capacity.cache_rows = 1024;  // decoding: room for several sentences' beams
    }
    model = std::make_unique<Model>(*ops, c, capacity);
    model->init_parameters(seed);
  }
};

// One sentence decoded alone.
Hypothesis one(Model& model, const std::vector<int32_t>& input, const DecodeOptions& o,
               uint64_t seed = 1) {
  return decode(model, {input}, {seed}, Layout{}, o)[0];
}
Hypothesis translate(Model& model, const std::vector<int32_t>& source, const Layout&,
                     const DecodeOptions& o) {
  return one(model, source, o);
}

double score(const Hypothesis& h, double alpha) {
  return h.log_prob / std::pow(std::max<size_t>(h.ids.size() + h.finished, 1), alpha);
}

TEST(Decoding, LastLogitsAgreeWithTheTrainingForwardPass) {
  for (ModelKind kind : {ModelKind::kLm, ModelKind::kSeq2seq}) {
    TinyModel t(kind);
    const ModelConfig& c = t.model->config();
    Batch batch;
    const std::vector<int32_t> source = {7, 8, 9, 10, 2}, decoder = {1, 11, 12, 13};
    if (kind == ModelKind::kSeq2seq) batch.encoder.append(source.data(), 5);
    batch.decoder.append(decoder.data(), 4);
    // The loss only at the last position, without smoothing: -log p(target).
    const int target = 14;
    batch.targets = {c.special.pad, c.special.pad, c.special.pad, target};
    t.model->evaluate(batch, 0.0f);
    const LossSums sums = t.model->take_eval_sums();
    std::vector<float> logits(c.vocab);
    t.model->last_logits(batch, logits.data());
    double z = 0;
    for (float x : logits) z += std::exp(static_cast<double>(x));
    EXPECT_NEAR(sums.loss, std::log(z) - logits[target], 1e-4) << to_string(kind);
  }
}

TEST(Decoding, GreedyIsTheStepByStepArgmax) {
  TinyModel t(ModelKind::kSeq2seq);
  const ModelConfig& c = t.model->config();
  const std::vector<int32_t> source = {9, 8, 7, 12};
  DecodeOptions o;
  o.max_new_tokens = 6;
  const Hypothesis h = translate(*t.model, source, Layout{}, o);
  // Reference: argmax over the ids a decoder may emit, one step at a time.
  std::vector<int32_t> prefix = {c.special.bos}, expected;
  std::vector<float> logits(c.vocab);
  for (int step = 0; step < 6; ++step) {
    Batch b;
    std::vector<int32_t> src = source;
    src.push_back(c.special.eos);
    b.encoder.append(src.data(), static_cast<int>(src.size()));
    b.decoder.append(prefix.data(), static_cast<int>(prefix.size()));
    t.model->last_logits(b, logits.data());
    int best = -1;
    for (int id = 0; id < c.vocab; ++id) {
      if (id == c.special.pad || id == c.special.bos || id == c.special.mask || id == c.special.sep)
        continue;
      if (best < 0 || logits[id] > logits[best]) best = id;
    }
    if (best == c.special.eos) break;
    expected.push_back(best);
    prefix.push_back(best);
  }
  EXPECT_EQ(h.ids, expected);
}

// --min-new-tokens: a line that greedy ends at EOS early goes on with the
// next best tokens to the minimum, the same up to that EOS; the figures
// count the steps and the tokens handed out.
TEST(Decoding, MinNewTokensHoldsEosBackAndTheFiguresAddUp) {
  int ended_early = 0;
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    TinyModel t(ModelKind::kLm, seed);
    DecodeOptions o;
    o.max_new_tokens = 10;
    const std::vector<int32_t> prompt = {10, 11, 12};
    DecodeStats free_stats, held_stats;
    Hypothesis free, held;
    decode(
        *t.model, {prompt}, {1}, Layout{}, o, [&](size_t, Hypothesis h) { free = h; }, &free_stats);
    if (!free.finished || free.ids.size() >= 6) continue;
    ++ended_early;
    o.min_new_tokens = 6;
    decode(
        *t.model, {prompt}, {1}, Layout{}, o, [&](size_t, Hypothesis h) { held = h; }, &held_stats);
    ASSERT_GE(held.ids.size(), 6u) << seed;
    EXPECT_TRUE(std::equal(free.ids.begin(), free.ids.end(), held.ids.begin())) << seed;
    EXPECT_EQ(free_stats.tokens, static_cast<int64_t>(free.ids.size()) + 1) << seed;
    EXPECT_EQ(held_stats.tokens, static_cast<int64_t>(held.ids.size()) + held.finished) << seed;
    // One row a step after the prompt's (BOS and the prompt in the first).
    EXPECT_EQ(held_stats.steps, static_cast<int64_t>(held.ids.size()) + held.finished) << seed;
    EXPECT_EQ(held_stats.rows, held_stats.steps - 1 + 1 + static_cast<int64_t>(prompt.size()))
        << seed;
  }
  EXPECT_GT(ended_early, 0) << "no seed's greedy line ended early: nothing was tested";
}

TEST(Decoding, BeamScoresAtLeastGreedy) {
  for (uint64_t seed : {1, 2, 3, 4}) {
    TinyModel t(ModelKind::kSeq2seq, seed);
    DecodeOptions o;
    o.max_new_tokens = 8;
    const Hypothesis greedy = translate(*t.model, {10, 11, 12}, Layout{}, o);
    o.beam = 4;
    const Hypothesis beam = translate(*t.model, {10, 11, 12}, Layout{}, o);
    EXPECT_GE(score(beam, o.length_alpha), score(greedy, o.length_alpha) - 1e-9) << seed;
  }
}

TEST(Decoding, TopOneSamplingIsGreedyAndSamplingRepeatsWithItsSeed) {
  TinyModel t(ModelKind::kLm);
  DecodeOptions o;
  o.max_new_tokens = 10;
  uint64_t seed = 1;
  const Hypothesis greedy = one(*t.model, {7, 8, 9}, o, seed);
  o.top_k = 1;
  EXPECT_EQ(one(*t.model, {7, 8, 9}, o, seed).ids, greedy.ids);
  o.top_k = 8;
  o.temperature = 2.0f;
  seed = 11;
  const Hypothesis a = one(*t.model, {7, 8, 9}, o, seed);
  const Hypothesis b = one(*t.model, {7, 8, 9}, o, seed);
  EXPECT_EQ(a.ids, b.ids);
  bool differs = false;  // some seed samples something else than greedy
  for (seed = 1; seed <= 8 && !differs; ++seed) {
    differs = one(*t.model, {7, 8, 9}, o, seed).ids != greedy.ids;
  }
  EXPECT_TRUE(differs);
}

TEST(Decoding, AStepOverAWholePrefixGivesTheTrainingForwardsLogits) {
  TinyModel t(ModelKind::kLm);
  const ModelConfig& c = t.model->config();
  const std::vector<int32_t> prefix = {1, 11, 12, 13, 9};
  Batch batch;
  batch.decoder.append(prefix.data(), 5);
  batch.targets.assign(5, c.special.pad);
  std::vector<float> expected(c.vocab), logits(c.vocab);
  t.model->last_logits(batch, expected.data());
  // Every row of the prefix at once, kept in scattered cache rows, each
  // attending the rows up to its own.
  const std::vector<int32_t> kept = {9, 3, 17, 0, 5};
  DecodeStep step;
  step.self_starts = {0};
  for (int j = 0; j < 5; ++j) {
    step.tokens.push_back(prefix[j]);
    step.positions.push_back(j);
    step.cache_rows.push_back(kept[j]);
    for (int k = 0; k <= j; ++k) step.self_rows.push_back(kept[k]);
    step.self_starts.push_back(static_cast<int32_t>(step.self_rows.size()));
  }
  step.logit_rows = {4};
  t.model->decode_sources(PackedSequences{}, {});
  t.model->decode_step(step, logits.data());
  for (int v = 0; v < c.vocab; ++v) EXPECT_NEAR(logits[v], expected[v], 1e-4) << v;
}

// The same hypotheses, bit for bit: alone with the cache, together with
// and without it, and together with the batch in another order.
void expect_same_decoding(ModelKind kind, const DecodeOptions& options) {
  TinyModel t(kind, 5);
  const std::vector<std::vector<int32_t>> inputs = {
      {7, 8, 9}, {10}, {12, 11, 10, 9, 8, 7}, {15, 16}};
  const std::vector<uint64_t> seeds = {3, 4, 5, 6};
  std::vector<Hypothesis> alone;
  for (size_t i = 0; i < inputs.size(); ++i)
    alone.push_back(one(*t.model, inputs[i], options, seeds[i]));
  DecodeOptions recompute = options;
  recompute.cache = false;
  const std::vector<Hypothesis> together = decode(*t.model, inputs, seeds, Layout{}, options);
  const std::vector<Hypothesis> recomputed = decode(*t.model, inputs, seeds, Layout{}, recompute);
  const std::vector<Hypothesis> reversed =
      decode(*t.model, {inputs.rbegin(), inputs.rend()}, {seeds.rbegin(), seeds.rend()}, Layout{},
             options);
  // Through a model whose capacity holds the largest sentence and a few
  // rows more: the sentences take turns, each taking the rows another left.
  for (bool cache : {true, false}) {
    DecodeOptions o = options;
    o.cache = cache;
    DecodeNeeds largest, all;
    for (const std::vector<int32_t>& input : inputs) {
      const DecodeNeeds n = decode_needs(t.model->config(), input, Layout{}, o);
      all += n;
      largest.prefill_rows = std::max(largest.prefill_rows, n.prefill_rows);
      largest.beam_rows = std::max(largest.beam_rows, n.beam_rows);
      largest.cache_rows = std::max(largest.cache_rows, n.cache_rows);
      largest.source_rows = std::max(largest.source_rows, n.source_rows);
    }
    ModelCapacity small = decode_capacity(t.model->config(), largest, o);
    small.cache_rows += 3;
    ASSERT_GT(all.cache_rows, small.cache_rows) << "the sentences cannot all decode at once";
    TinyModel narrow(kind, 5, small);
    std::vector<Hypothesis> streamed(inputs.size());
    std::vector<size_t> order;  // of the sentences' finishing
    decode(*narrow.model, inputs, seeds, Layout{}, o, [&](size_t i, Hypothesis h) {
      order.push_back(i);
      streamed[i] = std::move(h);
    });
    std::vector<size_t> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, (std::vector<size_t>{0, 1, 2, 3})) << "each sentence is done once";
    for (size_t i = 0; i < inputs.size(); ++i) {
      EXPECT_EQ(streamed[i].ids, alone[i].ids)
          << to_string(kind) << " cache " << cache << " input " << i << " streamed";
      EXPECT_EQ(streamed[i].log_prob, alone[i].log_prob) << to_string(kind) << " input " << i;
    }
  }
  bool some_tokens = false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const size_t r = inputs.size() - 1 - i;
    for (const Hypothesis* h : {&together[i], &recomputed[i], &reversed[r]}) {
      EXPECT_EQ(h->ids, alone[i].ids) << to_string(kind) << " input " << i;
      EXPECT_EQ(h->log_prob, alone[i].log_prob) << to_string(kind) << " input " << i;
      EXPECT_EQ(h->finished, alone[i].finished) << to_string(kind) << " input " << i;
    }
    some_tokens |= !alone[i].ids.empty();
  }
  EXPECT_TRUE(some_tokens) << to_string(kind);
}

TEST(Decoding, CachedRecomputedAndBatchedAgreeGreedy) {
  DecodeOptions o;
  expect_same_decoding(ModelKind::kLm, o);
  expect_same_decoding(ModelKind::kSeq2seq, o);
}

TEST(Decoding, CachedRecomputedAndBatchedAgreeBeam) {
  DecodeOptions o;
  o.beam = 4;
  o.length_alpha = 0.6f;
  expect_same_decoding(ModelKind::kLm, o);
  o.beam = 5;
  expect_same_decoding(ModelKind::kSeq2seq, o);
}

TEST(Decoding, CachedRecomputedAndBatchedAgreeSampling) {
  DecodeOptions o;
  o.top_k = 6;
  o.temperature = 1.5f;
  expect_same_decoding(ModelKind::kLm, o);
}

TEST(Decoding, NeedsAddUpAndACapacityTooSmallIsRefused) {
  TinyModel t(ModelKind::kLm);
  const ModelConfig& c = t.model->config();
  DecodeOptions o;
  o.beam = 3;
  o.max_new_tokens = 4;
  const DecodeNeeds needs = decode_needs(c, {7, 8}, Layout{}, o);
  EXPECT_EQ(needs.prefill_rows, 3);  // BOS and the prompt
  EXPECT_EQ(needs.beam_rows, 3);
  EXPECT_EQ(needs.cache_rows, 3 + 3 * 3);  // the prefix, then 3 hypotheses for 3 more steps
  o.cache = false;
  EXPECT_EQ(decode_needs(c, {7, 8}, Layout{}, o).cache_rows, 3 * (3 + 3));
  ModelCapacity small = decode_capacity(c, needs, DecodeOptions{});
  small.cache_rows = 4;
  Model model(*t.ops, c, small);
  model.init_parameters(1);
  o.cache = true;
  EXPECT_THROW(decode(model, {{7, 8}}, {1}, Layout{}, o), std::runtime_error);
}

}  // namespace
}  // namespace mpiformer
