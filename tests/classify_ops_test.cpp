// The classifier's ops through the CPU backend: pooling (cls and mean) on a
// ragged batch, the multi-label ZLPR loss and the softmax head (the
// cross_entropy op with V = K labels) at the scores a confident classifier
// reaches. Expected values come from the formulas, evaluated here in double
// (by hand in the comments where short), never from the code under test.
//
// ZLPR, per row of K scores s and soft targets t in [0, 1]:
//   loss = log(1 + sum_i (1 - t_i) e^{s_i}) + log(1 + sum_i t_i e^{-s_i}).
// The general cross-entropy cases (smoothing, padding, strides, the
// gradient formula) are in loss_test.cpp and ops_test.cpp.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "kernels/backend.h"
#include "kernels/ops.h"
#include "tests/backend_buffer.h"

namespace mpiformer {
namespace {

// Offsets of a ragged batch from per-sequence lengths, on the host and in
// backend memory.
class RaggedRows {
 public:
  RaggedRows(Ops& ops, const std::vector<int>& lengths) : host_{0} {
    for (int len : lengths) host_.push_back(host_.back() + len);
    device_ = std::make_unique<Buffer<int32_t>>(ops, host_);
  }
  Ragged view() {
    Ragged r;
    r.host_offsets = host_.data();
    r.device_offsets = device_->get();
    r.batch = static_cast<int>(host_.size()) - 1;
    r.total = host_.back();
    for (int b = 0; b < r.batch; ++b) r.max_len = std::max(r.max_len, r.length(b));
    return r;
  }

 private:
  std::vector<int32_t> host_;  // (B+1)
  std::unique_ptr<Buffer<int32_t>> device_;
};

// ZLPR of one row straight from its definition, in double: for moderate
// scores only (e^s must not overflow).  s, t: (K)
double zlpr_direct(const double* s, const float* t, int K) {
  double positive = 1.0, negative = 1.0;
  for (int i = 0; i < K; ++i) {
    positive += (1.0 - t[i]) * std::exp(s[i]);
    negative += t[i] * std::exp(-s[i]);
  }
  return std::log(positive) + std::log(negative);
}
double zlpr_direct(const float* s, const float* t, int K) {
  std::vector<double> wide(s, s + K);
  return zlpr_direct(wide.data(), t, K);
}

// Label-smoothed cross entropy of one row from its definition, in double:
// -sum_j q_j log p_j - constant.  x: (V)
double cross_entropy_direct(const double* x, int V, int target, double smoothing) {
  double top = x[0];
  for (int j = 1; j < V; ++j) top = std::max(top, x[j]);
  double z = 0.0;
  for (int j = 0; j < V; ++j) z += std::exp(x[j] - top);
  const double lse = top + std::log(z);
  double loss = 0.0;
  for (int j = 0; j < V; ++j) {
    const double q = j == target ? 1.0 - smoothing : smoothing / (V - 1);
    loss -= q * (x[j] - lse);
  }
  return loss - label_smoothing_constant(static_cast<float>(smoothing), V);
}

// d f / d x_i by central differences in double; x is restored.  x: (n)
template <typename Loss>
std::vector<double> central_differences(std::vector<double> x, Loss loss, double h) {
  std::vector<double> grad(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + h;
    const double plus = loss(x);
    x[i] = saved - h;
    const double minus = loss(x);
    x[i] = saved;
    grad[i] = (plus - minus) / (2.0 * h);
  }
  return grad;
}

struct ZlprResult {
  LossSums sums;
  std::vector<int64_t> counts;  // (3 K): true positives, false positives, false negatives
  std::vector<float> logits;    // (B, stride): dlogits where compute_grad
};

class ClassifyOpsTest : public ::testing::Test {
 protected:
  // zlpr_loss on fresh sums and counts.  logits: (B, stride or K), targets: (B, K)
  ZlprResult zlpr(const std::vector<float>& logits, const std::vector<float>& targets, int K,
                  float grad_scale, bool compute_grad, int stride = 0) {
    const int B = static_cast<int>(targets.size()) / K;
    Buffer<float> x(*ops_, logits), t(*ops_, targets);
    Buffer<LossSums> sums(*ops_, std::vector<LossSums>(1));
    Buffer<int64_t> counts(*ops_, std::vector<int64_t>(3 * K));
    ops_->zlpr_loss(Act::f32(x.get()), t.get(), B, K, grad_scale, compute_grad, sums.get(),
                    counts.get(), stride);
    return ZlprResult{sums.read()[0], counts.read(), x.read()};
  }

  // cross_entropy without smoothing or padding rows (pad id -1).
  // logits: (N, V), comes back as dlogits where compute_grad
  LossSums softmax_head(std::vector<float>& logits, const std::vector<int32_t>& targets, int V,
                        float smoothing, float grad_scale, bool compute_grad) {
    Buffer<float> x(*ops_, logits);
    Buffer<int32_t> t(*ops_, targets);
    Buffer<LossSums> sums(*ops_, std::vector<LossSums>(1));
    ops_->cross_entropy(Act::f32(x.get()), t.get(), static_cast<int>(targets.size()), V, smoothing,
                        -1, grad_scale, compute_grad, sums.get());
    logits = x.read();
    return sums.read()[0];
  }

  // pool_forward of host rows.  x: (N, C); returns (B, C)
  std::vector<float> pool(RaggedRows& rows, const std::vector<float>& x, int C, PoolKind kind) {
    const Ragged r = rows.view();
    Buffer<float> in(*ops_, x), out(*ops_, std::vector<float>(static_cast<size_t>(r.batch) * C));
    ops_->pool_forward(Act::f32(out.get()), Act::f32(in.get()), r, C, kind);
    return out.read();
  }
  // pool_backward into a dx that starts as `fill` everywhere (it must be
  // written, not added to).  dout: (B, C); returns (N, C)
  std::vector<float> unpool(RaggedRows& rows, const std::vector<float>& dout, int C, PoolKind kind,
                            float fill = 99.0f) {
    const Ragged r = rows.view();
    Buffer<float> d(*ops_, dout),
        dx(*ops_, std::vector<float>(static_cast<size_t>(r.total) * C, fill));
    ops_->pool_backward(Act::f32(dx.get()), Act::f32(d.get()), r, C, kind);
    return dx.read();
  }

  std::unique_ptr<Ops> ops_ = make_cpu_ops(1);
};

// ---- ZLPR -------------------------------------------------------------------

TEST_F(ClassifyOpsTest, ZlprHandValues) {
  // s = (0, 0), t = (1, 0): A = log(1 + 0 e^0 + 1 e^0) = ln 2,
  // B = log(1 + 1 e^0 + 0 e^0) = ln 2; loss = 2 ln 2 = 1.3862943611198906.
  // Gradient: ds_0 = 0 - 1 e^{0 - ln 2} = -1/2, ds_1 = 1 e^{0 - ln 2} - 0 = 1/2.
  const ZlprResult two = zlpr({0.0f, 0.0f}, {1.0f, 0.0f}, 2, 1.0f, true);
  EXPECT_NEAR(two.sums.loss, 1.3862943611198906, 1e-12);
  EXPECT_EQ(two.sums.nll, two.sums.loss);
  EXPECT_EQ(two.sums.tokens, 1);
  EXPECT_EQ(two.sums.correct, 0);  // s_0 = 0 is not > 0: label 0 is missed
  EXPECT_NEAR(two.logits[0], -0.5f, 1e-7f);
  EXPECT_NEAR(two.logits[1], 0.5f, 1e-7f);
  // label 0: a false negative; label 1: nothing
  EXPECT_EQ(two.counts, (std::vector<int64_t>{0, 0, 0, 0, 1, 0}));

  // s = (2, -1, 0.5), t = (1, 0, 0):
  //   A = log(1 + e^-1 + e^0.5) = log(3.0166007) = 1.1041306
  //   B = log(1 + e^-2) = log(1.1353353) = 0.1269280; loss = 1.2310586
  const double expected =
      std::log(1.0 + std::exp(-1.0) + std::exp(0.5)) + std::log(1.0 + std::exp(-2.0));
  EXPECT_NEAR(expected, 1.2310586, 1e-6);  // the formula, as worked out above
  const ZlprResult three = zlpr({2.0f, -1.0f, 0.5f}, {1.0f, 0.0f, 0.0f}, 3, 1.0f, false);
  EXPECT_NEAR(three.sums.loss, expected, 1e-12);
  EXPECT_EQ(three.logits, (std::vector<float>{2.0f, -1.0f, 0.5f}));  // no gradient: untouched

  // No true label: B = log(1 + 0) = 0 and A = log(1 + sum e^s).
  //   1 + e^0.3 + e^-0.7 + e^1.2 = 1 + 1.3498588 + 0.4965853 + 3.3201169 = 6.1665610
  const ZlprResult none = zlpr({0.3f, -0.7f, 1.2f}, {0.0f, 0.0f, 0.0f}, 3, 1.0f, false);
  EXPECT_NEAR(
      none.sums.loss,
      std::log(1.0 + std::exp(double{0.3f}) + std::exp(double{-0.7f}) + std::exp(double{1.2f})),
      1e-12);
  EXPECT_NEAR(none.sums.loss, std::log(6.1665610), 1e-6);
}

// Soft targets (label smoothing, distilled labels) against the direct form.
TEST_F(ClassifyOpsTest, ZlprSoftTargetsMatchDirectEvaluation) {
  const int K = 6;
  const std::vector<float> s = {0.8f,  -1.5f, 2.25f, 0.0f, -0.3f, 1.1f,  //
                                -2.0f, 0.4f,  0.1f,  3.0f, -0.9f, -0.2f};
  const std::vector<float> t = {0.3f, 0.7f, 0.5f, 0.0f, 1.0f,  0.15f,  //
                                0.9f, 0.1f, 0.6f, 0.3f, 0.05f, 1.0f};
  const ZlprResult r = zlpr(s, t, K, 1.0f, true);
  const double row0 = zlpr_direct(&s[0], &t[0], K), row1 = zlpr_direct(&s[K], &t[K], K);
  EXPECT_NEAR(r.sums.loss, row0 + row1, 1e-12 * (row0 + row1));
  EXPECT_EQ(r.sums.tokens, 2);
  // Gradient in the direct form: (1 - t_i) e^{s_i} / P - t_i e^{-s_i} / N,
  // P and N the two arguments of the logs.
  for (int b = 0; b < 2; ++b) {
    double positive = 1.0, negative = 1.0;
    for (int i = 0; i < K; ++i) {
      positive += (1.0 - t[b * K + i]) * std::exp(double{s[b * K + i]});
      negative += t[b * K + i] * std::exp(-double{s[b * K + i]});
    }
    for (int i = 0; i < K; ++i) {
      const double si = s[b * K + i], ti = t[b * K + i];
      const double want = (1.0 - ti) * std::exp(si) / positive - ti * std::exp(-si) / negative;
      EXPECT_NEAR(r.logits[b * K + i], want, 2e-7) << "row " << b << " label " << i;
    }
  }
}

// At |s| = 1e4, e^s overflows any float or double: only the log-sum-exp
// form survives.
TEST_F(ClassifyOpsTest, ZlprStableAtConfidentScores) {
  const std::vector<float> t = {1.0f, 0.0f, 1.0f, 0.0f};
  // Right and confident: A = log(1 + 2 e^-1e4) = 0 and B likewise (e^-1e4
  // is 0 even in double).
  const ZlprResult right = zlpr({1e4f, -1e4f, 1e4f, -1e4f}, t, 4, 1.0f, true);
  EXPECT_GE(right.sums.loss, 0.0);
  EXPECT_LE(right.sums.loss, 1e-12);
  EXPECT_EQ(right.sums.correct, 1);
  for (float g : right.logits) {
    EXPECT_TRUE(std::isfinite(g));
    EXPECT_LE(std::fabs(g), 1e-12f);
  }
  EXPECT_EQ(right.counts, (std::vector<int64_t>{1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0}));

  // Wrong on every label: A = log(1 + 2 e^1e4) = 1e4 + ln 2 (+ e^-1e4), and
  // B the same: loss = 2e4 + 2 ln 2. Gradient: for a true label
  // -e^{1e4} / (1 + 2 e^{1e4}) = -1/2, for a false one +1/2.
  const ZlprResult wrong = zlpr({-1e4f, 1e4f, -1e4f, 1e4f}, t, 4, 1.0f, true);
  EXPECT_NEAR(wrong.sums.loss, 2e4 + 2.0 * std::log(2.0), 1e-6 * 2e4);
  EXPECT_EQ(wrong.sums.correct, 0);
  EXPECT_EQ(wrong.counts, (std::vector<int64_t>{0, 0, 0, 0, 0, 1, 0, 1, 1, 0, 1, 0}));
  const std::vector<float> half = {-0.5f, 0.5f, -0.5f, 0.5f};
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(std::isfinite(wrong.logits[i]));
    EXPECT_NEAR(wrong.logits[i], half[i], 1e-6f) << "label " << i;
  }

  // One true label missed by 1e4, the others right: B = log(1 + e^1e4) =
  // 1e4, A = 0; its gradient is -e^{1e4} / (1 + e^{1e4}) = -1, the
  // others' e^{-1e4} = 0.
  const ZlprResult one = zlpr({-1e4f, -1e4f, -1e4f}, {1.0f, 0.0f, 0.0f}, 3, 1.0f, true);
  EXPECT_NEAR(one.sums.loss, 1e4, 1e-6 * 1e4);
  for (float g : one.logits) {
    EXPECT_TRUE(std::isfinite(g));
    EXPECT_LE(std::fabs(g), 1.0f);
  }
  EXPECT_NEAR(one.logits[0], -1.0f, 1e-6f);
  EXPECT_EQ(one.logits[1], 0.0f);
  EXPECT_EQ(one.logits[2], 0.0f);

  // A soft target at 1e4: t = 0.3 on s = 1e4 leaves (1 - t) e^{1e4} in A and
  // t e^{-1e4} in B: loss = 1e4 + ln 0.7 (+ e^-1e4 terms).
  const ZlprResult soft = zlpr({1e4f}, {0.3f}, 1, 1.0f, true);
  EXPECT_NEAR(soft.sums.loss, 1e4 + std::log1p(-double{0.3f}), 1e-6 * 1e4);
  EXPECT_TRUE(std::isfinite(soft.logits[0]));
  EXPECT_NEAR(soft.logits[0], 1.0f, 1e-6f);  // (1 - t) e^{s - A} = 1, t e^{-s - B} = 0
}

// The gradient against central differences of the direct form in double,
// scaled by grad_scale.
TEST_F(ClassifyOpsTest, ZlprGradientMatchesFiniteDifferences) {
  const int B = 3, K = 5;
  const float grad_scale = 0.25f;
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> score(-3.0f, 3.0f);
  const std::vector<float> levels = {0.0f, 1.0f, 0.3f, 0.5f, 0.85f};
  std::vector<float> s(B * K), t(B * K);
  for (int i = 0; i < B * K; ++i) {
    s[i] = score(rng);
    t[i] = levels[(i * 3 + i / K) % levels.size()];
  }
  const ZlprResult r = zlpr(s, t, K, grad_scale, true);
  double expected_loss = 0.0;
  for (int b = 0; b < B; ++b) {
    const float* row_t = &t[b * K];
    expected_loss += zlpr_direct(&s[b * K], row_t, K);
    const std::vector<double> row_s(s.begin() + b * K, s.begin() + (b + 1) * K);
    const std::vector<double> numeric = central_differences(
        row_s, [&](const std::vector<double>& x) { return zlpr_direct(x.data(), row_t, K); }, 1e-5);
    for (int i = 0; i < K; ++i) {
      EXPECT_NEAR(r.logits[b * K + i], grad_scale * numeric[i], 1e-7)
          << "row " << b << " label " << i;
    }
  }
  EXPECT_NEAR(r.sums.loss, expected_loss, 1e-12 * expected_loss);
}

// tokens, correct and the per-label counts of a small batch, and their
// accumulation over calls; rows `stride` apart leave the padding alone.
TEST_F(ClassifyOpsTest, ZlprSumsAndLabelCountsAccumulate) {
  const int K = 3, stride = 5;
  const std::vector<float> s = {2.0f,  -1.0f, 0.5f,    // predicted {0, 2}
                                1.0f,  -2.0f, -3.0f,   // predicted {0}
                                -1.0f, 3.0f,  0.0f,    // predicted {1}: 0 is not > 0
                                -1.0f, -1.0f, -1.0f};  // predicted {}
  const std::vector<float> t = {1.0f, 0.0f, 0.0f,      // true {0}: label 2 a false positive
                                1.0f, 0.0f, 0.0f,      // true {0}: the one correct row
                                1.0f, 1.0f, 0.0f,      // true {0, 1}: label 0 a false negative
                                0.2f, 0.5f, 0.4999f};  // true {1} (t >= 0.5): a false negative
  // TP: label 0 rows 0, 1; label 1 row 2. FP: label 2 row 0.
  // FN: label 0 row 2; label 1 row 3.
  const std::vector<int64_t> once = {2, 1, 0, 0, 0, 1, 1, 1, 0};
  const int B = 4;
  double expected_loss = 0.0;
  for (int b = 0; b < B; ++b) expected_loss += zlpr_direct(&s[b * K], &t[b * K], K);

  std::vector<float> padded(B * stride, 7.0f);
  for (int b = 0; b < B; ++b) std::copy_n(&s[b * K], K, &padded[b * stride]);
  Buffer<float> x(*ops_, padded), targets(*ops_, t);
  Buffer<LossSums> sums(*ops_, std::vector<LossSums>(1));
  Buffer<int64_t> counts(*ops_, std::vector<int64_t>(3 * K));
  ops_->zlpr_loss(Act::f32(x.get()), targets.get(), B, K, 1.0f, false, sums.get(), counts.get(),
                  stride);
  const LossSums first = sums.read()[0];
  EXPECT_EQ(first.tokens, 4);
  EXPECT_EQ(first.correct, 1);
  EXPECT_NEAR(first.loss, expected_loss, 1e-12 * expected_loss);
  EXPECT_EQ(first.nll, first.loss);
  EXPECT_EQ(counts.read(), once);

  // A second call adds: every sum doubles. This one writes the gradient,
  // in the K columns of each row only.
  ops_->zlpr_loss(Act::f32(x.get()), targets.get(), B, K, 1.0f, true, sums.get(), counts.get(),
                  stride);
  const LossSums second = sums.read()[0];
  EXPECT_EQ(second.tokens, 8);
  EXPECT_EQ(second.correct, 2);
  EXPECT_EQ(second.loss, 2.0 * first.loss);
  EXPECT_EQ(second.nll, 2.0 * first.nll);
  std::vector<int64_t> twice = once;
  for (int64_t& c : twice) c *= 2;
  EXPECT_EQ(counts.read(), twice);
  const std::vector<float> grad = x.read();
  for (int b = 0; b < B; ++b) {
    for (int c = K; c < stride; ++c) EXPECT_EQ(grad[b * stride + c], 7.0f) << b << "," << c;
    EXPECT_NE(grad[b * stride], s[b * K]) << "row " << b << " holds no gradient";
  }
}

// The ops take any compute precision: bf16 scores are widened and the
// gradient rounded (here +-1/2, exact in bf16).
TEST_F(ClassifyOpsTest, ZlprInBf16) {
  const std::vector<uint16_t> zeros(2, float_to_bf16(0.0f));
  Buffer<uint16_t> x(*ops_, zeros);
  Buffer<float> targets(*ops_, {1.0f, 0.0f});
  Buffer<LossSums> sums(*ops_, std::vector<LossSums>(1));
  Buffer<int64_t> counts(*ops_, std::vector<int64_t>(6));
  ops_->zlpr_loss(Act(x.get(), DType::kBF16), targets.get(), 1, 2, 1.0f, true, sums.get(),
                  counts.get());
  EXPECT_NEAR(sums.read()[0].loss, 2.0 * std::log(2.0), 1e-12);
  const std::vector<uint16_t> grad = x.read();
  EXPECT_EQ(bf16_to_float(grad[0]), -0.5f);
  EXPECT_EQ(bf16_to_float(grad[1]), 0.5f);
}

TEST_F(ClassifyOpsTest, ZlprIndependentOfThreadCount) {
  const int B = 3001, K = 40;  // B * K well above the threading threshold
  std::mt19937 rng(23);
  std::normal_distribution<float> score(0.0f, 3.0f);
  std::uniform_real_distribution<float> target(0.0f, 1.0f);
  std::vector<float> s(static_cast<size_t>(B) * K), t(s.size());
  for (float& v : s) v = score(rng);
  for (float& v : t) v = target(rng);
  const int threads = omp_get_max_threads();
  std::vector<ZlprResult> results;
  for (int n : {1, 2, 3}) {
    omp_set_num_threads(n);
    results.push_back(zlpr(s, t, K, 0.5f, true));
  }
  omp_set_num_threads(threads);
  for (int i = 1; i < 3; ++i) {
    EXPECT_EQ(results[i].sums.loss, results[0].sums.loss) << "1 vs " << i + 1 << " threads";
    EXPECT_EQ(results[i].sums.correct, results[0].sums.correct);
    EXPECT_EQ(results[i].counts, results[0].counts);
    EXPECT_TRUE(results[i].logits == results[0].logits) << "gradient, 1 vs " << i + 1;
  }
  EXPECT_EQ(results[0].sums.tokens, B);
}

// ---- the softmax head: cross_entropy with V = K labels -----------------------

TEST_F(ClassifyOpsTest, SoftmaxHeadStableAtConfidentLogits) {
  const int K = 5;
  const float big = 1e4f;
  // Right by 2e4: lse = 1e4 + log(1 + 4 e^-2e4) = 1e4 = x_t, so the loss is
  // 0 and p is one-hot on the target: gradient 0 (to rounding of e^-2e4).
  std::vector<float> right = {-big, -big, big, -big, -big};
  const LossSums r = softmax_head(right, {2}, K, 0.0f, 0.5f, true);
  EXPECT_GE(r.loss, 0.0);
  EXPECT_LE(r.loss, 1e-12);
  EXPECT_EQ(r.correct, 1);
  for (float g : right) {
    EXPECT_TRUE(std::isfinite(g));
    EXPECT_LE(std::fabs(g), 1e-30f);
  }

  // Wrong by the same margin (target 0 at -1e4, class 2 at +1e4): loss =
  // lse - x_0 = 1e4 + 1e4 = 2e4; p = onehot(2), so dlogits = (p - onehot(0))
  // * 0.5 = (-0.5, 0, 0.5, 0, 0).
  std::vector<float> wrong = {-big, -big, big, -big, -big};
  const LossSums w = softmax_head(wrong, {0}, K, 0.0f, 0.5f, true);
  EXPECT_NEAR(w.loss, 2e4, 1e-6 * 2e4);
  EXPECT_NEAR(w.nll, 2e4, 1e-6 * 2e4);
  EXPECT_EQ(w.correct, 0);
  const std::vector<float> want = {-0.5f, 0.0f, 0.5f, 0.0f, 0.0f};
  for (int j = 0; j < K; ++j) {
    EXPECT_TRUE(std::isfinite(wrong[j]));
    EXPECT_NEAR(wrong[j], want[j], 1e-6f) << "class " << j;
  }

  // Smoothing 0.1 penalises the confident right answer:
  //   loss = lse - 0.9 x_t - 0.025 (sum x - x_t) - constant
  //        = 1e4 - 9000 - 0.025 (-4e4) - 0.4637124 = 1999.5362876,
  // the constant -(0.9 ln 0.9 + 0.1 ln 0.025) as in loss_test; nll stays 0.
  std::vector<float> smoothed = {-big, -big, big, -big, -big};
  const LossSums sm = softmax_head(smoothed, {2}, K, 0.1f, 1.0f, false);
  EXPECT_NEAR(sm.loss, 2000.0 - 0.4637124095034373, 1e-6 * 2000.0);
  EXPECT_LE(sm.nll, 1e-12);
}

// The gradient against central differences of the definition in double, at
// moderate logits and at a confident margin where p saturates.
TEST_F(ClassifyOpsTest, SoftmaxHeadGradientMatchesFiniteDifferences) {
  const int K = 5;
  const float grad_scale = 0.25f, smoothing = 0.1f;
  const std::vector<float> logits = {0.7f,  -1.2f, 2.0f, 0.1f,   -0.4f,  // moderate
                                     25.0f, -3.0f, 1.5f, -20.0f, 4.0f};  // confident
  const std::vector<int32_t> targets = {3, 0};
  std::vector<float> grad = logits;
  softmax_head(grad, targets, K, smoothing, grad_scale, true);
  for (int b = 0; b < 2; ++b) {
    const std::vector<double> row(logits.begin() + b * K, logits.begin() + (b + 1) * K);
    const std::vector<double> numeric = central_differences(
        row,
        [&](const std::vector<double>& x) {
          return cross_entropy_direct(x.data(), K, targets[b], smoothing);
        },
        1e-5);
    for (int j = 0; j < K; ++j) {
      EXPECT_NEAR(grad[b * K + j], grad_scale * numeric[j], 1e-6) << "row " << b << " class " << j;
    }
  }
}

// ---- pooling ------------------------------------------------------------------

// x[r][c] = 10 r + c over sequences of lengths 3, 1, 4: every mean is exact.
TEST_F(ClassifyOpsTest, PoolForwardClsAndMean) {
  const int C = 3;
  RaggedRows rows(*ops_, {3, 1, 4});
  std::vector<float> x(8 * C);
  for (int r = 0; r < 8; ++r)
    for (int c = 0; c < C; ++c) x[r * C + c] = 10.0f * r + c;
  // cls: rows 0, 3 and 4.
  EXPECT_EQ(pool(rows, x, C, PoolKind::kCls),
            (std::vector<float>{0, 1, 2, 30, 31, 32, 40, 41, 42}));
  // mean: rows 0-2 -> (0 + 10 + 20) / 3 = 10; row 3; rows 4-7 -> (40 + 50 + 60 + 70) / 4 = 55.
  EXPECT_EQ(pool(rows, x, C, PoolKind::kMean),
            (std::vector<float>{10, 11, 12, 30, 31, 32, 55, 56, 57}));
}

TEST_F(ClassifyOpsTest, PoolBackwardClsAndMean) {
  const int C = 3;
  RaggedRows rows(*ops_, {3, 1, 4});
  const std::vector<float> dout = {3, 6,  -9,  //
                                   1, 2,  3,   //
                                   4, -8, 2};
  // cls: dout[b] on the first row of b, 0 on the others (none left at 99).
  EXPECT_EQ(unpool(rows, dout, C, PoolKind::kCls),
            (std::vector<float>{3, 6,  -9, 0, 0, 0, 0, 0, 0,  //
                                1, 2,  3,                     //
                                4, -8, 2,  0, 0, 0, 0, 0, 0, 0, 0, 0}));
  // mean: dout[b] / length(b) on every row: (1, 2, -3) three times; (1, 2, 3);
  // (1, -2, 0.5) four times.
  EXPECT_EQ(unpool(rows, dout, C, PoolKind::kMean),
            (std::vector<float>{1, 2,  -3,   1, 2,  -3,   1, 2,  -3,  //
                                1, 2,  3,                             //
                                1, -2, 0.5f, 1, -2, 0.5f, 1, -2, 0.5f, 1, -2, 0.5f}));
}

// An empty sequence pools to 0 and owns no rows of dx.
TEST_F(ClassifyOpsTest, PoolEmptySequence) {
  const int C = 2;
  RaggedRows rows(*ops_, {2, 0, 1});
  const std::vector<float> x = {1, 2, 3, 4, 5, 6};
  for (PoolKind kind : {PoolKind::kCls, PoolKind::kMean}) {
    const std::vector<float> out = pool(rows, x, C, kind);
    EXPECT_EQ(out[2], 0.0f);
    EXPECT_EQ(out[3], 0.0f);
    EXPECT_EQ(out[4], 5.0f);  // the next sequence is unaffected
    EXPECT_EQ(out[5], 6.0f);
  }
  EXPECT_EQ(unpool(rows, {2, 4, 8, 8, 6, 7}, C, PoolKind::kMean),
            (std::vector<float>{1, 2, 1, 2, 6, 7}));
}

// pool_backward is the adjoint of pool_forward: <dout, pool(x)> = <pool^T(dout), x>.
TEST_F(ClassifyOpsTest, PoolBackwardIsTheAdjoint) {
  const int C = 16;
  RaggedRows rows(*ops_, {3, 1, 4});
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(8 * C), dout(3 * C);
  for (float& v : x) v = normal(rng);
  for (float& v : dout) v = normal(rng);
  for (PoolKind kind : {PoolKind::kCls, PoolKind::kMean}) {
    const std::vector<float> pooled = pool(rows, x, C, kind);
    const std::vector<float> dx = unpool(rows, dout, C, kind);
    double forward = 0.0, backward = 0.0, scale = 0.0;
    for (size_t i = 0; i < dout.size(); ++i) forward += double{dout[i]} * pooled[i];
    for (size_t i = 0; i < x.size(); ++i) {
      backward += double{dx[i]} * x[i];
      scale += std::fabs(double{dx[i]} * x[i]);
    }
    EXPECT_NEAR(forward, backward, 1e-6 * scale) << (kind == PoolKind::kCls ? "cls" : "mean");
  }
}

}  // namespace
}  // namespace mpiformer
