// Length buckets, token-budget batch plans and MLM masking: the pure parts of
// the shard loader, tested without files.
#include "src/data/bucketing.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <stdexcept>
#include <vector>

#include "src/core/error.h"
#include "src/data/mlm_masking.h"

namespace mpiformer {
namespace {

// tensor2tensor's rule as its Python reads, in floating point.
std::vector<int> t2t_reference(int max_len) {
  std::vector<int> out;
  int x = 8;
  while (x < max_len) {
    out.push_back(x);
    x = std::max(x + 1, static_cast<int>(x * 1.1));
  }
  out.push_back(max_len);
  return out;
}

TEST(Buckets, DefaultBoundariesFollowTensor2tensor) {
  const std::vector<int> b = bucket_boundaries({}, 256);
  const std::vector<int> head = {8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 22, 24, 26};
  ASSERT_GT(b.size(), head.size());
  EXPECT_EQ(std::vector<int>(b.begin(), b.begin() + head.size()), head);
  EXPECT_EQ(b.back(), 256);
  for (size_t i = 1; i < b.size(); ++i) {
    EXPECT_LT(b[i - 1], b[i]);
    if (i + 1 < b.size()) {
      EXPECT_EQ(b[i], std::max(b[i - 1] + 1, b[i - 1] * 11 / 10));
    }
  }
  for (int max_len : {1, 5, 8, 9, 64, 100, 256, 512, 1000, 4096}) {
    EXPECT_EQ(bucket_boundaries({}, max_len), t2t_reference(max_len)) << max_len;
  }
  EXPECT_EQ(bucket_boundaries({}, 8), std::vector<int>({8}));
  EXPECT_EQ(bucket_boundaries({}, 5), std::vector<int>({5}));
}

TEST(Buckets, CustomListIsValidatedAndReachesMaxLen) {
  EXPECT_EQ(bucket_boundaries({16, 32, 64}, 64), std::vector<int>({16, 32, 64}));
  EXPECT_EQ(bucket_boundaries({16, 32}, 100), std::vector<int>({16, 32, 100}));
  EXPECT_THROW(bucket_boundaries({16, 16, 32}, 64), UsageError);
  EXPECT_THROW(bucket_boundaries({32, 16}, 64), UsageError);
  EXPECT_THROW(bucket_boundaries({0, 16}, 64), UsageError);
  try {
    bucket_boundaries({16, 128}, 64);
    FAIL() << "a boundary above --max-len must be refused";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()), "--buckets: boundary 128 exceeds --max-len 64");
  }
}

TEST(Buckets, IndexIsTheFirstBoundaryAtOrAbove) {
  const std::vector<int> b = {8, 16, 32};
  EXPECT_EQ(bucket_index(b, 1), 0);
  EXPECT_EQ(bucket_index(b, 8), 0);
  EXPECT_EQ(bucket_index(b, 9), 1);
  EXPECT_EQ(bucket_index(b, 16), 1);
  EXPECT_EQ(bucket_index(b, 32), 2);
  EXPECT_EQ(bucket_index(b, 33), -1);
}

// A planner over `n` sequences with pseudo-random buckets.
struct PlannerFixture {
  std::vector<uint32_t> bucket_of;
  std::vector<int> cost = {8, 16, 32, 64};
  explicit PlannerFixture(int n) {
    KeyedRng rng(42);
    for (int i = 0; i < n; ++i) bucket_of.push_back(static_cast<uint32_t>(rng.below(cost.size())));
  }
};

// Every id exactly once, each batch within one bucket and its capacity.
void expect_partition(const BatchPlanner& planner, const EpochPlan& plan,
                      const std::vector<uint32_t>& bucket_of) {
  ASSERT_EQ(plan.batches.size(), planner.batches_per_epoch());
  std::vector<int> seen(bucket_of.size(), 0);
  for (const EpochPlan::Span& s : plan.batches) {
    ASSERT_GE(s.size, 1u);
    const uint32_t bucket = bucket_of[plan.order[s.begin]];
    EXPECT_LE(s.size, static_cast<uint32_t>(planner.capacity(bucket)));
    for (uint32_t k = 0; k < s.size; ++k) {
      const uint32_t id = plan.order[s.begin + k];
      EXPECT_EQ(bucket_of[id], bucket);
      ++seen[id];
    }
  }
  for (size_t id = 0; id < seen.size(); ++id) EXPECT_EQ(seen[id], 1) << "id " << id;
}

TEST(Planner, CapacityFollowsTokensAndSentences) {
  PlannerFixture f(1000);
  BatchPlanner by_tokens(f.bucket_of, f.cost, 256, 0);
  EXPECT_EQ(by_tokens.capacity(0), 32);
  EXPECT_EQ(by_tokens.capacity(3), 4);
  BatchPlanner capped(f.bucket_of, f.cost, 256, 10);
  EXPECT_EQ(capped.capacity(0), 10);
  EXPECT_EQ(capped.capacity(3), 4);
  uint64_t expected = 0;
  for (int b = 0; b < 4; ++b) {
    const auto members = std::count(f.bucket_of.begin(), f.bucket_of.end(), b);
    expected += (members + capped.capacity(b) - 1) / capped.capacity(b);
  }
  EXPECT_EQ(capped.batches_per_epoch(), expected);
  EXPECT_THROW(BatchPlanner(f.bucket_of, f.cost, 63, 0), std::invalid_argument);
  // An unused bucket too large for the budget is harmless.
  EXPECT_NO_THROW(BatchPlanner({0, 1, 0}, {8, 16, 1000}, 64, 0));
}

TEST(Planner, EveryEpochIsAPartitionDeterministicInSeedAndEpoch) {
  PlannerFixture f(3000);
  BatchPlanner planner(f.bucket_of, f.cost, 512, 0);
  const EpochPlan e0 = planner.shuffled(7, 0);
  const EpochPlan e1 = planner.shuffled(7, 1);
  expect_partition(planner, e0, f.bucket_of);
  expect_partition(planner, e1, f.bucket_of);
  expect_partition(planner, planner.in_order(), f.bucket_of);

  const EpochPlan again = planner.shuffled(7, 0);
  EXPECT_EQ(again.order, e0.order);
  ASSERT_EQ(again.batches.size(), e0.batches.size());
  for (size_t k = 0; k < e0.batches.size(); ++k)
    EXPECT_EQ(again.batches[k].begin, e0.batches[k].begin);
  EXPECT_NE(e1.order, e0.order) << "epochs must visit sequences in a different order";
  EXPECT_NE(planner.shuffled(8, 0).order, e0.order) << "the seed must change the order";
  // Not merely bucket-major: the batch list is shuffled across buckets.
  int bucket_changes = 0;
  for (size_t k = 1; k < e0.batches.size(); ++k) {
    bucket_changes += f.bucket_of[e0.order[e0.batches[k].begin]] !=
                      f.bucket_of[e0.order[e0.batches[k - 1].begin]];
  }
  EXPECT_GT(bucket_changes, static_cast<int>(e0.batches.size()) / 2);
}

TEST(Planner, SortWindowsGroupEqualLengthsWithoutChangingTheBatchCount) {
  // One bucket of lengths 1..8 (the first bucket of the default boundaries).
  const int n = 4000;
  KeyedRng rng(9);
  std::vector<uint32_t> bucket_of(n, 0);
  std::vector<uint64_t> length(n);
  for (uint64_t& l : length) l = 1 + rng.below(8);
  BatchPlanner plain(bucket_of, {8}, 256, 0);
  BatchPlanner sorted(bucket_of, {8}, 256, 0, length, 8);
  EXPECT_EQ(sorted.batches_per_epoch(), plain.batches_per_epoch());
  const auto efficiency = [&](const EpochPlan& plan) {
    double real = 0, padded = 0;
    for (const EpochPlan::Span& s : plan.batches) {
      uint64_t longest = 0;
      for (uint32_t k = 0; k < s.size; ++k) {
        real += length[plan.order[s.begin + k]];
        longest = std::max(longest, length[plan.order[s.begin + k]]);
      }
      padded += static_cast<double>(longest) * s.size;
    }
    return real / padded;
  };
  const EpochPlan e0 = sorted.shuffled(1, 0), e1 = sorted.shuffled(1, 1);
  expect_partition(sorted, e0, bucket_of);
  expect_partition(sorted, e1, bucket_of);
  EXPECT_LT(efficiency(plain.shuffled(1, 0)), 0.65);
  EXPECT_GT(efficiency(e0), 0.90);
  // Which sequences share a batch still changes between epochs.
  std::map<uint32_t, uint32_t> first_partner;
  for (const EpochPlan::Span& s : e0.batches) {
    for (uint32_t k = 1; k < s.size; ++k) first_partner[e0.order[s.begin + k]] = e0.order[s.begin];
  }
  int same = 0;
  for (const EpochPlan::Span& s : e1.batches) {
    for (uint32_t k = 1; k < s.size; ++k)
      same += first_partner[e1.order[s.begin + k]] == e1.order[s.begin];
  }
  EXPECT_LT(same, n / 20);
}

TEST(Planner, InOrderIsSortedByFirstIdAndIndependentOfAnySeed) {
  PlannerFixture f(500);
  BatchPlanner planner(f.bucket_of, f.cost, 256, 0);
  const EpochPlan plan = planner.in_order();
  for (size_t k = 1; k < plan.batches.size(); ++k) {
    EXPECT_LT(plan.order[plan.batches[k - 1].begin], plan.order[plan.batches[k].begin]);
  }
  for (const EpochPlan::Span& s : plan.batches) {
    EXPECT_TRUE(
        std::is_sorted(plan.order.begin() + s.begin, plan.order.begin() + s.begin + s.size));
  }
}

TEST(Planner, ShuffleIsUniformOverPermutations) {
  // Three sequences of one bucket, one per batch: the batch order is the
  // permutation. Each of the 6 should come up about equally often.
  BatchPlanner planner({0, 0, 0}, {10}, 10, 0);
  std::map<std::vector<uint32_t>, int> counts;
  const int trials = 12000;
  for (int e = 0; e < trials; ++e) {
    const EpochPlan plan = planner.shuffled(3, e);
    std::vector<uint32_t> perm;
    for (const EpochPlan::Span& s : plan.batches) perm.push_back(plan.order[s.begin]);
    ++counts[perm];
  }
  ASSERT_EQ(counts.size(), 6u);
  for (const auto& [perm, n] : counts) EXPECT_NEAR(n, trials / 6.0, 5 * std::sqrt(trials / 6.0));
}

// ---- MLM masking -----------------------------------------------------------

constexpr SpecialTokens kSp;

TEST(MlmMasking, RatesAndAtLeastOnePerSequence) {
  const int vocab = 1000;
  const MlmMasking rule{0.15f, vocab, kSp};
  int64_t real = 0, chosen = 0, masked = 0, replaced = 0, kept = 0;
  KeyedRng lengths(5);
  for (uint64_t s = 0; s < 4000; ++s) {
    const int n = 1 + static_cast<int>(lengths.below(60));
    std::vector<int32_t> original(n), tokens, targets(n);
    for (int i = 0; i < n; ++i) original[i] = 6 + static_cast<int32_t>(lengths.below(vocab - 6));
    original[0] = kSp.unk;  // stands for text: may be chosen
    tokens = original;
    KeyedRng rng(1000 + s);
    mask_sequence(rule, rng, tokens.data(), targets.data(), n);
    int here = 0;
    for (int i = 0; i < n; ++i) {
      ++real;
      if (targets[i] == kSp.pad) {
        EXPECT_EQ(tokens[i], original[i]);
        continue;
      }
      EXPECT_EQ(targets[i], original[i]);
      ++here;
      if (tokens[i] == kSp.mask) {
        ++masked;
      } else if (tokens[i] == original[i]) {
        ++kept;
      } else {
        EXPECT_GE(tokens[i], SpecialTokens::kCount);
        EXPECT_LT(tokens[i], vocab);
        ++replaced;
      }
    }
    EXPECT_GE(here, 1);
    chosen += here;
  }
  const double rate = static_cast<double>(chosen) / real;
  EXPECT_GT(rate, 0.15);  // at least one per sequence lifts it a little
  EXPECT_LT(rate, 0.18);
  EXPECT_NEAR(static_cast<double>(masked) / chosen, 0.8, 0.02);
  EXPECT_NEAR(static_cast<double>(replaced) / chosen, 0.1, 0.02);
  EXPECT_NEAR(static_cast<double>(kept) / chosen, 0.1, 0.02);
}

TEST(MlmMasking, StructuralTokensAreNeverChosenAndResultsAreDeterministic) {
  const MlmMasking rule{0.5f, 40, kSp};
  const std::vector<int32_t> original = {7, kSp.sep, 9, kSp.eos, kSp.bos, 11, 12, kSp.pad};
  for (uint64_t key = 0; key < 200; ++key) {
    std::vector<int32_t> a(original), b(original), ta(a.size()), tb(b.size());
    KeyedRng ra(key), rb(key);
    mask_sequence(rule, ra, a.data(), ta.data(), static_cast<int>(a.size()));
    mask_sequence(rule, rb, b.data(), tb.data(), static_cast<int>(b.size()));
    EXPECT_EQ(a, b);
    EXPECT_EQ(ta, tb);
    for (size_t i : {1, 3, 4, 7}) {
      EXPECT_EQ(ta[i], kSp.pad);
      EXPECT_EQ(a[i], original[i]);
    }
  }
  // Only structural tokens: nothing to choose.
  std::vector<int32_t> frame = {kSp.bos, kSp.sep, kSp.eos}, t(3);
  KeyedRng rng(1);
  mask_sequence(rule, rng, frame.data(), t.data(), 3);
  EXPECT_EQ(t, std::vector<int32_t>(3, kSp.pad));
}

TEST(MlmMasking, FallbackPickCoversEveryChoosablePosition) {
  // Probability near 0: the pick decides; it must land on each non-SEP
  // position and never on SEP.
  const MlmMasking rule{1e-9f, 40, kSp};
  std::set<int> picked;
  for (uint64_t key = 0; key < 500; ++key) {
    std::vector<int32_t> tokens = {6, 7, kSp.sep, 8, 9}, targets(5);
    KeyedRng rng(key);
    mask_sequence(rule, rng, tokens.data(), targets.data(), 5);
    int chosen = 0;
    for (int i = 0; i < 5; ++i) {
      if (targets[i] != kSp.pad) {
        picked.insert(i);
        ++chosen;
      }
    }
    EXPECT_EQ(chosen, 1);
  }
  EXPECT_EQ(picked, std::set<int>({0, 1, 3, 4}));
}

}  // namespace
}  // namespace mpiformer
