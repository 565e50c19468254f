// The GEMMs' timed search without a GPU (kernels/gemm_search.h): the digest
// that tells a suggestion's bits from the first one's, its device kernel
// (kernels/cuda/digest_kernels.cuh) run under emulation against the CPU's
// sum, and which trial wins, with and without the same bits required. Then
// cuDNN attention's plan search, which takes the same winner
// (kernels/attention_search.h): the plan it runs, and bench's report.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "kernels/attention_search.h"
#include "kernels/cuda/digest_kernels.cuh"

namespace mpiformer {
namespace {

namespace search = gemm_search;

std::vector<uint16_t> random_units(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint16_t> units(n);
  for (uint16_t& u : units) u = static_cast<uint16_t>(rng());
  return units;
}

uint64_t digest(const std::vector<uint16_t>& units, uint64_t first = 0) {
  return search::bits_digest(units.data(), units.size() * sizeof(uint16_t), first);
}

// ---- the digest ---------------------------------------------------------------

TEST(GemmSearchDigest, AnyChangedOrMovedUnitChangesIt) {
  const std::vector<uint16_t> units = random_units(4099, 1);
  const uint64_t d = digest(units);
  EXPECT_EQ(digest(units), d);
  for (size_t i : {size_t{0}, size_t{1}, size_t{2048}, size_t{4098}}) {
    for (int bit = 0; bit < 16; ++bit) {
      std::vector<uint16_t> flipped = units;
      flipped[i] ^= static_cast<uint16_t>(1u << bit);
      EXPECT_NE(digest(flipped), d) << "unit " << i << ", bit " << bit;
    }
  }
  std::vector<uint16_t> swapped = units;
  std::swap(swapped[5], swapped[6]);
  ASSERT_NE(swapped[5], swapped[6]);
  EXPECT_NE(digest(swapped), d) << "two units swapped";
  // The same bits in another output (numbered from kOutputStride) count differently.
  EXPECT_NE(digest(units, search::kOutputStride), d);
  // Zeros are not nothing: a longer run of zeros has another digest.
  EXPECT_NE(digest(std::vector<uint16_t>(10)), digest(std::vector<uint16_t>(11)));
}

TEST(GemmSearchDigest, FloatsAreDigestedAsTheirTwoHalves) {
  const std::vector<float> x = {1.5f, -2.25f, 3.0e-8f};
  std::vector<uint16_t> halves(2 * x.size());
  std::memcpy(halves.data(), x.data(), sizeof(float) * x.size());
  EXPECT_EQ(search::bits_digest(x.data(), sizeof(float) * x.size()), digest(halves));
  std::vector<float> y = x;
  y[2] = std::nextafter(y[2], 1.0f);  // one unit in the last place
  EXPECT_NE(search::bits_digest(y.data(), sizeof(float) * y.size()), digest(halves));
}

// The kernel as gemm.cu launches it, a block at a time on 256 std::threads,
// adds what the CPU sums: every unit once, whatever the grid, and into a
// total that already holds another output's digest.
TEST(GemmSearchDigest, TheKernelAddsTheCpusDigest) {
  for (size_t n : {size_t{1}, size_t{255}, size_t{257}, size_t{70001},
                   size_t{cuda::kDigestThreads} * cuda::kDigestMaxBlocks + 3}) {
    const std::vector<uint16_t> units = random_units(n, static_cast<uint32_t>(n));
    const uint64_t first = 7 * search::kOutputStride;
    unsigned long long total = 12345;
    const int blocks = cuda::digest_blocks(n);
    EXPECT_LE(blocks, cuda::kDigestMaxBlocks);
    emulated::launch(dim3(blocks), cuda::kDigestThreads, nullptr, 0,
                     [&] { cuda::bits_digest_kernel(units.data(), units.size(), first, &total); });
    EXPECT_EQ(total, 12345 + digest(units, first)) << n << " units";
  }
}

// ---- the winner -----------------------------------------------------------------

search::Trial trial(uint64_t digest, float ms) {
  return search::Trial{true, digest, ms};
}
search::Trial refused() {
  return search::Trial{};
}

TEST(GemmSearchWinner, TheFastestWithTheFirstsBitsWhenTheyMustMatch) {
  // The fastest (index 2) sums in another order: set aside where bits must match.
  const std::vector<search::Trial> trials = {trial(9, 1.0f), trial(9, 0.8f), trial(4, 0.5f),
                                             trial(9, 0.9f)};
  EXPECT_EQ(search::winner(trials, true), 1);
  EXPECT_EQ(search::winner(trials, false), 2);
  EXPECT_FALSE(search::other_bits(trials, 1));
  EXPECT_TRUE(search::other_bits(trials, 2));
}

TEST(GemmSearchWinner, TiesRefusalsAndUntimedTrials) {
  // A tie keeps the earlier, in cuBLASLt's order.
  EXPECT_EQ(search::winner({trial(1, 0.5f), trial(1, 0.5f)}, true), 0);
  // A refused suggestion never wins; an untimed one (ms < 0) neither.
  EXPECT_EQ(search::winner({trial(1, 0.5f), refused(), trial(1, -1.0f)}, true), 0);
  EXPECT_FALSE(search::other_bits({trial(1, 0.5f), refused()}, 1));
  // The first refused: no bits to keep, so no winner where they must match;
  // otherwise the fastest of the rest.
  EXPECT_EQ(search::winner({refused(), trial(1, 0.7f), trial(2, 0.6f)}, true), -1);
  EXPECT_EQ(search::winner({refused(), trial(1, 0.7f), trial(2, 0.6f)}, false), 2);
  EXPECT_EQ(search::winner({}, true), -1);
  EXPECT_EQ(search::winner({}, false), -1);
  EXPECT_EQ(search::winner({refused(), refused()}, false), -1);
}

// ---- cuDNN attention's plan search ---------------------------------------

TEST(AttentionPlanSearch, TheWinnersPlanOrTheFirstWhereNoneWon) {
  // The plans that ran, the heuristic's (plan 1: plan 0 did not build) first.
  const std::vector<int64_t> plans = {1, 2, 5};
  const std::vector<search::Trial> trials = {trial(7, 1.0f), trial(3, 0.6f), trial(7, 0.8f)};
  EXPECT_EQ(attention_search::chosen_plan(plans, search::winner(trials, true)), 5)
      << "plan 2 gives other bits: set aside";
  EXPECT_EQ(attention_search::chosen_plan(plans, search::winner(trials, false)), 2);
  EXPECT_EQ(attention_search::chosen_plan(plans, -1), 1) << "none won: the heuristic's";
}

TEST(AttentionPlanSearch, TheReportCountsGraphsPlansBitsAndTimes) {
  attention_search::Tally tally;
  EXPECT_EQ(tally.describe(), "") << "nothing searched: nothing said";
  // Milliseconds over kTimedRuns (3) runs: reported a run.
  const std::vector<search::Trial> first = {trial(7, 3.0f), trial(3, 1.5f), trial(7, 2.25f)};
  tally.add(first, search::winner(first, true), true, 0);
  const std::vector<search::Trial> second = {trial(1, 6.0f), trial(1, 7.5f)};
  tally.add(second, search::winner(second, true), true, 1);
  tally.add({trial(4, 0.3f)}, 0, true, 0);  // one plan: nothing to time
  EXPECT_EQ(tally.graphs_timed, 2);
  EXPECT_EQ(tally.plans, 5);
  EXPECT_EQ(tally.other_bits, 1);
  EXPECT_EQ(tally.first_kept, 1);
  EXPECT_DOUBLE_EQ(tally.first_ms, 3.0);
  EXPECT_DOUBLE_EQ(tally.winner_ms, 2.75);
  EXPECT_EQ(tally.searches(), 3);
  EXPECT_EQ(tally.describe(),
            "timed 2 cuDNN attention graphs of 5 plans in all, keeping the bits of each one's "
            "first plan (1 set aside for other bits); the first was fastest in 1; the winners "
            "2.750 ms a run against the first plans' 3.000 (0.917); 1 cuDNN attention graph had "
            "one plan; 1 plan not built or over the reserved workspace");
  attention_search::Tally any;
  any.add(first, search::winner(first, false), false, 0);
  EXPECT_EQ(any.other_bits, 0) << "bits need not match: none set aside";
  EXPECT_EQ(any.describe(),
            "timed 1 cuDNN attention graph of 3 plans in all, any bits; the first was fastest in "
            "0; the winners 0.500 ms a run against the first plans' 1.000 (0.500)");
}

TEST(AttentionPlanSearch, FailedSearchesLaterRejectionsAndTheCapAreTold) {
  attention_search::Tally tally;
  // The heuristic's plan did not run, or its timing failed: nothing compared.
  tally.add({refused(), trial(2, 0.5f)}, -1, true, 0);
  tally.add({trial(2, -1.0f), trial(2, 0.5f)},
            search::winner({trial(2, -1.0f), trial(2, 0.5f)}, true), true, 2);
  EXPECT_EQ(tally.failed, 2);
  EXPECT_EQ(tally.graphs_timed, 0);
  EXPECT_DOUBLE_EQ(tally.first_ms, 0.0) << "an untimed first plan adds no time";
  tally.rejected = 1;
  tally.past_most = 3;
  EXPECT_EQ(tally.describe(),
            "2 searches failed (the heuristic's plan kept); 2 plans not built or over the "
            "reserved workspace; 1 winner gave other bits on a later batch (the heuristic's "
            "plan back); 3 graphs past the most searches");
}

TEST(AttentionPlanSearch, ChecksOnOtherLengthsAndEachLongerBatch) {
  using attention_search::BatchLengths;
  attention_search::BitsChecks checks;
  EXPECT_FALSE(checks.due({5, 900})) << "nothing searched: nothing to check";
  checks.searched({1, 512}, true);
  EXPECT_FALSE(checks.due({1, 512})) << "the search's own lengths";
  EXPECT_TRUE(checks.due({2, 300})) << "the first batch of other lengths";
  checks.passed({2, 300});
  EXPECT_FALSE(checks.due({3, 400})) << "other lengths, checked once, within the longest seen";
  EXPECT_TRUE(checks.due({1, 700})) << "longer than any before (a hash collision as well)";
  checks.passed({1, 700});
  EXPECT_FALSE(checks.due({4, 700}));
  EXPECT_TRUE(checks.due({4, 701}));
  checks.stop();
  EXPECT_FALSE(checks.due({4, 2000})) << "the heuristic's plan is back: nothing to check";
  checks.searched({1, 512}, false);
  EXPECT_FALSE(checks.due({2, 2000})) << "any bits: never checked";
  // A check passed on a longer batch with the search's hash leaves the
  // other lengths unchecked.
  checks.searched({1, 512}, true);
  checks.passed({1, 600});
  EXPECT_TRUE(checks.due({2, 100}));
}

TEST(AttentionPlanSearch, AFailedSearchKeepsTheHeuristicsPlan) {
  EXPECT_TRUE(attention_search::search_failed({}, -1));
  EXPECT_TRUE(attention_search::search_failed({refused(), trial(2, 0.5f)}, 1))
      << "the heuristic's plan did not run";
  EXPECT_TRUE(attention_search::search_failed({trial(2, -1.0f), trial(2, 0.5f)}, 1))
      << "its timing failed: a winner among the others is not taken";
  EXPECT_FALSE(attention_search::search_failed({trial(2, 1.0f), trial(2, 0.5f)}, 1));
}

}  // namespace
}  // namespace mpiformer
