// Learning-rate schedules, clipping, AdamW and parameter initialisation.
// Expected values are worked out by hand in the comments or by the scalar
// reference written here, never by the code under test.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <vector>

#include "kernels/backend.h"
#include "src/core/config.h"
#include "src/core/parameters.h"
#include "src/core/shard_plan.h"
#include "src/optim/adamw.h"
#include "src/optim/schedule.h"

namespace mpiformer {
namespace {

// ---- schedules ----------------------------------------------------------

OptimConfig schedule_config(ScheduleKind kind, float peak, int64_t warmup, float end = 0.0f) {
  OptimConfig c;
  c.schedule = kind;
  c.lr = peak;
  c.warmup = warmup;
  c.end_lr = end;
  return c;
}

TEST(Schedule, WarmupIsLinearToThePeak) {
  // warmup 4, peak 2: step s <= 4 gives 2 * s / 4.
  for (ScheduleKind kind : {ScheduleKind::kConstant, ScheduleKind::kPolynomial,
                            ScheduleKind::kInverseSqrt, ScheduleKind::kCosine}) {
    const LrSchedule s(schedule_config(kind, 2.0f, 4, 0.1f), 12);
    EXPECT_FLOAT_EQ(s.lr(1), 0.5f) << to_string(kind);
    EXPECT_FLOAT_EQ(s.lr(2), 1.0f) << to_string(kind);
    EXPECT_FLOAT_EQ(s.lr(3), 1.5f) << to_string(kind);
    EXPECT_FLOAT_EQ(s.lr(4), 2.0f) << to_string(kind);
  }
}

TEST(Schedule, Constant) {
  const LrSchedule s(schedule_config(ScheduleKind::kConstant, 2.0f, 4), 12);
  EXPECT_FLOAT_EQ(s.lr(5), 2.0f);
  EXPECT_FLOAT_EQ(s.lr(12), 2.0f);
  EXPECT_FLOAT_EQ(s.lr(1000), 2.0f);
  // No warmup: the peak from step 1.
  const LrSchedule flat(schedule_config(ScheduleKind::kConstant, 3.0f, 0), 12);
  EXPECT_FLOAT_EQ(flat.lr(1), 3.0f);
}

TEST(Schedule, InverseSqrt) {
  // peak * sqrt(warmup / s), warmup 4, peak 2
  const LrSchedule s(schedule_config(ScheduleKind::kInverseSqrt, 2.0f, 4), 100);
  EXPECT_FLOAT_EQ(s.lr(9), 1.3333333f);  // 2 * sqrt(4/9) = 2 * 2/3
  EXPECT_FLOAT_EQ(s.lr(16), 1.0f);       // 2 * sqrt(4/16) = 2 * 1/2
  EXPECT_FLOAT_EQ(s.lr(400), 0.2f);      // 2 * sqrt(4/400) = 2 * 1/10
  // No warmup: peak / sqrt(s).
  const LrSchedule none(schedule_config(ScheduleKind::kInverseSqrt, 2.0f, 0), 100);
  EXPECT_FLOAT_EQ(none.lr(1), 2.0f);
  EXPECT_FLOAT_EQ(none.lr(4), 1.0f);
  EXPECT_FLOAT_EQ(none.lr(100), 0.2f);
}

TEST(Schedule, Polynomial) {
  // peak 2, end 0.1, warmup 4, 12 steps: p = (s - 4) / 8
  const LrSchedule s(schedule_config(ScheduleKind::kPolynomial, 2.0f, 4, 0.1f), 12);
  EXPECT_FLOAT_EQ(s.lr(6), 1.525f);  // 0.1 + 1.9 * (1 - 0.25) = 0.1 + 1.425
  EXPECT_FLOAT_EQ(s.lr(8), 1.05f);   // 0.1 + 1.9 * 0.5
  EXPECT_FLOAT_EQ(s.lr(12), 0.1f);   // the end
  EXPECT_FLOAT_EQ(s.lr(20), 0.1f);   // clamped past it

  OptimConfig squared = schedule_config(ScheduleKind::kPolynomial, 2.0f, 4, 0.1f);
  squared.poly_power = 2.0f;
  const LrSchedule q(squared, 12);
  EXPECT_FLOAT_EQ(q.lr(6), 1.16875f);  // 0.1 + 1.9 * 0.75^2 = 0.1 + 1.06875
  EXPECT_FLOAT_EQ(q.lr(8), 0.575f);    // 0.1 + 1.9 * 0.5^2

  // No warmup, peak 1, end 0, 10 steps: 1 - s / 10.
  const LrSchedule linear(schedule_config(ScheduleKind::kPolynomial, 1.0f, 0), 10);
  EXPECT_FLOAT_EQ(linear.lr(1), 0.9f);
  EXPECT_FLOAT_EQ(linear.lr(5), 0.5f);
  EXPECT_FLOAT_EQ(linear.lr(10), 0.0f);
}

TEST(Schedule, Cosine) {
  // peak 2, end 0.1, warmup 4, 12 steps: 0.1 + 1.9 * (1 + cos(pi p)) / 2
  const LrSchedule s(schedule_config(ScheduleKind::kCosine, 2.0f, 4, 0.1f), 12);
  EXPECT_FLOAT_EQ(s.lr(6), 1.7217514f);    // p = 1/4: (1 + 0.7071068) / 2 = 0.8535534
  EXPECT_FLOAT_EQ(s.lr(8), 1.05f);         // p = 1/2: cos = 0, 0.1 + 0.95
  EXPECT_FLOAT_EQ(s.lr(10), 0.37824856f);  // p = 3/4: (1 - 0.7071068) / 2 = 0.1464466
  EXPECT_FLOAT_EQ(s.lr(12), 0.1f);
  EXPECT_FLOAT_EQ(s.lr(13), 0.1f);
}

// ---- clipping -----------------------------------------------------------

TEST(LrScaling, FollowsTheGlobalTokenBudget) {
  EXPECT_EQ(lr_scale_factor(LrScaling::kNone, 8192, 4096), 1.0);
  EXPECT_EQ(lr_scale_factor(LrScaling::kNone, 0, 0), 1.0);  // nothing to scale by
  EXPECT_DOUBLE_EQ(lr_scale_factor(LrScaling::kLinear, 8192, 4096), 2.0);
  EXPECT_DOUBLE_EQ(lr_scale_factor(LrScaling::kLinear, 1024, 4096), 0.25);
  EXPECT_DOUBLE_EQ(lr_scale_factor(LrScaling::kSqrt, 16384, 4096), 2.0);
  EXPECT_DOUBLE_EQ(lr_scale_factor(LrScaling::kSqrt, 4096, 4096), 1.0);
  EXPECT_THROW(lr_scale_factor(LrScaling::kLinear, 4096, 0), std::invalid_argument);
}

TEST(ClipFactor, BringsTheNormToTheLimit) {
  EXPECT_FLOAT_EQ(clip_factor(2.0, 1.0f), 0.49999975f);   // 1 / (2 + 1e-6)
  EXPECT_FLOAT_EQ(clip_factor(10.0, 5.0f), 0.49999997f);  // 5 / (10 + 1e-6)
  EXPECT_EQ(clip_factor(0.5, 1.0f), 1.0f);                // already within
  EXPECT_EQ(clip_factor(1.0, 1.0f), 1.0f);                // exactly at the limit
  EXPECT_EQ(clip_factor(100.0, 0.0f), 1.0f);              // clipping disabled
}

// ---- parameters and AdamW -----------------------------------------------

class OptimTest : public ::testing::Test {
 protected:
  std::vector<float> read(const float* x, size_t n) {
    std::vector<float> host(n);
    ops_->device().copy_to_host(host.data(), x, n * sizeof(float));
    return host;
  }
  void write(float* x, const std::vector<float>& host) {
    ops_->device().copy_to_device(x, host.data(), host.size() * sizeof(float));
  }
  // "w" (2, 2) decays; "b" (2) and "gamma" (2) do not.  8 floats in all.
  void add_tiny(ParameterSet& p) {
    p.add("w", {2, 2}, true, Init::kNormal, 0.02f);
    p.add("b", {2}, false, Init::kZeros);
    p.add("gamma", {2}, false, Init::kOnes);
  }

  std::unique_ptr<Ops> ops_ = make_cpu_ops(1);
};

TEST_F(OptimTest, ParameterLayoutAndLookup) {
  ParameterSet p(*ops_);
  add_tiny(p);
  p.allocate(1);
  EXPECT_EQ(p.count(), 8u);
  EXPECT_EQ(p.find("w"), 0);
  EXPECT_EQ(p.find("gamma"), 2);
  EXPECT_EQ(p.find("missing"), -1);
  EXPECT_EQ(p.info()[1].offset, 4u);
  EXPECT_EQ(p.info()[2].offset, 6u);
  EXPECT_EQ(p.param(2), p.params() + 6);
  EXPECT_EQ(p.grad(1), p.grads() + 4);
  EXPECT_EQ(read(p.params() + 4, 4), (std::vector<float>{0, 0, 1, 1}));  // zeros, ones
  EXPECT_EQ(read(p.grads(), 8), std::vector<float>(8, 0.0f));

  write(p.grads(), {1, 2, 3, 4, 5, 6, 7, 8});
  p.zero_grads();
  EXPECT_EQ(read(p.grads(), 8), std::vector<float>(8, 0.0f));
}

TEST_F(OptimTest, InitIsDeterministicPerSeed) {
  ParameterSet a(*ops_), b(*ops_), c(*ops_);
  for (ParameterSet* p : {&a, &b, &c}) p->add("w", {16, 8}, true, Init::kNormal, 0.5f);
  a.allocate(42);
  b.allocate(42);
  c.allocate(43);
  EXPECT_EQ(read(a.params(), 128), read(b.params(), 128));
  EXPECT_NE(read(a.params(), 128), read(c.params(), 128));
}

TEST_F(OptimTest, InitDependsOnTheNameNotTheOrder) {
  ParameterSet a(*ops_), b(*ops_);
  a.add("enc.w", {3, 5}, true, Init::kNormal, 0.1f);
  a.add("dec.w", {7}, true, Init::kNormal, 1.0f);
  b.add("extra", {11}, true, Init::kNormal, 1.0f);
  b.add("dec.w", {7}, true, Init::kNormal, 1.0f);
  b.add("norm", {4}, false, Init::kOnes);
  b.add("enc.w", {3, 5}, true, Init::kNormal, 0.1f);
  a.allocate(5);
  b.allocate(5);
  EXPECT_EQ(read(a.param(a.find("enc.w")), 15), read(b.param(b.find("enc.w")), 15));
  EXPECT_EQ(read(a.param(a.find("dec.w")), 7), read(b.param(b.find("dec.w")), 7));
  // Different names draw different streams (same std so only the stream differs).
  EXPECT_NE(read(b.param(b.find("extra")), 7), read(b.param(b.find("dec.w")), 7));
}

TEST_F(OptimTest, NormalInitHasTheRequestedStd) {
  const size_t n = 512 * 512;
  ParameterSet p(*ops_);
  p.add("big", {512, 512}, true, Init::kNormal, 0.02f);
  p.allocate(9);
  const std::vector<float> x = read(p.params(), n);
  double sum = 0.0, sum_sq = 0.0;
  size_t within_one_std = 0;
  for (float v : x) {
    sum += v;
    sum_sq += double(v) * v;
    within_one_std += std::fabs(v) < 0.02f;
  }
  const double mean = sum / n;
  const double sd = std::sqrt(sum_sq / n - mean * mean);
  // Standard errors: mean 0.02 / 512 = 3.9e-5; std 0.02 / sqrt(2n) = 2.8e-5.
  EXPECT_NEAR(mean, 0.0, 2e-4);
  EXPECT_NEAR(sd, 0.02, 2e-4);
  // A normal has 68.27% within one std (standard error 0.09%).
  EXPECT_NEAR(double(within_one_std) / n, 0.6827, 0.005);
}

// Scalar AdamW in double: g *= scale (the inverse loss scale times the clip
// factor); m, v moments; bias-corrected update; decoupled decay p -= lr * wd * p.
struct ScalarAdam {
  double beta1, beta2, eps;
  std::vector<double> p, m, v;
  void step(const std::vector<double>& grads, const std::vector<double>& wd, double lr,
            double scale, int t) {
    for (size_t i = 0; i < p.size(); ++i) {
      const double g = grads[i] * scale;
      m[i] = beta1 * m[i] + (1 - beta1) * g;
      v[i] = beta2 * v[i] + (1 - beta2) * g * g;
      const double m_hat = m[i] / (1 - std::pow(beta1, t));
      const double v_hat = v[i] / (1 - std::pow(beta2, t));
      p[i] -= lr * (m_hat / (std::sqrt(v_hat) + eps) + wd[i] * p[i]);
    }
  }
};

void expect_close(const std::vector<float>& got, const std::vector<double>& want,
                  const char* what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], 1e-6 + 1e-5 * std::fabs(want[i])) << what << "[" << i << "]";
  }
}

TEST_F(OptimTest, AdamWMatchesScalarReferenceOverTwoSteps) {
  ParameterSet p(*ops_);
  add_tiny(p);
  p.allocate(3);
  const std::vector<float> p0 = {0.5f, -0.25f, 1.0f, 2.0f, 0.1f, -0.2f, 1.0f, 1.0f};
  const std::vector<float> g1 = {0.1f, -0.2f, 0.3f, 0.0f, 1.0f, -0.5f, 0.05f, -0.05f};
  const std::vector<float> g2 = {-0.1f, 0.4f, 0.3f, 0.2f, 0.5f, 0.5f, 0.0f, 0.1f};
  write(p.params(), p0);

  OptimConfig cfg;
  cfg.beta1 = 0.9f;
  cfg.beta2 = 0.98f;
  cfg.eps = 1e-9f;
  cfg.weight_decay = 0.1f;
  cfg.clip_norm = 0.0f;  // the scale below is the inverse loss scale alone
  AdamW adam(p, cfg);

  ScalarAdam ref{
      cfg.beta1, cfg.beta2, cfg.eps, {}, std::vector<double>(8, 0.0), std::vector<double>(8, 0.0)};
  ref.p.assign(p0.begin(), p0.end());
  // Decay on "w" (elements 0..3) only.
  const std::vector<double> wd = {
      cfg.weight_decay, cfg.weight_decay, cfg.weight_decay, cfg.weight_decay, 0, 0, 0, 0};

  write(p.grads(), g1);
  adam.measure_gradients();
  adam.step(0.01f, 0.5f);
  ref.step({g1.begin(), g1.end()}, wd, 0.01f, 0.5f, 1);
  EXPECT_EQ(adam.steps_taken(), 1);
  expect_close(read(p.params(), 8), ref.p, "params after step 1");

  write(p.grads(), g2);
  adam.measure_gradients();
  adam.step(0.02f, 0.8f);
  ref.step({g2.begin(), g2.end()}, wd, 0.02f, 0.8f, 2);
  EXPECT_EQ(adam.steps_taken(), 2);
  expect_close(read(p.params(), 8), ref.p, "params after step 2");
  expect_close(read(adam.m(), 8), ref.m, "m");
  expect_close(read(adam.v(), 8), ref.v, "v");
}

TEST_F(OptimTest, WeightDecayOnlyOnDecayTensorsUnlessDecayAll) {
  // Zero gradients leave Adam's term at 0, so one step is pure decay:
  // p *= 1 - lr * wd = 1 - 0.1 * 0.1 = 0.99.
  const std::vector<float> p0 = {1, 2, 3, 4, 5, 6, 7, 8};
  for (bool decay_all : {false, true}) {
    ParameterSet p(*ops_);
    add_tiny(p);
    p.allocate(1);
    write(p.params(), p0);
    OptimConfig cfg;
    cfg.weight_decay = 0.1f;
    cfg.decay_all = decay_all;
    AdamW adam(p, cfg);
    adam.measure_gradients();
    adam.step(0.1f, 1.0f);
    const std::vector<float> got = read(p.params(), 8);
    for (int i = 0; i < 8; ++i) {
      const bool decays = i < 4 || decay_all;
      EXPECT_NEAR(got[i], decays ? p0[i] * 0.99f : p0[i], 1e-6f * p0[i])
          << "decay_all=" << decay_all << " element " << i;
    }
  }
}

TEST_F(OptimTest, InverseLossScaleMultipliesGradients) {
  // grads g with inverse loss scale 0.25 == grads g / 4 with 1.
  const std::vector<float> g = {0.4f, -0.8f, 1.2f, 0.0f, 2.0f, -1.0f, 0.2f, -0.6f};
  std::vector<float> quarter(8);
  for (int i = 0; i < 8; ++i) quarter[i] = g[i] / 4;
  ParameterSet a(*ops_), b(*ops_);
  add_tiny(a);
  add_tiny(b);
  a.allocate(2);
  b.allocate(2);
  OptimConfig cfg;
  cfg.weight_decay = 0.01f;
  cfg.clip_norm = 0.0f;
  AdamW adam_a(a, cfg), adam_b(b, cfg);
  for (int step = 0; step < 2; ++step) {
    write(a.grads(), g);
    write(b.grads(), quarter);
    adam_a.measure_gradients();
    adam_b.measure_gradients();
    adam_a.step(0.01f, 0.25f);
    adam_b.step(0.01f, 1.0f);
  }
  const std::vector<float> pa = read(a.params(), 8), pb = read(b.params(), 8);
  const std::vector<float> va = read(adam_a.v(), 8), vb = read(adam_b.v(), 8);
  for (int i = 0; i < 8; ++i) {
    EXPECT_NEAR(pa[i], pb[i], 1e-7f + 1e-6f * std::fabs(pb[i])) << i;
    EXPECT_NEAR(va[i], vb[i], 1e-6f * vb[i]) << i;
  }
  // Adam's step is nearly scale-invariant, so check a moment directly.
  ParameterSet c(*ops_);
  add_tiny(c);
  c.allocate(2);
  AdamW adam_c(c, cfg);
  write(c.grads(), g);
  adam_c.measure_gradients();
  adam_c.step(0.01f, 1.0f);
  // After one step v = (1 - beta2) g^2: element 0 is 0.02 * 0.16 (beta2 = 0.98).
  EXPECT_NEAR(read(adam_c.v(), 1)[0], 0.0032f, 1e-5f * 0.0032f);
}

TEST_F(OptimTest, GradNormIsTheGlobalL2Norm) {
  ParameterSet p(*ops_);
  add_tiny(p);
  p.allocate(1);
  AdamW adam(p, OptimConfig{});
  // sqrt(3^2 + 4^2 + 12^2) = sqrt(169) = 13, across three tensors.
  write(p.grads(), {3, 0, 0, 0, 0, 4, 0, 12});
  adam.measure_gradients();
  EXPECT_DOUBLE_EQ(adam.measured_norm(), 13.0);
}

TEST_F(OptimTest, ClipsWithTheNormMeasuredOnTheBackend) {
  // Gradients of norm 13 carrying a loss scale of 4: the unscaled norm is
  // 3.25, clipped to 1 by the factor 1 / (3.25 + 1e-6) after unscaling.
  const std::vector<float> g = {3, 0, 0, 0, 0, 4, 0, 12};
  ParameterSet p(*ops_);
  add_tiny(p);
  p.allocate(5);
  const std::vector<float> p0 = read(p.params(), 8);
  OptimConfig cfg;
  cfg.clip_norm = 1.0f;
  AdamW adam(p, cfg);
  write(p.grads(), g);
  adam.measure_gradients();
  adam.step(0.01f, 0.25f);
  ScalarAdam ref{cfg.beta1,
                 cfg.beta2,
                 cfg.eps,
                 {p0.begin(), p0.end()},
                 std::vector<double>(8, 0.0),
                 std::vector<double>(8, 0.0)};
  const double clip = 1.0 / (3.25 + 1e-6);
  ref.step({g.begin(), g.end()}, std::vector<double>(8, 0.0), 0.01, 0.25 * clip, 1);
  expect_close(read(p.params(), 8), ref.p, "clipped params");
  expect_close(read(adam.m(), 8), ref.m, "clipped m");
  EXPECT_NEAR(read(adam.m(), 8)[7], (1 - cfg.beta1) * 12 * 0.25 * clip, 1e-7);
}

// The sharded optimizer's slices: in rank order, covering the buffer,
// starting on norm blocks, as even as whole blocks go; empty for ranks
// beyond the blocks of a tiny model.
TEST(ShardPlan, SlicesCoverTheBufferInRankOrderOnNormBlocks) {
  const size_t B = kNormBlockFloats;
  for (const size_t count : {size_t{0}, size_t{1}, B - 1, B, 3 * B + 7, 10 * B, 101 * B + 5}) {
    for (int world : {1, 2, 3, 4, 7}) {
      const ShardPlan plan = plan_shards(count, world);
      ASSERT_EQ(plan.world(), world);
      EXPECT_EQ(plan.begin(0), 0u);
      EXPECT_EQ(plan.end(world - 1), count);
      const size_t blocks = norm_blocks(count);
      for (int r = 0; r < world; ++r) {
        EXPECT_LE(plan.begin(r), plan.end(r));
        if (r > 0) {
          EXPECT_EQ(plan.begin(r), plan.end(r - 1));
        }
        if (plan.begin(r) < count) {
          EXPECT_EQ(plan.begin(r) % B, 0u) << count << " / " << world;
        }
        // Whole blocks, at most one more than the fewest.
        const size_t mine = norm_blocks(plan.end(r)) - plan.begin(r) / B;
        EXPECT_GE(mine, blocks / world);
        EXPECT_LE(mine, blocks / world + 1);
      }
    }
  }
  // Uneven: 10 blocks over 3 ranks are 3, 3 and 4.
  const ShardPlan three = plan_shards(10 * B, 3);
  EXPECT_EQ(three.bounds, (std::vector<size_t>{0, 3 * B, 6 * B, 10 * B}));
  // Fewer blocks than ranks: some slices are empty.
  const ShardPlan tiny = plan_shards(B + 1, 4);
  EXPECT_EQ(tiny.bounds, (std::vector<size_t>{0, 0, B, B, B + 1}));
}

}  // namespace
}  // namespace mpiformer
