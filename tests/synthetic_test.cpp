// Synthetic tasks: deterministic in (seed, stream, index), within the token
// budget, and laid out per model kind as src/data/synthetic.h describes.
#include "src/data/synthetic.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>
#include <vector>

namespace mpiformer {
namespace {

constexpr SpecialTokens kSp;

ModelConfig model_of(ModelKind kind, int max_len = 32, int vocab = 40) {
  ModelConfig m;
  m.kind = kind;
  m.max_len = max_len;
  m.vocab = vocab;
  return m;
}

SyntheticSource source_of(ModelKind kind, SyntheticTask task, int max_tokens = 512,
                          int max_sentences = 0, int min_len = 1, uint64_t seed = 7) {
  return SyntheticSource(task, model_of(kind), max_tokens, max_sentences, min_len, 0.15f, seed);
}

std::vector<int32_t> sequence(const PackedSequences& p, int b) {
  return {p.tokens.begin() + p.offsets[b], p.tokens.begin() + p.offsets[b + 1]};
}

std::vector<int32_t> targets_of(const Batch& batch, int b) {
  const auto& o = batch.decoder.offsets;
  return {batch.targets.begin() + o[b], batch.targets.begin() + o[b + 1]};
}

bool same_batch(const Batch& a, const Batch& b) {
  return a.encoder.offsets == b.encoder.offsets && a.encoder.tokens == b.encoder.tokens &&
         a.decoder.offsets == b.decoder.offsets && a.decoder.tokens == b.decoder.tokens &&
         a.decoder.positions == b.decoder.positions && a.targets == b.targets;
}

bool is_symbol(int id, int vocab) {
  return id >= SpecialTokens::kCount && id < vocab;
}

std::vector<int32_t> expected_y(SyntheticTask task, std::vector<int32_t> x) {
  if (task == SyntheticTask::kReverse) std::reverse(x.begin(), x.end());
  if (task == SyntheticTask::kSort) std::sort(x.begin(), x.end());
  return x;
}

const ModelKind kKinds[] = {ModelKind::kLm, ModelKind::kSeq2seq, ModelKind::kMlm};
const SyntheticTask kTasks[] = {SyntheticTask::kReverse, SyntheticTask::kCopy,
                                SyntheticTask::kSort};

TEST(Synthetic, SameKeySameBatchDifferentKeyDifferentBatch) {
  for (ModelKind kind : kKinds) {
    SyntheticSource a = source_of(kind, SyntheticTask::kReverse);
    SyntheticSource a_again = source_of(kind, SyntheticTask::kReverse);
    SyntheticSource other_seed = source_of(kind, SyntheticTask::kReverse, 512, 0, 1, /*seed=*/8);
    Batch first, second;
    a.make_batch(SyntheticSource::kTrain, 5, &first);
    a.make_batch(SyntheticSource::kTrain, 9, &second);  // another batch in between
    a_again.make_batch(SyntheticSource::kTrain, 5, &second);
    EXPECT_TRUE(same_batch(first, second));

    a.make_batch(SyntheticSource::kTrain, 6, &second);
    EXPECT_FALSE(same_batch(first, second));
    a.make_batch(SyntheticSource::kEval, 5, &second);
    EXPECT_FALSE(same_batch(first, second)) << "train and eval streams must differ";
    other_seed.make_batch(SyntheticSource::kTrain, 5, &second);
    EXPECT_FALSE(same_batch(first, second));
  }
}

TEST(Synthetic, RespectsTokenAndSentenceBudgets) {
  for (ModelKind kind : kKinds) {
    for (int max_tokens : {70, 200, 1000}) {
      for (int max_sentences : {0, 3}) {
        SyntheticSource src = source_of(kind, SyntheticTask::kCopy, max_tokens, max_sentences);
        int64_t sequences = 0;
        Batch batch;
        for (uint64_t i = 0; i < 50; ++i) {
          src.make_batch(SyntheticSource::kTrain, i, &batch);
          ASSERT_GE(batch.decoder.batch(), 1);
          EXPECT_LE(batch.padded_tokens(), max_tokens);
          if (max_sentences > 0) {
            EXPECT_LE(batch.decoder.batch(), max_sentences);
          }
          EXPECT_EQ(static_cast<int>(batch.targets.size()), batch.decoder.total());
          EXPECT_EQ(batch.encoder.batch(), kind == ModelKind::kSeq2seq ? batch.decoder.batch() : 0);
          sequences += batch.decoder.batch();
        }
        // A generous budget holds several examples per batch on average.
        if (max_tokens >= 1000 && max_sentences == 0) {
          EXPECT_GT(sequences, 50 * 5);
        }
      }
    }
  }
}

TEST(Synthetic, LengthsAndIdsStayInRange) {
  const int max_len = 20, vocab = 30, min_len = 3;
  for (ModelKind kind : kKinds) {
    SyntheticSource src(SyntheticTask::kSort, model_of(kind, max_len, vocab), 400, 0, min_len,
                        0.15f, 1);
    const int max_x = kind == ModelKind::kSeq2seq ? max_len - 1 : (max_len - 1) / 2;
    EXPECT_EQ(src.max_example_len(), max_x);
    int longest_seen = 0;
    Batch batch;
    for (uint64_t i = 0; i < 100; ++i) {
      src.make_batch(SyntheticSource::kTrain, i, &batch);
      for (int b = 0; b < batch.decoder.batch(); ++b) {
        const int n = kind == ModelKind::kSeq2seq ? batch.encoder.length(b)
                                                  : (batch.decoder.length(b) - 1) / 2;
        EXPECT_GE(n, min_len);
        EXPECT_LE(n, max_x);
        EXPECT_LE(batch.decoder.length(b), max_len);
        longest_seen = std::max(longest_seen, n);
      }
      for (int32_t t : batch.encoder.tokens) EXPECT_TRUE(is_symbol(t, vocab)) << t;
      for (int32_t t : batch.decoder.tokens) EXPECT_TRUE(t >= 0 && t < vocab) << t;
      for (int32_t t : batch.targets)
        EXPECT_TRUE(t == kSp.pad || t == kSp.eos || is_symbol(t, vocab));
    }
    EXPECT_EQ(longest_seen, max_x) << "the longest length is drawn too";
  }
}

TEST(Synthetic, Seq2seqLayout) {
  for (SyntheticTask task : kTasks) {
    SyntheticSource src = source_of(ModelKind::kSeq2seq, task);
    Batch batch;
    src.make_batch(SyntheticSource::kTrain, 3, &batch);
    ASSERT_GT(batch.decoder.batch(), 1);
    for (int b = 0; b < batch.decoder.batch(); ++b) {
      const std::vector<int32_t> x = sequence(batch.encoder, b);
      const std::vector<int32_t> y = expected_y(task, x);
      std::vector<int32_t> input{kSp.bos}, target = y;
      input.insert(input.end(), y.begin(), y.end());
      target.push_back(kSp.eos);
      EXPECT_EQ(sequence(batch.decoder, b), input);
      EXPECT_EQ(targets_of(batch, b), target);
      // Spelled out once more against the batch itself, not the helper.
      const std::vector<int32_t> decoded = sequence(batch.decoder, b);
      if (task == SyntheticTask::kReverse) {
        EXPECT_EQ(decoded[1], x.back());
        EXPECT_EQ(decoded.back(), x.front());
      }
      if (task == SyntheticTask::kSort) {
        EXPECT_TRUE(std::is_sorted(decoded.begin() + 1, decoded.end()));
      }
    }
    EXPECT_EQ(batch.target_tokens(kSp.pad), batch.decoder.total());
  }
}

TEST(Synthetic, LmLayoutHasLossOnlyOnTheAnswer) {
  for (SyntheticTask task : kTasks) {
    SyntheticSource src = source_of(ModelKind::kLm, task);
    Batch batch;
    src.make_batch(SyntheticSource::kTrain, 11, &batch);
    int64_t answer_tokens = 0;
    for (int b = 0; b < batch.decoder.batch(); ++b) {
      const std::vector<int32_t> input = sequence(batch.decoder, b);
      const int n = (static_cast<int>(input.size()) - 1) / 2;
      ASSERT_EQ(static_cast<int>(input.size()), 2 * n + 1);
      const std::vector<int32_t> x(input.begin(), input.begin() + n);
      ASSERT_EQ(input[n], kSp.sep);
      const std::vector<int32_t> y(input.begin() + n + 1, input.end());
      EXPECT_EQ(y, expected_y(task, x));

      // Position i predicts token i+1 of x SEP y EOS; the x part is unpredictable.
      std::vector<int32_t> target(n, kSp.pad);
      target.insert(target.end(), y.begin(), y.end());
      target.push_back(kSp.eos);
      EXPECT_EQ(targets_of(batch, b), target);
      answer_tokens += n + 1;
    }
    EXPECT_EQ(batch.target_tokens(kSp.pad), answer_tokens);
  }
}

TEST(Synthetic, MlmMasksAboutFifteenPercentAndOnlyChosenCarryTargets) {
  const int vocab = 40;
  SyntheticSource src = source_of(ModelKind::kMlm, SyntheticTask::kReverse, 1024);
  int64_t real = 0, chosen = 0, masked = 0, replaced = 0, kept = 0;
  Batch batch;
  for (uint64_t i = 0; i < 200; ++i) {
    src.make_batch(SyntheticSource::kTrain, i, &batch);
    for (int b = 0; b < batch.decoder.batch(); ++b) {
      const std::vector<int32_t> input = sequence(batch.decoder, b);
      const std::vector<int32_t> target = targets_of(batch, b);
      const int n = (static_cast<int>(input.size()) - 1) / 2;
      ASSERT_EQ(input[n], kSp.sep);
      EXPECT_EQ(target[n], kSp.pad) << "SEP is never chosen";
      // The original sequence: the target where chosen, the input elsewhere.
      std::vector<int32_t> original(input.size());
      int chosen_here = 0;
      for (size_t t = 0; t < input.size(); ++t) {
        const bool is_chosen = target[t] != kSp.pad;
        original[t] = is_chosen ? target[t] : input[t];
        if (t == static_cast<size_t>(n)) continue;
        EXPECT_TRUE(is_symbol(original[t], vocab));
        ++real;
        if (!is_chosen) {
          EXPECT_NE(input[t], kSp.mask);
          continue;
        }
        ++chosen_here;
        if (input[t] == kSp.mask) {
          ++masked;
        } else if (input[t] == target[t]) {
          ++kept;
        } else {
          EXPECT_TRUE(is_symbol(input[t], vocab));
          ++replaced;
        }
      }
      EXPECT_GE(chosen_here, 1);
      chosen += chosen_here;
      const std::vector<int32_t> x(original.begin(), original.begin() + n);
      const std::vector<int32_t> y(original.begin() + n + 1, original.end());
      EXPECT_EQ(y, expected_y(SyntheticTask::kReverse, x));
    }
  }
  ASSERT_GT(real, 10000);
  // "At least one per sequence" lifts the rate a little above 15% for short ones.
  const double rate = static_cast<double>(chosen) / real;
  EXPECT_GT(rate, 0.14);
  EXPECT_LT(rate, 0.19);
  // 80 / 10 / 10, a random symbol equal to the original counting as kept.
  EXPECT_NEAR(static_cast<double>(masked) / chosen, 0.8, 0.03);
  EXPECT_NEAR(static_cast<double>(replaced) / chosen, 0.1 * (1.0 - 1.0 / (vocab - 6)), 0.03);
  EXPECT_NEAR(static_cast<double>(kept) / chosen, 0.1 + 0.1 / (vocab - 6), 0.03);
}

TEST(Synthetic, RefusesConfigurationsWhereNothingFits) {
  // lm at max-len 9: x SEP y fits |x| <= 4.
  EXPECT_THROW(
      SyntheticSource(SyntheticTask::kCopy, model_of(ModelKind::kLm, 9), 512, 0, 5, 0.15f, 1),
      std::invalid_argument);
  EXPECT_NO_THROW(
      SyntheticSource(SyntheticTask::kCopy, model_of(ModelKind::kLm, 9), 512, 0, 4, 0.15f, 1));
  // seq2seq at max-len 32: one longest example pads to 31 + 32 tokens.
  EXPECT_THROW(
      SyntheticSource(SyntheticTask::kCopy, model_of(ModelKind::kSeq2seq, 32), 62, 0, 1, 0.15f, 1),
      std::invalid_argument);
  EXPECT_NO_THROW(
      SyntheticSource(SyntheticTask::kCopy, model_of(ModelKind::kSeq2seq, 32), 63, 0, 1, 0.15f, 1));
  try {
    SyntheticSource(SyntheticTask::kCopy, model_of(ModelKind::kSeq2seq, 32), 62, 0, 1, 0.15f, 1);
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()).rfind("--max-tokens: ", 0), 0u) << e.what();
  }
}

TEST(Synthetic, OneExampleWhenOnlyOneFits) {
  // The budget holds exactly one longest example; shorter ones may pair up.
  SyntheticSource src = source_of(ModelKind::kSeq2seq, SyntheticTask::kReverse, 63);
  Batch batch;
  for (uint64_t i = 0; i < 20; ++i) {
    src.make_batch(SyntheticSource::kTrain, i, &batch);
    EXPECT_GE(batch.decoder.batch(), 1);
    EXPECT_LE(batch.padded_tokens(), 63);
  }
}

}  // namespace
}  // namespace mpiformer
