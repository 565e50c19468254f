// Label-smoothed cross entropy (docs/DESIGN.md section 4) through the CPU op.
// Expected values are worked out by hand in the comments (and checked with a
// calculator), never by calling the code under test.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "kernels/backend.h"
#include "kernels/ops.h"
#include "src/scoring/loss_figures.h"
#include "tests/backend_buffer.h"

namespace mpiformer {
namespace {

class LossTest : public ::testing::Test {
 protected:
  // Runs the op on host rows; logits come back as dlogits when compute_grad.
  // logits: (N, V) row-major, targets: (N)
  LossSums run(std::vector<float>& logits, const std::vector<int32_t>& targets, int V,
               float smoothing, int pad_id, float grad_scale, bool compute_grad) {
    Buffer<float> x(*ops_, logits);
    Buffer<int32_t> t(*ops_, targets);
    Buffer<LossSums> sums(*ops_, std::vector<LossSums>(1));
    ops_->cross_entropy(Act::f32(x.get()), t.get(), static_cast<int>(targets.size()), V, smoothing,
                        pad_id, grad_scale, compute_grad, sums.get());
    logits = x.read();
    return sums.read()[0];
  }

  std::unique_ptr<Ops> ops_ = make_cpu_ops(1);
};

constexpr int kPad = 0;

// (a) No smoothing: loss = logsumexp(x) - x_target.
TEST_F(LossTest, NoSmoothingIsLogSumExpMinusTargetLogit) {
  // V=3, x = {1, 2, 3}, target 2:
  //   e^1 + e^2 + e^3 = 2.718282 + 7.389056 + 20.085537 = 30.192875
  //   ln(30.192875) = 3.407606;  loss = 3.407606 - 3 = 0.40760596444
  std::vector<float> x = {1.0f, 2.0f, 3.0f};
  const LossSums s = run(x, {2}, 3, 0.0f, kPad, 1.0f, false);
  EXPECT_NEAR(s.loss, 0.40760596444438, 1e-6);
  EXPECT_NEAR(s.nll, 0.40760596444438, 1e-6);  // without smoothing, the loss is the nll
  EXPECT_EQ(s.tokens, 1);
  EXPECT_EQ(s.correct, 1);
  // Without compute_grad the logits are left alone.
  EXPECT_EQ(x, (std::vector<float>{1.0f, 2.0f, 3.0f}));
}

// (b) Smoothing 0.1 over V=5.
TEST_F(LossTest, SmoothedLossMatchesFormula) {
  // x = {0.5, -1, 2, 0, 1.5}, target 3, e = 0.1, q = 0.9 on 3 and 0.025 elsewhere.
  //   sum e^x = 1.648721 + 0.367879 + 7.389056 + 1 + 4.481689 = 14.887346
  //   lse = ln(14.887346) = 2.700512
  //   -sum q_j log p_j = lse - 0.9 * x_3 - 0.025 * (0.5 - 1 + 2 + 1.5)
  //                    = 2.700512 - 0 - 0.075 = 2.625512
  //   constant = -(0.9 ln 0.9 + 0.1 ln 0.025) = -(-0.094824 - 0.368888) = 0.463712
  //   loss = 2.625512 - 0.463712 = 2.161799172892
  const std::vector<float> logits = {0.5f, -1.0f, 2.0f, 0.0f, 1.5f};
  std::vector<float> x = logits;
  const LossSums s = run(x, {3}, 5, 0.1f, kPad, 1.0f, false);
  EXPECT_NEAR(s.loss, 2.161799172892006, 1e-5);
  // The true nll ignores the smoothing: lse - x_3 = 2.700512 - 0.
  EXPECT_NEAR(s.nll, 2.7005116, 1e-5);
  EXPECT_EQ(s.tokens, 1);
  EXPECT_EQ(s.correct, 0);  // argmax is 2

  // The fused gradient pass reports the same loss.
  x = logits;
  const LossSums g = run(x, {3}, 5, 0.1f, kPad, 1.0f, true);
  EXPECT_NEAR(g.loss, 2.161799172892006, 1e-5);
  EXPECT_NEAR(g.nll, 2.7005116, 1e-5);
  EXPECT_NEAR(label_smoothed_loss_reference(logits.data(), 5, 3, 0.0f), 2.7005116, 1e-6);

  EXPECT_NEAR(label_smoothed_loss_reference(logits.data(), 5, 3, 0.1f), 2.161799172892006,
              1e-7);  // e is the float 0.1
}

TEST(LabelSmoothingConstant, HandValues) {
  // e = 0.1, V = 5: -(0.9 ln 0.9 + 0.1 ln(0.1 / 4)) = 0.094824464 + 0.368887945
  EXPECT_NEAR(label_smoothing_constant(0.1f, 5), 0.4637124095034373, 1e-7);
  // e = 0.1, V = 3: -(0.9 ln 0.9 + 0.1 ln 0.05) = 0.094824464 + 0.299573227
  EXPECT_NEAR(label_smoothing_constant(0.1f, 3), 0.3943976914474427, 1e-7);
  // e = 0: a one-hot target has zero entropy (0 ln 0 taken as 0).
  EXPECT_EQ(label_smoothing_constant(0.0f, 7), 0.0);
}

// (c) Padding rows count for nothing.
TEST_F(LossTest, PadRowsContributeNothing) {
  // V=4, e=0, rows 0 and 2 real, row 1 pad (target 0 == pad id).
  //   row 0: x = {0.2, -0.3, 1.1, 0.4}, t=2
  //     sum e^x = 1.221403 + 0.740818 + 3.004166 + 1.491825 = 6.458212
  //     lse = 1.865352, loss = 1.865352 - 1.1 = 0.765352
  //   row 2: x = {-0.5, 0.8, 0.1, 0}, t=1
  //     sum e^x = 0.606531 + 2.225541 + 1.105171 + 1 = 4.937243
  //     lse = 1.596807, loss = 1.596807 - 0.8 = 0.796807
  //   total = 1.5621594311527
  // The pad row's argmax (0) equals its target: it must not count as correct.
  std::vector<float> x = {0.2f,  -0.3f, 1.1f, 0.4f,  //
                          3.0f,  -2.0f, 0.5f, 1.0f,  //
                          -0.5f, 0.8f,  0.1f, 0.0f};
  const LossSums s = run(x, {2, kPad, 1}, 4, 0.0f, kPad, 1.0f, true);
  EXPECT_NEAR(s.loss, 1.5621594311527442, 1e-5);
  EXPECT_NEAR(s.nll, 1.5621594311527442, 1e-5);
  EXPECT_EQ(s.tokens, 2);
  EXPECT_EQ(s.correct, 2);
  for (int j = 0; j < 4; ++j) EXPECT_EQ(x[4 + j], 0.0f) << "pad row gradient, column " << j;
  // Real rows: p - onehot, e.g. row 0 column 2: 3.004166 / 6.458212 - 1 = -0.534833
  EXPECT_NEAR(x[2], 3.004166024 / 6.458211700 - 1.0, 1e-6);

  // All rows pad: nothing at all.
  std::vector<float> y = {1.0f, 2.0f, 3.0f, 4.0f};
  const LossSums none = run(y, {kPad}, 4, 0.1f, kPad, 1.0f, true);
  EXPECT_EQ(none.loss, 0.0);
  EXPECT_EQ(none.nll, 0.0);
  EXPECT_EQ(none.tokens, 0);
  EXPECT_EQ(none.correct, 0);
  EXPECT_EQ(y, (std::vector<float>{0.0f, 0.0f, 0.0f, 0.0f}));
}

// (d) The constant makes a perfect prediction score 0, and the loss is a KL
// divergence, so never negative.
TEST_F(LossTest, PerfectPredictionScoresZero) {
  // e = 0.1, V = 5, target 1: q = {0.025, 0.9, 0.025, 0.025, 0.025}.
  // With x = ln q, softmax(x) = q (q sums to 1), so -sum q ln p = H(q) and
  // loss = H(q) - constant = 0.   ln 0.025 = -3.688879, ln 0.9 = -0.105361
  std::vector<float> x = {-3.6888794541f, -0.1053605157f, -3.6888794541f, -3.6888794541f,
                          -3.6888794541f};
  const LossSums s = run(x, {1}, 5, 0.1f, kPad, 1.0f, true);
  EXPECT_NEAR(s.loss, 0.0, 2e-6);
  EXPECT_EQ(s.correct, 1);
  for (float g : x) EXPECT_NEAR(g, 0.0f, 1e-6f);  // p == q: nothing to learn

  // e = 0 and a margin of 100: loss = ln(1 + 4 e^-100) ~ 1.5e-43.
  std::vector<float> y = {0.0f, 100.0f, 0.0f, 0.0f, 0.0f};
  const LossSums t = run(y, {1}, 5, 0.0f, kPad, 1.0f, false);
  EXPECT_NEAR(t.loss, 0.0, 1e-7);
}

TEST_F(LossTest, NeverNegativeForRandomLogits) {
  std::mt19937 gen(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  const int V = 17;
  for (float e : {0.0f, 0.1f, 0.3f}) {
    for (int row = 0; row < 50; ++row) {
      std::vector<float> x(V);
      for (float& v : x) v = normal(gen);
      const int target = 1 + row % (V - 1);
      const LossSums s = run(x, {target}, V, e, kPad, 1.0f, false);
      EXPECT_GE(s.loss, -1e-6) << "e=" << e << " row " << row;
    }
  }
}

// (e) correct counts rows whose argmax is the target, pad rows excluded.
TEST_F(LossTest, CorrectCountsArgmax) {
  std::vector<float> x = {0.0f, 2.0f, 1.0f, -1.0f,  // t=1, argmax 1: correct
                          0.0f, 0.5f, 3.0f, 1.0f,   // t=3, argmax 2: wrong
                          0.1f, 0.5f, 0.2f, 0.9f,   // t=3, argmax 3: correct
                          0.0f, 1.0f, 0.0f, -1.0f,  // t=2, argmax 1: wrong
                          5.0f, 0.0f, 0.0f, 0.0f};  // pad, argmax 0 == pad id: ignored
  const LossSums s = run(x, {1, 3, 3, 2, kPad}, 4, 0.1f, kPad, 1.0f, false);
  EXPECT_EQ(s.tokens, 4);
  EXPECT_EQ(s.correct, 2);
}

// (f) dlogits = (softmax - q) * grad_scale.
TEST_F(LossTest, GradientIsScaledSoftmaxMinusTarget) {
  // x = {1, 2, 3}, t = 2, e = 0.1 over V = 3: q = {0.05, 0.05, 0.9}
  //   p = e^x / 30.192875 = {0.090031, 0.244728, 0.665241}
  //   grad_scale 0.5: (p - q) / 2 = {0.020015, 0.097364, -0.117380}
  //   loss = lse - 0.9 * 3 - 0.05 * (1 + 2) - constant(0.1, 3)
  //        = 3.407606 - 2.7 - 0.15 - 0.394398 = 0.163208273
  std::vector<float> x = {1.0f, 2.0f, 3.0f};
  const LossSums s = run(x, {2}, 3, 0.1f, kPad, 0.5f, true);
  EXPECT_NEAR(s.loss, 0.1632082729969372, 1e-5);  // the scale touches gradients only
  EXPECT_NEAR(x[0], 0.02001528658519023, 1e-6);
  EXPECT_NEAR(x[1], 0.09736423552739884, 1e-6);
  EXPECT_NEAR(x[2], -0.11737952211258906, 1e-6);
}

TEST_F(LossTest, GradientRowsSumToZeroAndMatchReference) {
  std::mt19937 gen(11);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  const int N = 8, V = 33;
  const float e = 0.1f, scale = 0.25f;
  std::vector<float> logits(N * V);
  for (float& v : logits) v = normal(gen);
  std::vector<int32_t> targets(N);
  for (int i = 0; i < N; ++i) targets[i] = 1 + (7 * i) % (V - 1);

  std::vector<float> x = logits;
  const LossSums s = run(x, targets, V, e, kPad, scale, true);

  double expected_loss = 0.0;
  for (int i = 0; i < N; ++i) {
    const float* row = &logits[i * V];
    expected_loss += label_smoothed_loss_reference(row, V, targets[i], e);
    // softmax in double, then (p - q) * scale column by column
    double max_x = row[0];
    for (int j = 1; j < V; ++j) max_x = std::max(max_x, double(row[j]));
    double z = 0.0;
    for (int j = 0; j < V; ++j) z += std::exp(row[j] - max_x);
    double row_sum = 0.0;
    for (int j = 0; j < V; ++j) {
      const double q = j == targets[i] ? 1.0 - e : e / (V - 1);
      const double expected = (std::exp(row[j] - max_x) / z - q) * scale;
      EXPECT_NEAR(x[i * V + j], expected, 1e-6) << "row " << i << " column " << j;
      row_sum += x[i * V + j];
    }
    EXPECT_NEAR(row_sum, 0.0, 1e-6) << "row " << i;
  }
  EXPECT_NEAR(s.loss, expected_loss, 1e-5 * N);
  EXPECT_EQ(s.tokens, N);
}

TEST(Summarize, DividesOnceAtTheEnd) {
  LossSums sums;
  sums.loss = 5.0;  // smoothed: not what the perplexity is made of
  sums.nll = 6.0;
  sums.tokens = 4;
  sums.correct = 3;
  const LossSummary s = summarize(sums);
  EXPECT_DOUBLE_EQ(s.loss, 1.25);
  EXPECT_DOUBLE_EQ(s.nll, 1.5);
  EXPECT_NEAR(s.perplexity, 4.4816890703380645, 1e-12);  // e^nll = e^1.5
  EXPECT_DOUBLE_EQ(s.accuracy, 0.75);
  EXPECT_EQ(s.tokens, 4);

  // Sums add before dividing: (6 + 1) / (4 + 4) = 0.875, not the mean of means.
  LossSums other;
  other.loss = 2.0;
  other.nll = 1.0;
  other.tokens = 4;
  other.correct = 1;
  sums += other;
  EXPECT_DOUBLE_EQ(summarize(sums).loss, 0.875);
  EXPECT_DOUBLE_EQ(summarize(sums).nll, 0.875);
  EXPECT_DOUBLE_EQ(summarize(sums).accuracy, 0.5);

  const LossSummary empty = summarize(LossSums{});
  EXPECT_EQ(empty.loss, 0.0);
  EXPECT_EQ(empty.perplexity, 1.0);
  EXPECT_EQ(empty.accuracy, 0.0);
  EXPECT_EQ(empty.tokens, 0);
}

}  // namespace
}  // namespace mpiformer
