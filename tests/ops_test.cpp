// The CPU ops against finite differences and naive scalar references.
//
// Gradient checks: for a fixed random R, L(x) = sum(out(x) * R) accumulated
// in double; every analytic gradient element is compared with the central
// difference (L(x + h) - L(x - h)) / 2h, h = 1e-2. The forward runs in fp32,
// so L carries a rounding error of ~1e-6 that the difference amplifies to
// ~1e-4, and the truncation error is ~h^2 |f'''| / 6 ~ 1e-5: hence a
// relative tolerance of 1e-2 with an absolute floor of 2e-3 (kRtol, kAtol).
#include "kernels/ops.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <ostream>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/device.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/softmax_row.h"
#include "kernels/cpu/vec_math.h"

namespace mpiformer {
namespace {

using Vec = std::vector<float>;

constexpr float kH = 1e-2f;     // finite-difference step
constexpr double kRtol = 1e-2;  // relative tolerance of a gradient element
constexpr double kAtol = 2e-3;  // absolute floor for near-zero gradients

Vec random_vec(size_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  Vec v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// sum(out * r) in double.  out, r: (n)
double weighted_sum(const float* out, const Vec& r) {
  double sum = 0.0;
  for (size_t i = 0; i < r.size(); ++i) sum += static_cast<double>(out[i]) * r[i];
  return sum;
}

// Central differences of `loss` with respect to every element of x (x is
// perturbed in place and restored).
Vec numeric_grad(Vec& x, const std::function<double()>& loss, float h = kH) {
  Vec grad(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const float saved = x[i];
    x[i] = saved + h;
    const double plus = loss();
    x[i] = saved - h;
    const double minus = loss();
    x[i] = saved;
    grad[i] = static_cast<float>((plus - minus) / (2.0 * h));
  }
  return grad;
}

void expect_close(const Vec& actual, const Vec& expected, double rtol, double atol,
                  const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  int failures = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double a = actual[i], e = expected[i];
    const double tol = atol + rtol * std::max(std::fabs(a), std::fabs(e));
    if (!(std::fabs(a - e) <= tol) && failures++ < 10) {
      ADD_FAILURE() << what << "[" << i << "]: got " << a << ", expected " << e;
    }
  }
}

void expect_grad_close(const Vec& analytic, const Vec& numeric, const std::string& what) {
  expect_close(analytic, numeric, kRtol, kAtol, what);
}

// fp32 host data as the ops take it (the CPU backend's memory is the host's).
Act act(const Vec& v) {
  return Act::f32(v.data());
}

// Loss sums of the CPU backend, accumulated in host memory.
LossSums cross_entropy(Ops& ops, Vec& logits, const std::vector<int32_t>& targets, int N, int V,
                       float smoothing, int pad, float grad_scale, bool compute_grad) {
  LossSums sums;
  ops.cross_entropy(act(logits), targets.data(), N, V, smoothing, pad, grad_scale, compute_grad,
                    &sums);
  return sums;
}

// Rows grouped by key, owning the host arrays RowGroups points into.
struct Groups {
  std::vector<int32_t> keys, starts, rows;
  RowGroups view;
  explicit Groups(const std::vector<int32_t>& by) {
    const int g = group_rows_by_key(by.data(), static_cast<int>(by.size()), &keys, &starts, &rows);
    view = RowGroups{keys.data(), starts.data(), rows.data(), g};
  }
};

Vec add_vec(const Vec& a, const Vec& b) {
  Vec out(a.size());
  for (size_t i = 0; i < a.size(); ++i) out[i] = a[i] + b[i];
  return out;
}

// Ragged batch from per-sequence lengths; owns its offsets.
struct RaggedBatch {
  std::vector<int32_t> offsets{0};
  explicit RaggedBatch(const std::vector<int>& lengths) {
    for (int len : lengths) offsets.push_back(offsets.back() + len);
  }
  Ragged view() const {
    Ragged r;
    r.host_offsets = offsets.data();
    r.device_offsets = offsets.data();
    r.batch = static_cast<int>(offsets.size()) - 1;
    r.total = offsets.back();
    for (int b = 0; b < r.batch; ++b) r.max_len = std::max(r.max_len, r.length(b));
    return r;
  }
};

class OpsTest : public ::testing::Test {
 protected:
  std::unique_ptr<Ops> ops = make_cpu_ops(0);
};

// ---- helpers in ops_common.cpp ------------------------------------------

TEST(OpsCommonTest, GroupRowsByKey) {
  const std::vector<int32_t> keys = {3, 0, 3, 5, 1, 3, 0};
  const Groups g(keys);
  ASSERT_EQ(g.view.groups, 4);
  EXPECT_EQ(g.keys, (std::vector<int32_t>{0, 1, 3, 5}));           // ascending keys
  EXPECT_EQ(g.starts, (std::vector<int32_t>{0, 2, 3, 6, 7}));      // group boundaries
  EXPECT_EQ(g.rows, (std::vector<int32_t>{1, 6, 4, 0, 2, 5, 3}));  // rows ascending within
  std::vector<int32_t> none_keys, none_starts, none_rows;
  EXPECT_EQ(group_rows_by_key(nullptr, 0, &none_keys, &none_starts, &none_rows), 0);
  EXPECT_EQ(none_starts, (std::vector<int32_t>{0}));
}

// Random keys with many repeats and gaps: groups in ascending key order,
// each listing the rows of its key in ascending order, every row exactly
// once; a negative key is refused.
TEST(OpsCommonTest, GroupRowsByKeyCoversEveryRowOnce) {
  std::mt19937 rng(76);
  std::uniform_int_distribution<int32_t> key(0, 40);
  std::vector<int32_t> keys(1000);
  for (int32_t& k : keys) k = key(rng) * 3;  // gaps between the keys in use
  const Groups g(keys);
  const int N = static_cast<int>(keys.size());
  ASSERT_EQ(g.view.groups, static_cast<int>(g.keys.size()));
  ASSERT_EQ(g.starts.size(), g.keys.size() + 1);
  EXPECT_EQ(g.starts.front(), 0);
  EXPECT_EQ(g.starts.back(), N);
  ASSERT_EQ(g.rows.size(), keys.size());
  std::vector<int> seen(N, 0);
  for (int grp = 0; grp < g.view.groups; ++grp) {
    if (grp > 0) {
      EXPECT_LT(g.keys[grp - 1], g.keys[grp]) << "groups ascending";
    }
    EXPECT_LT(g.starts[grp], g.starts[grp + 1]) << "no empty group";
    for (int r = g.starts[grp]; r < g.starts[grp + 1]; ++r) {
      EXPECT_EQ(keys[g.rows[r]], g.keys[grp]) << "row " << g.rows[r] << " in the wrong group";
      if (r > g.starts[grp]) {
        EXPECT_LT(g.rows[r - 1], g.rows[r]) << "rows ascending";
      }
      ++seen[g.rows[r]];
    }
  }
  EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }));
  std::vector<int32_t> distinct(keys);
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  EXPECT_EQ(g.keys, distinct);

  const std::vector<int32_t> negative = {2, -1};
  std::vector<int32_t> k, s, r;
  EXPECT_THROW(group_rows_by_key(negative.data(), 2, &k, &s, &r), std::invalid_argument);
}

TEST(OpsCommonTest, AttentionScale) {
  AttentionConfig cfg;
  cfg.head_dim = 16;
  EXPECT_FLOAT_EQ(attention_scale(cfg, 7), 0.25f);
  cfg.scale = AttentionScale::kLogLength;
  cfg.ref_len = 64.0f;
  EXPECT_FLOAT_EQ(attention_scale(cfg, 64), 0.25f);  // n = ref_len: the standard scale
  EXPECT_FLOAT_EQ(attention_scale(cfg, 8), 0.125f);  // ln 8 / ln 64 = 1/2
  EXPECT_FLOAT_EQ(attention_scale(cfg, 1), 0.0f);
}

// A progress window counts the fallbacks of its own calls, and the graphs
// held at its end.
TEST(OpsCommonTest, AttentionCallsOfAWindow) {
  const AttentionCalls first{100, 20, 5, 16}, second{160, 26, 6, 17};
  const AttentionCalls window = calls_since(second, first);
  EXPECT_EQ(window.library, 60);
  EXPECT_EQ(window.plain, 6);
  EXPECT_EQ(window.fallbacks, 1);
  EXPECT_EQ(window.graphs, 17);
  EXPECT_EQ(calls_since(second, second).fallbacks, 0);
  EXPECT_EQ(calls_since(first, AttentionCalls{}).fallbacks, 5);
  EXPECT_EQ(attention_summary(window),
            "60 calls on cuDNN, 6 calls on the plain kernels (1 cuDNN did not take)");
  EXPECT_EQ(attention_summary(calls_since(second, second)),
            "0 calls on cuDNN, 0 calls on the plain kernels");
}

TEST(OpsCommonTest, LabelSmoothingConstant) {
  EXPECT_DOUBLE_EQ(label_smoothing_constant(0.0f, 10), 0.0);
  const double e = 0.1f;
  EXPECT_NEAR(label_smoothing_constant(0.1f, 10),
              -((1 - e) * std::log(1 - e) + e * std::log(e / 9)), 1e-12);
  EXPECT_NEAR(label_smoothing_constant(1.0f, 10), std::log(9.0), 1e-12);  // 0 ln 0 = 0
}

// ---- vec_math.h -----------------------------------------------------------

TEST(VecMathTest, FastExpIsAccurate) {
  double worst = 0.0;
  for (float x = -87.0f; x <= 88.0f; x += 0.00731f) {
    const double exact = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::fabs(cpu::fast_exp(x) - exact) / exact);
  }
  EXPECT_LT(worst, 3e-7);  // ~2.5 ulp
  EXPECT_EQ(cpu::fast_exp(0.0f), 1.0f);
  EXPECT_EQ(cpu::fast_exp(-1000.0f), 0.0f);
  EXPECT_TRUE(std::isfinite(cpu::fast_exp(1000.0f)));
}

// ---- backend selection ------------------------------------------------------

TEST(BackendTest, CudaDiscoveryNeverFails) {
  // 0 on a machine without a driver or GPU, never an exception or abort.
  const int devices = cuda_device_count();
  EXPECT_GE(devices, 0);
  if (!cuda_backend_built()) {
    EXPECT_EQ(devices, 0);
  }
  EXPECT_NE(make_cpu_ops(0), nullptr);
  EXPECT_EQ(make_cpu_ops(0)->device().name(), "cpu");
}

// ---- device memory --------------------------------------------------------

TEST(CpuDeviceTest, AllocateIsAlignedZeroedAndTracked) {
  CpuDevice cpu_device;
  EXPECT_EQ(cpu_device.name(), "cpu");
  void* a = cpu_device.allocate(1000);
  void* b = cpu_device.allocate(2001);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 64, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b) % 64, 0u);
  const auto* bytes = static_cast<const unsigned char*>(b);
  EXPECT_TRUE(std::all_of(bytes, bytes + 2001, [](unsigned char c) { return c == 0; }));
  cpu_device.release(a);
  void* c = cpu_device.allocate(500);
  EXPECT_EQ(cpu_device.peak_allocated_bytes(), 3001u);
  cpu_device.release(b);
  cpu_device.release(c);
  cpu_device.release(nullptr);
  EXPECT_EQ(cpu_device.peak_allocated_bytes(), 3001u);

  Vec src = random_vec(10, 1), dst(10);
  float* device = static_cast<float*>(cpu_device.allocate(10 * sizeof(float)));
  cpu_device.copy_to_device(device, src.data(), 10 * sizeof(float));
  cpu_device.copy_to_host(dst.data(), device, 10 * sizeof(float));
  EXPECT_EQ(src, dst);
  cpu_device.fill_zero(device, 10 * sizeof(float));
  EXPECT_TRUE(std::all_of(device, device + 10, [](float x) { return x == 0.0f; }));
  cpu_device.release(device);
}

// ---- elementwise ----------------------------------------------------------

// The activation forward has no op of its own: it is fused into
// matmul_forward. A (N, 1) x (1, 1) GEMM by the weight 1 without bias makes
// the pre-activation x itself (x * 1 is exact), so out = act(x) through the
// op; cpu::activation_forward is the kernel behind it.
void activation_through_gemm(Ops& ops, Vec& out, Vec& pre, const Vec& x, Activation act_kind) {
  const Vec one = {1.0f};
  const int N = static_cast<int>(x.size());
  out.assign(x.size(), 0.0f);
  pre.assign(x.size(), 0.0f);
  ops.matmul_forward(act(out), act(x), act(one), Act(), N, 1, 1, {act_kind, act(pre)});
}

// Scalar references in double: GELU's tanh approximation (GPT-2's) and ReLU,
// and their derivatives.
double gelu_reference(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}
double gelu_derivative_reference(double x) {
  const double c = std::sqrt(2.0 / M_PI), t = std::tanh(c * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * x * x);
}
double activation_reference(Activation act_kind, double x) {
  return act_kind == Activation::kGelu ? gelu_reference(x) : (x > 0.0 ? x : 0.0);
}
double activation_derivative_reference(Activation act_kind, double x) {
  return act_kind == Activation::kGelu ? gelu_derivative_reference(x) : (x > 0.0 ? 1.0 : 0.0);
}

TEST_F(OpsTest, GeluForwardMatchesFormula) {
  Vec x = random_vec(200, 3, -6.0f, 6.0f);
  x.insert(x.end(), {-50.0f, -10.0f, 0.0f, 10.0f, 50.0f});
  Vec out(x.size()), pre;
  cpu::activation_forward(out.data(), x.data(), x.size(), Activation::kGelu);
  for (size_t i = 0; i < x.size(); ++i) {
    const double xi = x[i];
    const double expected = gelu_reference(xi);
    EXPECT_NEAR(out[i], expected, 1e-6 + 1e-6 * std::fabs(expected)) << "x = " << xi;
  }
  Vec through_op;
  activation_through_gemm(*ops, through_op, pre, x, Activation::kGelu);
  EXPECT_EQ(pre, x);
  EXPECT_EQ(through_op, out) << "the op runs the kernel";
}

// --recompute activation: the op makes again, from the kept pre-activation,
// the bits the GEMM's fused activation made (fp32).
TEST_F(OpsTest, ActivationForwardRemakesTheFusedActivation) {
  for (Activation act_kind : {Activation::kGelu, Activation::kRelu}) {
    const Vec x = random_vec(1000, 6, -6.0f, 6.0f);
    Vec fused, pre, again(x.size(), -1.0f);
    activation_through_gemm(*ops, fused, pre, x, act_kind);
    ops->activation_forward(act(again), act(pre), pre.size(), act_kind);
    EXPECT_EQ(again, fused) << (act_kind == Activation::kGelu ? "gelu" : "relu");
    for (size_t i = 0; i < x.size(); i += 37) {
      const double want = activation_reference(act_kind, x[i]);
      EXPECT_NEAR(again[i], want, 1e-5 + 1e-5 * std::fabs(want)) << "x = " << x[i];
    }
  }
}

TEST_F(OpsTest, ActivationBackwardMatchesFiniteDifferences) {
  for (Activation act_kind : {Activation::kGelu, Activation::kRelu}) {
    Vec x = random_vec(64, 4, -3.0f, 3.0f);
    // keep ReLU inputs away from its kink, farther than the FD step
    for (float& xi : x) {
      if (std::fabs(xi) < 0.1f) xi = xi < 0 ? -0.1f : 0.1f;
    }
    const Vec r = random_vec(x.size(), 5);
    Vec out(x.size()), pre, dx(x.size());
    const auto loss = [&] {
      activation_through_gemm(*ops, out, pre, x, act_kind);
      return weighted_sum(out.data(), r);
    };
    ops->activation_backward(act(dx), act(r), act(x), x.size(), act_kind);
    expect_grad_close(dx, numeric_grad(x, loss), act_kind == Activation::kGelu ? "gelu" : "relu");
    for (size_t i = 0; i < x.size(); ++i) {
      const double want = r[i] * activation_derivative_reference(act_kind, x[i]);
      EXPECT_NEAR(dx[i], want, 1e-6 + 1e-6 * std::fabs(want)) << "x = " << x[i];
    }
    Vec in_place = r;  // dx may alias dout
    ops->activation_backward(act(in_place), act(in_place), act(x), x.size(), act_kind);
    EXPECT_EQ(in_place, dx);
  }
}

TEST_F(OpsTest, ReluForward) {
  Vec x = {-1.0f, 0.0f, 2.0f, -0.5f, 3.0f};
  const Vec want = {0.0f, 0.0f, 2.0f, 0.0f, 3.0f};
  Vec out, pre;
  activation_through_gemm(*ops, out, pre, x, Activation::kRelu);
  EXPECT_EQ(out, want);
  cpu::activation_forward(x.data(), x.data(), x.size(), Activation::kRelu);  // the kernel in place
  EXPECT_EQ(x, want);
}

// ---- dropout --------------------------------------------------------------

TEST_F(OpsTest, DropoutZeroIsIdentity) {
  const Vec x = random_vec(100, 6);
  Vec out(x.size()), in_place = x;
  ops->dropout(act(out), act(x), x.size(), Dropout{0.0f, 1, 2});
  EXPECT_EQ(out, x);
  ops->dropout(act(in_place), act(in_place), x.size(), Dropout{0.0f, 1, 2});
  EXPECT_EQ(in_place, x);
}

TEST_F(OpsTest, DropoutKeepRateScaleAndMask) {
  const size_t n = 200000;
  const float p = 0.1f;
  const Vec ones(n, 1.0f);
  Vec fwd(n), bwd(n), in_place = ones, other_stream(n);
  ops->dropout(act(fwd), act(ones), n, Dropout{p, 42, 7});
  ops->dropout(act(bwd), act(ones), n, Dropout{p, 42, 7});  // backward: the same op
  ops->dropout(act(in_place), act(in_place), n, Dropout{p, 42, 7});
  ops->dropout(act(other_stream), act(ones), n, Dropout{p, 42, 8});
  EXPECT_EQ(fwd, bwd);  // backward regenerates the forward mask
  EXPECT_EQ(fwd, in_place);
  EXPECT_NE(fwd, other_stream);
  size_t kept = 0;
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(fwd[i] != 0.0f, dropout_keep(42, 7, i, p)) << i;
    if (fwd[i] != 0.0f) {
      ++kept;
      ASSERT_FLOAT_EQ(fwd[i], 1.0f / (1.0f - p));
    }
  }
  // Binomial: the standard deviation of the keep rate is sqrt(p(1-p)/n) ~ 7e-4.
  EXPECT_NEAR(static_cast<double>(kept) / n, 1.0 - p, 5e-3);
}

// The backend may restate the keep test for speed; it must keep exactly the
// elements dropout_keep() keeps, whatever p and wherever the chunks split.
TEST_F(OpsTest, DropoutMaskAgreesWithDropoutKeep) {
  const size_t n = 70001;
  const Vec ones(n, 1.0f);
  Vec out(n);
  for (float p : {1e-7f, 0.05f, 0.37f, 0.5f, 0.9f, 0.9999999f, 1.0f}) {
    ops->dropout(act(out), act(ones), n, Dropout{p, 1234, 99});
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(out[i] != 0.0f, dropout_keep(1234, 99, i, p)) << "p = " << p << ", i = " << i;
    }
  }
}

TEST_F(OpsTest, DropoutBackwardMatchesFiniteDifferences) {
  Vec x = random_vec(80, 9);
  const Vec r = random_vec(x.size(), 10);
  Vec out(x.size()), dx(x.size());
  const auto loss = [&] {
    ops->dropout(act(out), act(x), x.size(), Dropout{0.3f, 5, 11});
    return weighted_sum(out.data(), r);
  };
  ops->dropout(act(dx), act(r), x.size(), Dropout{0.3f, 5, 11});
  expect_grad_close(dx, numeric_grad(x, loss), "dropout dx");
}

// ---- embeddings -----------------------------------------------------------

TEST_F(OpsTest, EmbeddingForwardBackward) {
  const int V = 6, L = 5, C = 5;
  const std::vector<int32_t> ids = {3, 0, 3, 5, 1, 3, 0};        // repeats accumulate
  const std::vector<int32_t> positions = {0, 1, 2, 0, 1, 0, 1};  // lengths {3, 2, 2}
  const int N = static_cast<int>(ids.size());
  const float scale = 1.5f;
  Vec tokens = random_vec(V * C, 12), table = random_vec(L * C, 15);
  const Vec r = random_vec(N * C, 13);
  Vec out(N * C);
  ops->embedding_forward(act(out), ids.data(), act(tokens), positions.data(), act(table), N, C,
                         scale);
  for (int i = 0; i < N; ++i) {
    for (int c = 0; c < C; ++c) {
      EXPECT_EQ(out[i * C + c], tokens[ids[i] * C + c] * scale + table[positions[i] * C + c]);
    }
  }
  const auto loss = [&] {
    ops->embedding_forward(act(out), ids.data(), act(tokens), positions.data(), act(table), N, C,
                           scale);
    return weighted_sum(out.data(), r);
  };
  const Groups by_id(ids), by_pos(positions);
  const Vec tokens_before = random_vec(V * C, 14), table_before = random_vec(L * C, 18);
  Vec dtokens = tokens_before, dtable = table_before;
  ops->embedding_backward(dtokens.data(), dtable.data(), act(r), by_id.view, by_pos.view, N, C,
                          scale);
  expect_grad_close(dtokens, add_vec(tokens_before, numeric_grad(tokens, loss)), "dtokens (+=)");
  expect_grad_close(dtable, add_vec(table_before, numeric_grad(table, loss)), "dpositions (+=)");
  // Fixed positions: no positions gradient, the tokens' the same.
  Vec dtokens_only = tokens_before;
  ops->embedding_backward(dtokens_only.data(), nullptr, act(r), by_id.view, by_pos.view, N, C,
                          scale);
  EXPECT_EQ(dtokens_only, dtokens);
}

// Against a naive reference: forward row by row; backward adding dout rows
// into the tables in ascending row order, as ops.h promises, so the sums are
// the same floats (bitwise). Repeated ids and positions, ids and positions
// that no row reads (their gradient rows stay as they were), with and
// without a positions gradient.
TEST_F(OpsTest, EmbeddingMatchesNaiveReference) {
  const int V = 40, L = 16, C = 24, N = 300;
  std::mt19937 rng(77);
  std::uniform_int_distribution<int32_t> id(0, V / 2 - 1), position(0, L - 3);
  std::vector<int32_t> ids(N), positions(N);
  for (int i = 0; i < N; ++i) ids[i] = id(rng) * 2, positions[i] = position(rng);  // odd ids unread
  const float scale = 0.75f;
  const Vec tokens = random_vec(static_cast<size_t>(V) * C, 78),
            table = random_vec(static_cast<size_t>(L) * C, 79),
            dout = random_vec(static_cast<size_t>(N) * C, 80);
  Vec out(static_cast<size_t>(N) * C, 9.0f);
  ops->embedding_forward(act(out), ids.data(), act(tokens), positions.data(), act(table), N, C,
                         scale);
  for (int i = 0; i < N; ++i) {
    for (int c = 0; c < C; ++c) {
      ASSERT_EQ(out[i * C + c], tokens[ids[i] * C + c] * scale + table[positions[i] * C + c])
          << i << "," << c;
    }
  }
  const Vec tokens_before = random_vec(tokens.size(), 81),
            table_before = random_vec(table.size(), 82);
  Vec want_tokens = tokens_before, want_table = table_before;
  for (int i = 0; i < N; ++i) {
    for (int c = 0; c < C; ++c) {
      want_tokens[ids[i] * C + c] += dout[i * C + c] * scale;
      want_table[positions[i] * C + c] += dout[i * C + c];
    }
  }
  const Groups by_id(ids), by_pos(positions);
  Vec dtokens = tokens_before, dtable = table_before;
  ops->embedding_backward(dtokens.data(), dtable.data(), act(dout), by_id.view, by_pos.view, N, C,
                          scale);
  EXPECT_EQ(dtokens, want_tokens);
  EXPECT_EQ(dtable, want_table);
  Vec dtokens_only = tokens_before;
  ops->embedding_backward(dtokens_only.data(), nullptr, act(dout), by_id.view, by_pos.view, N, C,
                          scale);
  EXPECT_EQ(dtokens_only, want_tokens);
}

// Rows that share a table row are summed in row order, whatever the thread
// count: the same bits for 1, 2 and 3 threads (sizes above the threading
// threshold).
TEST_F(OpsTest, EmbeddingBackwardIndependentOfThreadCount) {
  const int V = 50, C = 64, N = 2000;
  std::vector<int32_t> ids(N), positions(N);
  for (int i = 0; i < N; ++i) ids[i] = (i * 7919) % V, positions[i] = i % 97;
  const Groups by_id(ids), by_pos(positions);
  const Vec dout = random_vec(static_cast<size_t>(N) * C, 19);
  const int threads = omp_get_max_threads();
  std::vector<Vec> results;
  for (int t : {1, 2, 3}) {
    omp_set_num_threads(t);
    Vec dtokens(V * C), dtable(97 * C);
    ops->embedding_backward(dtokens.data(), dtable.data(), act(dout), by_id.view, by_pos.view, N, C,
                            0.5f);
    dtokens.insert(dtokens.end(), dtable.begin(), dtable.end());
    results.push_back(dtokens);
  }
  omp_set_num_threads(threads);
  EXPECT_EQ(results[0], results[1]);
  EXPECT_EQ(results[0], results[2]);
}

// ---- layer norm -----------------------------------------------------------

TEST_F(OpsTest, LayerNormForwardMatchesReference) {
  const int N = 3, C = 37;
  const Vec x = random_vec(N * C, 19, -2.0f, 3.0f);
  const Vec gamma = random_vec(C, 20), beta = random_vec(C, 21);
  Vec out(N * C), mean(N), rstd(N);
  ops->layernorm_forward(act(out), mean.data(), rstd.data(), act(x), act(gamma), act(beta), N, C,
                         1e-5f);
  for (int i = 0; i < N; ++i) {
    double m = 0.0, var = 0.0;
    for (int c = 0; c < C; ++c) m += x[i * C + c];
    m /= C;
    for (int c = 0; c < C; ++c) var += (x[i * C + c] - m) * (x[i * C + c] - m);
    const double rs = 1.0 / std::sqrt(var / C + 1e-5);  // biased variance
    EXPECT_NEAR(mean[i], m, 1e-6);
    EXPECT_NEAR(rstd[i], rs, 1e-5 * rs);
    for (int c = 0; c < C; ++c) {
      EXPECT_NEAR(out[i * C + c], (x[i * C + c] - m) * rs * gamma[c] + beta[c], 1e-5);
    }
  }
}

TEST_F(OpsTest, LayerNormBackwardMatchesFiniteDifferences) {
  const int N = 5, C = 8;
  const float eps = 1e-5f;
  Vec x = random_vec(N * C, 22);
  Vec gamma = random_vec(C, 23, 0.5f, 1.5f), beta = random_vec(C, 24);
  const Vec r = random_vec(N * C, 25);
  Vec out(N * C), mean(N), rstd(N);
  const auto loss = [&] {
    ops->layernorm_forward(act(out), mean.data(), rstd.data(), act(x), act(gamma), act(beta), N, C,
                           eps);
    return weighted_sum(out.data(), r);
  };
  loss();  // mean and rstd at the unperturbed point
  const Vec dx_before = random_vec(N * C, 26), dgamma_before = random_vec(C, 27),
            dbeta_before = random_vec(C, 28);
  for (bool accumulate : {false, true}) {
    SCOPED_TRACE(accumulate ? "accumulate" : "overwrite");
    Vec dx = dx_before, dgamma = dgamma_before, dbeta = dbeta_before;
    ops->layernorm_backward(act(dx), dgamma.data(), dbeta.data(), act(r), act(x), act(gamma),
                            mean.data(), rstd.data(), N, C, accumulate);
    Vec mean_saved = mean, rstd_saved = rstd;
    const Vec num_dx = numeric_grad(x, loss);
    const Vec num_dgamma = numeric_grad(gamma, loss);
    const Vec num_dbeta = numeric_grad(beta, loss);
    expect_grad_close(dx, accumulate ? add_vec(dx_before, num_dx) : num_dx, "dx");
    expect_grad_close(dgamma, add_vec(dgamma_before, num_dgamma), "dgamma (+=)");
    expect_grad_close(dbeta, add_vec(dbeta_before, num_dbeta), "dbeta (+=)");
    mean = mean_saved, rstd = rstd_saved;
  }
}

// dx_sums: with +=, the sums over rows of dx as it came in, added to what
// they held (the bias gradient the model takes from here under
// dbias_out=norm); dx, dgamma and dbeta the same bits as without them;
// with = (nothing came in) left alone.
TEST_F(OpsTest, LayerNormBackwardSumsTheDxItAddsTo) {
  const int N = 37, C = 24;
  const Vec x = random_vec(N * C, 40), gamma = random_vec(C, 41), beta = random_vec(C, 42);
  const Vec dout = random_vec(N * C, 43), dx_before = random_vec(N * C, 44),
            sums_before = random_vec(C, 45);
  Vec out(N * C), mean(N), rstd(N);
  ops->layernorm_forward(act(out), mean.data(), rstd.data(), act(x), act(gamma), act(beta), N, C,
                         1e-5f);
  for (bool accumulate : {false, true}) {
    SCOPED_TRACE(accumulate ? "accumulate" : "overwrite");
    Vec dx = dx_before, dgamma(C), dbeta(C), sums = sums_before;
    ops->layernorm_backward(act(dx), dgamma.data(), dbeta.data(), act(dout), act(x), act(gamma),
                            mean.data(), rstd.data(), N, C, accumulate, sums.data());
    Vec plain_dx = dx_before, plain_dgamma(C), plain_dbeta(C);
    ops->layernorm_backward(act(plain_dx), plain_dgamma.data(), plain_dbeta.data(), act(dout),
                            act(x), act(gamma), mean.data(), rstd.data(), N, C, accumulate);
    EXPECT_EQ(dx, plain_dx);
    EXPECT_EQ(dgamma, plain_dgamma);
    EXPECT_EQ(dbeta, plain_dbeta);
    for (int c = 0; c < C; ++c) {
      double want = sums_before[c];
      for (int i = 0; accumulate && i < N; ++i) want += dx_before[static_cast<size_t>(i) * C + c];
      EXPECT_NEAR(sums[c], want, 1e-5) << "column " << c;
    }
  }
}

// Parameter-gradient sums are reduced in a fixed order: the same bits for
// any thread count. (Sizes are above the threading threshold.)
TEST_F(OpsTest, LayerNormBackwardIndependentOfThreadCount) {
  const int N = 701, C = 96;
  const Vec x = random_vec(N * C, 29), gamma = random_vec(C, 30), beta = random_vec(C, 31);
  const Vec dout = random_vec(N * C, 32);
  Vec out(N * C), mean(N), rstd(N);
  ops->layernorm_forward(act(out), mean.data(), rstd.data(), act(x), act(gamma), act(beta), N, C,
                         1e-5f);
  const int threads = omp_get_max_threads();
  std::vector<Vec> results;
  for (int t : {1, 2, 3}) {
    omp_set_num_threads(t);
    Vec dx(N * C), dgamma(C), dbeta(C);
    ops->layernorm_backward(act(dx), dgamma.data(), dbeta.data(), act(dout), act(x), act(gamma),
                            mean.data(), rstd.data(), N, C, false);
    dgamma.insert(dgamma.end(), dbeta.begin(), dbeta.end());
    results.push_back(dgamma);
  }
  omp_set_num_threads(threads);
  EXPECT_EQ(results[0], results[1]);
  EXPECT_EQ(results[0], results[2]);
}

// The residual connection fused with the norm after it: the same bits as
// dropout, add and layer norm one after another.
TEST_F(OpsTest, ResidualLayerNormIsDropoutAddAndNorm) {
  const int N = 41, C = 24;
  const Vec s = random_vec(N * C, 62), y = random_vec(N * C, 63), gamma = random_vec(C, 64),
            beta = random_vec(C, 65);
  for (float p : {0.0f, 0.25f}) {
    const Dropout d{p, 9, 4};
    Vec sum(N * C), out(N * C), mean(N), rstd(N);
    ops->residual_layernorm_forward(act(sum), act(out), mean.data(), rstd.data(), act(s), act(y), d,
                                    act(gamma), act(beta), N, C, 1e-5f);
    Vec dropped(N * C), want_sum(N * C), want_out(N * C), want_mean(N), want_rstd(N);
    ops->dropout(act(dropped), act(y), y.size(), d);
    for (size_t i = 0; i < want_sum.size(); ++i) want_sum[i] = s[i] + dropped[i];
    ops->layernorm_forward(act(want_out), want_mean.data(), want_rstd.data(), act(want_sum),
                           act(gamma), act(beta), N, C, 1e-5f);
    EXPECT_EQ(sum, want_sum) << "p = " << p;
    EXPECT_EQ(out, want_out) << "p = " << p;
    EXPECT_EQ(mean, want_mean) << "p = " << p;
    EXPECT_EQ(rstd, want_rstd) << "p = " << p;
  }
}

// ---- matmul ---------------------------------------------------------------

TEST_F(OpsTest, MatmulForwardMatchesReference) {
  const int N = 37, IC = 65, OC = 33;
  const Vec x = random_vec(N * IC, 33), w = random_vec(OC * IC, 34), b = random_vec(OC, 35);
  for (bool with_bias : {true, false}) {
    Vec out(N * OC, 123.0f);  // stale contents must not leak into the result
    ops->matmul_forward(act(out), act(x), act(w), with_bias ? act(b) : Act(), N, IC, OC);
    for (int i = 0; i < N; ++i) {
      for (int o = 0; o < OC; ++o) {
        double expected = with_bias ? b[o] : 0.0;
        for (int c = 0; c < IC; ++c) expected += static_cast<double>(x[i * IC + c]) * w[o * IC + c];
        ASSERT_NEAR(out[i * OC + o], expected, 1e-5 * (1.0 + std::fabs(expected))) << i << "," << o;
      }
    }
  }
}

TEST_F(OpsTest, MatmulBackwardMatchesFiniteDifferences) {
  const int N = 5, IC = 6, OC = 7;
  Vec x = random_vec(N * IC, 36), w = random_vec(OC * IC, 37), b = random_vec(OC, 38);
  const Vec r = random_vec(N * OC, 39);
  const Vec dx_before = random_vec(N * IC, 40), dw_before = random_vec(OC * IC, 41),
            db_before = random_vec(OC, 42);
  for (bool with_bias : {true, false}) {
    for (bool accumulate : {false, true}) {
      SCOPED_TRACE(std::string(with_bias ? "bias" : "no bias") +
                   (accumulate ? ", accumulate" : ", overwrite"));
      Vec out(N * OC);
      const auto loss = [&] {
        ops->matmul_forward(act(out), act(x), act(w), with_bias ? act(b) : Act(), N, IC, OC);
        return weighted_sum(out.data(), r);
      };
      Vec dx = dx_before, dw = dw_before, db = db_before;
      ops->matmul_backward(act(dx), dw.data(), with_bias ? db.data() : nullptr, act(r), act(x),
                           act(w), N, IC, OC, accumulate);
      const Vec num_dx = numeric_grad(x, loss);
      expect_grad_close(dx, accumulate ? add_vec(dx_before, num_dx) : num_dx, "dx");
      expect_grad_close(dw, add_vec(dw_before, numeric_grad(w, loss)), "dweight (+=)");
      if (with_bias) {
        expect_grad_close(db, add_vec(db_before, numeric_grad(b, loss)), "dbias (+=)");
      } else {
        EXPECT_EQ(db, db_before);
      }
    }
  }
  // dx = null skips the input gradient
  Vec dw = dw_before;
  ops->matmul_backward(Act(), dw.data(), nullptr, act(r), act(x), act(w), N, IC, OC, false);
  Vec out(N * OC);
  const auto loss = [&] {
    ops->matmul_forward(act(out), act(x), act(w), Act(), N, IC, OC);
    return weighted_sum(out.data(), r);
  };
  expect_grad_close(dw, add_vec(dw_before, numeric_grad(w, loss)), "dweight without dx");
}

// OpenBLAS rounds differently on 1, 2, 3 threads; cpu::sgemm's fixed tiles
// give the same bits for any count, forward and backward. (Shapes span
// several tiles and are above the threading threshold.)
TEST_F(OpsTest, MatmulIndependentOfThreadCount) {
  const int N = 300, IC = 96, OC = 520;
  const Vec x = random_vec(N * IC, 81), w = random_vec(OC * IC, 82), b = random_vec(OC, 83);
  const Vec dout = random_vec(N * OC, 84);
  const int threads = omp_get_max_threads();
  std::vector<Vec> results;
  for (int t : {1, 2, 3}) {
    omp_set_num_threads(t);
    Vec out(N * OC), dx(N * IC), dw(OC * IC), db(OC);
    ops->matmul_forward(act(out), act(x), act(w), act(b), N, IC, OC);
    ops->matmul_backward(act(dx), dw.data(), db.data(), act(dout), act(x), act(w), N, IC, OC,
                         false);
    for (const Vec* part : {&dx, &dw, &db}) out.insert(out.end(), part->begin(), part->end());
    results.push_back(out);
  }
  omp_set_num_threads(threads);
  EXPECT_TRUE(results[0] == results[1]) << "1 vs 2 threads";
  EXPECT_TRUE(results[0] == results[2]) << "1 vs 3 threads";
}

// Padded strides of the output (the vocabulary projection's logits): the
// columns past OC are never written, with or without a fused activation,
// and dout is read in its stride.
TEST_F(OpsTest, MatmulWithOutputStride) {
  const int N = 9, IC = 8, OC = 5, stride = 8;
  const Vec x = random_vec(N * IC, 66), w = random_vec(OC * IC, 67), b = random_vec(OC, 68);
  Vec dense(N * OC), strided(N * stride, 7.0f);
  ops->matmul_forward(act(dense), act(x), act(w), act(b), N, IC, OC);
  ops->matmul_forward(act(strided), act(x), act(w), act(b), N, IC, OC, {}, stride);
  for (int i = 0; i < N; ++i) {
    for (int c = 0; c < stride; ++c) {
      EXPECT_EQ(strided[i * stride + c], c < OC ? dense[i * OC + c] : 7.0f) << i << "," << c;
    }
  }
  // With a fused activation too: out in its stride, pre dense.
  for (Activation act_kind : {Activation::kGelu, Activation::kRelu}) {
    Vec fused_dense(N * OC), pre_dense(N * OC), fused_strided(N * stride, 7.0f), pre(N * OC);
    ops->matmul_forward(act(fused_dense), act(x), act(w), act(b), N, IC, OC,
                        {act_kind, act(pre_dense)});
    ops->matmul_forward(act(fused_strided), act(x), act(w), act(b), N, IC, OC, {act_kind, act(pre)},
                        stride);
    EXPECT_EQ(pre, pre_dense);
    for (int i = 0; i < N; ++i) {
      for (int c = 0; c < stride; ++c) {
        EXPECT_EQ(fused_strided[i * stride + c], c < OC ? fused_dense[i * OC + c] : 7.0f)
            << (act_kind == Activation::kGelu ? "gelu " : "relu ") << i << "," << c;
      }
    }
  }
  Vec dx_dense(N * IC), dx_strided(N * IC), dw_dense(OC * IC), dw_strided(OC * IC), db_dense(OC),
      db_strided(OC);
  ops->matmul_backward(act(dx_dense), dw_dense.data(), db_dense.data(), act(dense), act(x), act(w),
                       N, IC, OC, false);
  ops->matmul_backward(act(dx_strided), dw_strided.data(), db_strided.data(), act(strided), act(x),
                       act(w), N, IC, OC, false, {}, stride);
  EXPECT_EQ(dx_strided, dx_dense);
  EXPECT_EQ(dw_strided, dw_dense);
  EXPECT_EQ(db_strided, db_dense);
}

// A GEMM with its activation fused: out = act(x W^T + b) keeping the
// pre-activation, and the backward through the activation at the dx of the
// next GEMM; against finite differences of the composed function.
TEST_F(OpsTest, MatmulWithFusedActivation) {
  const int N = 4, IC = 5, OC = 6;
  for (Activation act_kind : {Activation::kGelu, Activation::kRelu}) {
    SCOPED_TRACE(act_kind == Activation::kGelu ? "gelu" : "relu");
    Vec x = random_vec(N * IC, 69), w = random_vec(OC * IC, 70), b = random_vec(OC, 71);
    Vec out(N * OC), pre(N * OC), plain(N * OC);
    ops->matmul_forward(act(out), act(x), act(w), act(b), N, IC, OC, {act_kind, act(pre)});
    ops->matmul_forward(act(plain), act(x), act(w), act(b), N, IC, OC);
    EXPECT_EQ(pre, plain);
    Vec activated(N * OC);
    cpu::activation_forward(activated.data(), plain.data(), plain.size(), act_kind);
    EXPECT_EQ(out, activated);
    for (size_t i = 0; i < out.size(); ++i) {  // against the scalar reference
      const double want = activation_reference(act_kind, plain[i]);
      EXPECT_NEAR(out[i], want, 1e-6 + 1e-6 * std::fabs(want)) << "pre = " << plain[i];
    }

    // Backward: the next layer (OC -> 3) reads out; its dx through the
    // activation is the gradient at pre.
    const int OC2 = 3;
    const Vec w2 = random_vec(OC2 * OC, 72), r = random_vec(N * OC2, 73);
    Vec y(N * OC2);
    const auto loss = [&] {
      ops->matmul_forward(act(out), act(x), act(w), act(b), N, IC, OC, {act_kind, act(pre)});
      ops->matmul_forward(act(y), act(out), act(w2), Act(), N, OC, OC2);
      return weighted_sum(y.data(), r);
    };
    loss();
    Vec dpre(N * OC), dw2(OC2 * OC), dw(OC * IC), db(OC), dx(N * IC);
    ops->matmul_backward(act(dpre), dw2.data(), nullptr, act(r), act(out), act(w2), N, OC, OC2,
                         false, {act_kind, act(pre)});
    ops->matmul_backward(act(dx), dw.data(), db.data(), act(dpre), act(x), act(w), N, IC, OC,
                         false);
    // dpre = act'(pre) * (r @ w2) against the scalar reference derivative
    // (fp32 GEMM of 3 terms and the kernel's tanh: ~1e-6).
    for (int i = 0; i < N; ++i) {
      for (int c = 0; c < OC; ++c) {
        double g = 0.0;
        for (int o = 0; o < OC2; ++o) g += static_cast<double>(r[i * OC2 + o]) * w2[o * OC + c];
        const double want = g * activation_derivative_reference(act_kind, pre[i * OC + c]);
        EXPECT_NEAR(dpre[i * OC + c], want, 1e-5 + 1e-5 * std::fabs(want)) << i << "," << c;
      }
    }
    expect_grad_close(dx, numeric_grad(x, loss), "dx through the activation");
    expect_grad_close(db, numeric_grad(b, loss), "dbias through the activation");
    expect_grad_close(dw, numeric_grad(w, loss), "dweight through the activation");
  }
}

// pre_bias_grad: the sums over rows of the gradient at the pre-activation
// added to what it held, the bits the layer before's bias gradient takes
// from that gradient (dbias_in=dgelu); dx and dweight the same bits as
// without it.
TEST_F(OpsTest, MatmulBackwardSumsTheGradientAtThePreActivation) {
  const int N = 37, IC = 24, OC = 10;
  for (Activation act_kind : {Activation::kGelu, Activation::kRelu}) {
    SCOPED_TRACE(act_kind == Activation::kGelu ? "gelu" : "relu");
    const Vec pre = random_vec(N * IC, 80), y = random_vec(N * IC, 81), w = random_vec(OC * IC, 82);
    const Vec dout = random_vec(N * OC, 83), sums_before = random_vec(IC, 84);
    Vec dx(N * IC), dw(OC * IC), sums = sums_before;
    ops->matmul_backward(act(dx), dw.data(), nullptr, act(dout), act(y), act(w), N, IC, OC, false,
                         {act_kind, act(pre), sums.data()});
    Vec plain_dx(N * IC), plain_dw(OC * IC);
    ops->matmul_backward(act(plain_dx), plain_dw.data(), nullptr, act(dout), act(y), act(w), N, IC,
                         OC, false, {act_kind, act(pre)});
    EXPECT_EQ(dx, plain_dx);
    EXPECT_EQ(dw, plain_dw);
    // The layer before's bias gradient from the same dx (its weight
    // gradient's GEMM on any input: only its bias is compared).
    Vec want = sums_before, unused_dw(IC * 3);
    const Vec x_before = random_vec(N * 3, 85);
    ops->matmul_backward(Act(), unused_dw.data(), want.data(), act(dx), act(x_before),
                         act(random_vec(IC * 3, 86)), N, 3, IC, false);
    EXPECT_EQ(sums, want);
    EXPECT_NE(sums, sums_before);
  }
}

// ---- softmax --------------------------------------------------------------

// The row kernels of attention (kernels/cpu/softmax_row.h), which lost
// their own op: attention keeps only the log-sum-exp.
TEST(SoftmaxRowTest, HonoursValidAndGivesTheLogSumExp) {
  const int R = 4, L = 6;
  const float scale = 0.7f;
  const Vec x = random_vec(R * L, 43, -3.0f, 3.0f);
  const std::vector<int32_t> valid = {6, 3, 1, 0};
  Vec probs(R * L, 9.0f), again(R * L, 9.0f);
  for (int r = 0; r < R; ++r) {
    const float lse = cpu::softmax_row(&probs[r * L], &x[r * L], valid[r], L, scale);
    double denom = 0.0;
    for (int j = 0; j < valid[r]; ++j) denom += std::exp(scale * x[r * L + j]);
    EXPECT_NEAR(lse, valid[r] > 0 ? std::log(denom) : 0.0, 1e-6) << r;
    for (int j = 0; j < L; ++j) {
      const double expected = j < valid[r] ? std::exp(scale * x[r * L + j]) / denom : 0.0;
      EXPECT_NEAR(probs[r * L + j], expected, 1e-6) << r << "," << j;
    }
    // The same probabilities again from the log-sum-exp alone.
    cpu::softmax_row_from_stats(&again[r * L], &x[r * L], valid[r], L, scale, lse);
    for (int j = 0; j < L; ++j) EXPECT_NEAR(again[r * L + j], probs[r * L + j], 1e-6);
  }
  for (int r = 0; r < R; ++r) {  // all columns valid
    cpu::softmax_row(&probs[r * L], &x[r * L], L, L, scale);
    EXPECT_NEAR(std::accumulate(&probs[r * L], &probs[r * L + L], 0.0), 1.0, 1e-6);
  }
  // In place (probs aliasing x), as attention runs it.
  Vec in_place(x.begin(), x.begin() + L), separate(L);
  cpu::softmax_row(separate.data(), x.data(), 4, L, scale);
  cpu::softmax_row(in_place.data(), in_place.data(), 4, L, scale);
  EXPECT_EQ(in_place, separate);
}

TEST(SoftmaxRowTest, BackwardMatchesFiniteDifferences) {
  const int R = 4, L = 6;
  const float scale = 0.7f;
  Vec x = random_vec(R * L, 44, -2.0f, 2.0f);
  const std::vector<int32_t> valid = {6, 3, 1, 0};
  const Vec r = random_vec(R * L, 45);
  Vec probs(R * L), dx(R * L);
  const auto loss = [&] {
    for (int row = 0; row < R; ++row) {
      cpu::softmax_row(&probs[row * L], &x[row * L], valid[row], L, scale);
    }
    return weighted_sum(probs.data(), r);
  };
  loss();
  for (int row = 0; row < R; ++row) {
    cpu::softmax_backward_row(&dx[row * L], &r[row * L], &probs[row * L], L, scale);
  }
  expect_grad_close(dx, numeric_grad(x, loss), "softmax dx");
  loss();            // the probabilities at x again (numeric_grad left the last row perturbed)
  Vec in_place = r;  // dx may alias dprobs
  for (int row = 0; row < R; ++row) {
    cpu::softmax_backward_row(&in_place[row * L], &in_place[row * L], &probs[row * L], L, scale);
  }
  EXPECT_EQ(in_place, dx);
}

// ---- attention ------------------------------------------------------------

struct AttentionCase {
  std::string name;
  std::vector<int> q_lengths, k_lengths;
  int heads = 2, head_dim = 3;
  bool causal = false;
  AttentionScale scale = AttentionScale::kStandard;
  bool fused = true;  // q, k, v column slices of one (N, 3C + pad) tensor
};

// Naive reference: per sequence and head, masked softmax(q k^T * scale_i) v in
// double. Also returns each query row's log-sum-exp of its scaled scores,
// the stats of attention_forward: (Nq, H), 0 for a row that sees no key.
// q: (Nq, .) rows q_stride apart, k, v: (Nk, .) rows kv_stride apart
void reference_attention(std::vector<double>& out, std::vector<double>& stats, const float* q,
                         int q_stride, const float* k, const float* v, int kv_stride,
                         const RaggedBatch& qs, const RaggedBatch& ks, const AttentionConfig& cfg) {
  const int H = cfg.heads, D = cfg.head_dim, C = H * D;
  out.assign(static_cast<size_t>(qs.offsets.back()) * C, 0.0);
  stats.assign(static_cast<size_t>(qs.offsets.back()) * H, 0.0);
  for (size_t b = 0; b + 1 < qs.offsets.size(); ++b) {
    const int Lq = qs.offsets[b + 1] - qs.offsets[b], Lk = ks.offsets[b + 1] - ks.offsets[b];
    for (int h = 0; h < H; ++h) {
      for (int i = 0; i < Lq; ++i) {
        const int visible = cfg.causal ? i + 1 : Lk;
        const double scale = attention_scale(cfg, visible);
        const float* qi = q + static_cast<size_t>(qs.offsets[b] + i) * q_stride + h * D;
        std::vector<double> s(Lk, 0.0);
        double max_s = -1e300, denom = 0.0;
        for (int j = 0; j < visible; ++j) {
          const float* kj = k + static_cast<size_t>(ks.offsets[b] + j) * kv_stride + h * D;
          for (int d = 0; d < D; ++d) s[j] += static_cast<double>(qi[d]) * kj[d];
          s[j] *= scale;
          max_s = std::max(max_s, s[j]);
        }
        for (int j = 0; j < visible; ++j) denom += std::exp(s[j] - max_s);
        if (visible > 0) stats[(qs.offsets[b] + i) * H + h] = max_s + std::log(denom);
        for (int j = 0; j < Lk; ++j) {
          const double p = j < visible ? std::exp(s[j] - max_s) / denom : 0.0;
          const float* vj = v + static_cast<size_t>(ks.offsets[b] + j) * kv_stride + h * D;
          for (int d = 0; d < D; ++d) out[(qs.offsets[b] + i) * C + h * D + d] += p * vj[d];
        }
      }
    }
  }
}

// Names the case in test output instead of dumping its bytes.
void PrintTo(const AttentionCase& tc, std::ostream* os) {
  *os << tc.name;
}

class AttentionTest : public OpsTest, public ::testing::WithParamInterface<AttentionCase> {};

TEST_P(AttentionTest, ForwardMatchesNaiveAndBackwardMatchesFiniteDifferences) {
  const AttentionCase& tc = GetParam();
  AttentionConfig cfg;
  cfg.heads = tc.heads;
  cfg.head_dim = tc.head_dim;
  cfg.causal = tc.causal;
  cfg.scale = tc.scale;
  cfg.ref_len = 4.0f;
  const int C = tc.heads * tc.head_dim;
  const RaggedBatch qs(tc.q_lengths), ks(tc.k_lengths);
  const int Nq = qs.offsets.back(), Nk = ks.offsets.back();
  const float kSentinel = 7.0f;  // in pad columns: must survive the backward pass

  // Storage. Fused: one (N, 3C + 2) tensor holding q | k | v | pad. Cross:
  // q (Nq, C + 1) and a fused kv (Nk, 2C + 1), each with a pad column.
  const int q_stride = tc.fused ? 3 * C + 2 : C + 1;
  const int kv_stride = tc.fused ? 3 * C + 2 : 2 * C + 1;
  Vec qbuf = random_vec(static_cast<size_t>(Nq) * q_stride, 46, -1.5f, 1.5f);
  Vec kvbuf = tc.fused ? Vec() : random_vec(static_cast<size_t>(Nk) * kv_stride, 47, -1.5f, 1.5f);
  Vec& kv_storage = tc.fused ? qbuf : kvbuf;
  const int k_column = tc.fused ? C : 0;
  float* q = qbuf.data();
  const auto k = [&] { return kv_storage.data() + k_column; };
  const auto v = [&] { return kv_storage.data() + k_column + C; };

  const Ragged qv = qs.view(), kv = ks.view();
  Vec out(static_cast<size_t>(Nq) * C), stats(static_cast<size_t>(Nq) * tc.heads);
  const auto forward = [&] {
    ops->attention_forward(act(out), stats.data(), Act::f32(q), q_stride, Act::f32(k()),
                           Act::f32(v()), kv_stride, qv, kv, cfg);
  };
  forward();

  std::vector<double> ref_out, ref_stats;
  reference_attention(ref_out, ref_stats, q, q_stride, k(), v(), kv_stride, qs, ks, cfg);
  for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], ref_out[i], 1e-5) << "out " << i;
  // The stats replace the probabilities of the old interface, checked to
  // 1e-6: the log-sum-exp is held to 1e-6 relative (measured worst 8.5e-8
  // over these cases: fp32 scores and fast_exp's ~2.5 ulp).
  for (size_t i = 0; i < stats.size(); ++i) {
    EXPECT_NEAR(stats[i], ref_stats[i], 1e-6 * (1.0 + std::fabs(ref_stats[i]))) << "stats " << i;
  }

  // Backward, from the forward's output and stats.
  const Vec r = random_vec(out.size(), 48);
  const auto loss = [&] {
    forward();
    return weighted_sum(out.data(), r);
  };
  loss();
  Vec dqbuf(qbuf.size(), kSentinel), dkvbuf(kvbuf.size(), kSentinel);
  Vec& dkv_storage = tc.fused ? dqbuf : dkvbuf;
  ops->attention_backward(act(dqbuf), Act::f32(dkv_storage.data() + k_column),
                          Act::f32(dkv_storage.data() + k_column + C), act(r), act(out),
                          stats.data(), Act::f32(q), q_stride, Act::f32(k()), Act::f32(v()),
                          kv_stride, qv, kv, cfg);

  // Compare the written columns with finite differences, and check that the
  // pad columns still hold the sentinel.
  const auto check = [&](Vec& buf, const Vec& grad, int rows, int stride, int written,
                         const std::string& what) {
    const Vec numeric = numeric_grad(buf, loss);
    Vec got, want;
    for (int i = 0; i < rows; ++i) {
      for (int c = 0; c < stride; ++c) {
        const size_t at = static_cast<size_t>(i) * stride + c;
        if (c < written) {
          got.push_back(grad[at]);
          want.push_back(numeric[at]);
        } else {
          EXPECT_EQ(grad[at], kSentinel) << what << " pad column overwritten at " << at;
        }
      }
    }
    expect_grad_close(got, want, what);
  };
  if (tc.fused) {
    check(qbuf, dqbuf, Nq, q_stride, 3 * C, "dqkv");
  } else {
    check(qbuf, dqbuf, Nq, q_stride, C, "dq");
    check(kvbuf, dkvbuf, Nk, kv_stride, 2 * C, "dkv");
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, AttentionTest,
    ::testing::Values(
        AttentionCase{"causal_ragged", {3, 1, 5}, {3, 1, 5}, 2, 3, true},
        // longer than the 64-query blocks of the causal path
        AttentionCase{"causal_multi_block", {70, 3, 129}, {70, 3, 129}, 1, 2, true},
        AttentionCase{"bidirectional_ragged", {3, 1, 5}, {3, 1, 5}, 2, 3, false},
        AttentionCase{
            "causal_log_length", {3, 1, 5}, {3, 1, 5}, 2, 3, true, AttentionScale::kLogLength},
        AttentionCase{
            "bidirectional_log_length", {4, 2}, {4, 2}, 1, 4, false, AttentionScale::kLogLength},
        // a sequence of length 0 among the others, in self-attention
        AttentionCase{"causal_empty_sequence", {3, 0, 5}, {3, 0, 5}, 2, 3, true},
        AttentionCase{"bidirectional_empty_sequence", {0, 4, 2}, {0, 4, 2}, 2, 3, false},
        AttentionCase{"causal_log_length_empty_sequence",
                      {4, 0, 3, 0},
                      {4, 0, 3, 0},
                      2,
                      2,
                      true,
                      AttentionScale::kLogLength},
        AttentionCase{"bidirectional_log_length_empty_sequence",
                      {2, 0, 5},
                      {2, 0, 5},
                      1,
                      3,
                      false,
                      AttentionScale::kLogLength},
        AttentionCase{"cross", {2, 4, 3}, {3, 1, 5}, 2, 3, false, AttentionScale::kStandard, false},
        AttentionCase{
            "cross_log_length", {2, 4}, {5, 3}, 3, 2, false, AttentionScale::kLogLength, false},
        AttentionCase{"cross_empty_sequences",
                      {0, 2, 3},
                      {3, 0, 2},
                      2,
                      3,
                      false,
                      AttentionScale::kStandard,
                      false}),
    [](const ::testing::TestParamInfo<AttentionCase>& info) { return info.param.name; });

// Sizes above the threading threshold, so the (sequence, head) tasks run in
// parallel: the forward pass against the naive reference, the backward pass
// as a directional derivative along a random u over the fused QKV tensor,
// sum(dqkv * u) against (L(qkv + h u) - L(qkv - h u)) / 2h.
TEST_F(OpsTest, AttentionAtScaleInParallel) {
  for (bool causal : {true, false}) {
    SCOPED_TRACE(causal ? "causal" : "bidirectional");
    AttentionConfig cfg;
    cfg.heads = 4;
    cfg.head_dim = 16;
    cfg.causal = causal;
    const int C = cfg.heads * cfg.head_dim, stride = 3 * C;
    const RaggedBatch seqs({40, 7, 150, 1, 65});
    const Ragged view = seqs.view();
    size_t pairs = 0;
    for (int b = 0; b < view.batch; ++b)
      pairs += static_cast<size_t>(view.length(b)) * view.length(b);
    ASSERT_GE(pairs * cfg.heads * cfg.head_dim, 1u << 15);
    Vec qkv = random_vec(static_cast<size_t>(view.total) * stride, 55);
    Vec out(static_cast<size_t>(view.total) * C),
        stats(static_cast<size_t>(view.total) * cfg.heads);
    const auto forward = [&](const Vec& input) {
      ops->attention_forward(act(out), stats.data(), act(input), stride, act(input) + C,
                             act(input) + 2 * C, stride, view, view, cfg);
    };
    forward(qkv);
    std::vector<double> ref_out, ref_stats;
    reference_attention(ref_out, ref_stats, qkv.data(), stride, qkv.data() + C, qkv.data() + 2 * C,
                        stride, seqs, seqs, cfg);
    for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], ref_out[i], 1e-5) << i;
    for (size_t i = 0; i < stats.size(); ++i) {
      ASSERT_NEAR(stats[i], ref_stats[i], 1e-6 * (1.0 + std::fabs(ref_stats[i]))) << "stats " << i;
    }

    const Vec r = random_vec(out.size(), 56), u = random_vec(qkv.size(), 57);
    Vec dqkv(qkv.size());
    ops->attention_backward(act(dqkv), act(dqkv) + C, act(dqkv) + 2 * C, act(r), act(out),
                            stats.data(), act(qkv), stride, act(qkv) + C, act(qkv) + 2 * C, stride,
                            view, view, cfg);
    double analytic = 0.0;
    for (size_t i = 0; i < u.size(); ++i) analytic += static_cast<double>(dqkv[i]) * u[i];
    const auto loss_along_u = [&](float t) {
      Vec moved = qkv;
      for (size_t i = 0; i < moved.size(); ++i) moved[i] += t * u[i];
      forward(moved);
      return weighted_sum(out.data(), r);
    };
    const double numeric = (loss_along_u(kH) - loss_along_u(-kH)) / (2.0 * kH);
    EXPECT_NEAR(analytic, numeric, kRtol * std::fabs(numeric) + kAtol);
  }
}

// Every (sequence, head) task runs its GEMMs on one thread: the same bits
// for any thread count, whether the tasks run in parallel or not.
TEST_F(OpsTest, AttentionIndependentOfThreadCount) {
  AttentionConfig cfg;
  cfg.heads = 4;
  cfg.head_dim = 16;
  cfg.causal = true;
  const int C = cfg.heads * cfg.head_dim, stride = 3 * C;
  for (const std::vector<int>& lengths : {std::vector<int>{40, 7, 150, 1, 65}, {9, 3}}) {
    const RaggedBatch seqs(lengths);
    const Ragged view = seqs.view();
    const Vec qkv = random_vec(static_cast<size_t>(view.total) * stride, 85);
    const Vec r = random_vec(static_cast<size_t>(view.total) * C, 86);
    const int threads = omp_get_max_threads();
    std::vector<Vec> results;
    for (int t : {1, 2, 3}) {
      omp_set_num_threads(t);
      Vec out(static_cast<size_t>(view.total) * C), stats(static_cast<size_t>(view.total) * 4);
      Vec dqkv(qkv.size());
      ops->attention_forward(act(out), stats.data(), act(qkv), stride, act(qkv) + C,
                             act(qkv) + 2 * C, stride, view, view, cfg);
      ops->attention_backward(act(dqkv), act(dqkv) + C, act(dqkv) + 2 * C, act(r), act(out),
                              stats.data(), act(qkv), stride, act(qkv) + C, act(qkv) + 2 * C,
                              stride, view, view, cfg);
      out.insert(out.end(), dqkv.begin(), dqkv.end());
      results.push_back(out);
    }
    omp_set_num_threads(threads);
    EXPECT_TRUE(results[0] == results[1]) << "1 vs 2 threads, " << lengths.size() << " sequences";
    EXPECT_TRUE(results[0] == results[2]) << "1 vs 3 threads, " << lengths.size() << " sequences";
  }
}

// ---- cross entropy --------------------------------------------------------

// -sum_j q_j log p_j - constant in double, for one row.
double reference_row_loss(const float* x, int target, int V, float e) {
  double max_x = x[0];
  for (int j = 0; j < V; ++j) max_x = std::max(max_x, static_cast<double>(x[j]));
  double sum = 0.0;
  for (int j = 0; j < V; ++j) sum += std::exp(x[j] - max_x);
  const double lse = max_x + std::log(sum);
  double loss = 0.0;
  for (int j = 0; j < V; ++j) {
    const double qj = j == target ? 1.0 - e : e / (V - 1.0);
    loss -= qj * (x[j] - lse);
  }
  return loss - label_smoothing_constant(e, V);
}

TEST_F(OpsTest, CrossEntropyMatchesReferenceOnLargeVocab) {
  const int N = 6, V = 8192, pad = 0;
  const float e = 0.1f;
  const Vec logits = random_vec(static_cast<size_t>(N) * V, 49, -8.0f, 8.0f);
  const std::vector<int32_t> targets = {5, 0, 8191, 17, 0, 4000};
  double expected = 0.0;
  for (int i = 0; i < N; ++i) {
    if (targets[i] != pad) expected += reference_row_loss(&logits[i * V], targets[i], V, e);
  }
  Vec copy = logits;
  const LossSums sums = cross_entropy(*ops, copy, targets, N, V, e, pad, 1.0f, false);
  EXPECT_EQ(copy, logits);  // no gradient requested: logits untouched
  EXPECT_NEAR(sums.loss, expected, 1e-5 * std::fabs(expected));
  EXPECT_EQ(sums.tokens, 4);
  const LossSums with_grad = cross_entropy(*ops, copy, targets, N, V, e, pad, 1.0f, true);
  EXPECT_NEAR(with_grad.loss, sums.loss, 1e-9 * std::fabs(expected));
  for (int i = 0; i < N; ++i) {  // a gradient row sums to sum(p) - sum(q) = 0
    const double row_sum = std::accumulate(&copy[i * V], &copy[i * V + V], 0.0);
    EXPECT_NEAR(row_sum, 0.0, 1e-5);
  }
}

TEST_F(OpsTest, CrossEntropyGradientMatchesFiniteDifferences) {
  const int N = 6, V = 7, pad = 0;
  const float e = 0.1f, grad_scale = 0.5f;
  Vec logits = random_vec(N * V, 50, -2.0f, 2.0f);
  const std::vector<int32_t> targets = {3, 0, 6, 1, 0, 2};  // rows 1 and 4 are padding
  Vec grad = logits;
  const LossSums sums = cross_entropy(*ops, grad, targets, N, V, e, pad, grad_scale, true);
  EXPECT_EQ(sums.tokens, 4);
  for (int j = 0; j < V; ++j) {
    EXPECT_EQ(grad[1 * V + j], 0.0f);
    EXPECT_EQ(grad[4 * V + j], 0.0f);
  }
  const auto loss = [&] {
    Vec copy = logits;
    return cross_entropy(*ops, copy, targets, N, V, e, pad, grad_scale, false).loss;
  };
  Vec expected = numeric_grad(logits, loss);
  for (float& g : expected) g *= grad_scale;
  expect_grad_close(grad, expected, "dlogits");
}

TEST_F(OpsTest, CrossEntropyPerfectPredictionScoresZero) {
  // logits = log q: the smoothed target itself, whose cross entropy is the
  // entropy of q, exactly the constant subtracted.
  const int V = 10;
  const float e = 0.2f;
  Vec logits(V, std::log(e / (V - 1)));
  logits[4] = std::log(1.0f - e);
  const std::vector<int32_t> targets = {4};
  const LossSums sums = cross_entropy(*ops, logits, targets, 1, V, e, 0, 1.0f, true);
  EXPECT_NEAR(sums.loss, 0.0, 1e-6);
  for (float g : logits) EXPECT_NEAR(g, 0.0f, 1e-6);  // p == q
  EXPECT_EQ(sums.correct, 1);
}

TEST_F(OpsTest, CrossEntropyCountsCorrectWithFirstMaxOnTies) {
  const int V = 4, pad = -1;
  Vec logits = {
      0.0f, 3.0f, 1.0f, 3.0f,  // tie between 1 and 3: argmax 1
      0.0f, 3.0f, 1.0f, 3.0f,  // same row, target 3: wrong
      5.0f, 1.0f, 1.0f, 1.0f,  // argmax 0
      1.0f, 1.0f, 1.0f, 9.0f,  // padding: never counted
  };
  const std::vector<int32_t> targets = {1, 3, 0, -1};
  const LossSums sums = cross_entropy(*ops, logits, targets, 4, V, 0.0f, pad, 1.0f, false);
  EXPECT_EQ(sums.tokens, 3);
  EXPECT_EQ(sums.correct, 2);
}

TEST_F(OpsTest, CrossEntropyIndependentOfThreadCount) {
  const int N = 97, V = 1000;
  const Vec logits = random_vec(static_cast<size_t>(N) * V, 51, -4.0f, 4.0f);
  std::vector<int32_t> targets(N);
  for (int i = 0; i < N; ++i) targets[i] = (i * 37) % V;
  const int threads = omp_get_max_threads();
  std::vector<double> losses;
  for (int t : {1, 2, 3}) {
    omp_set_num_threads(t);
    Vec copy = logits;
    losses.push_back(cross_entropy(*ops, copy, targets, N, V, 0.1f, 0, 1.0f, true).loss);
  }
  omp_set_num_threads(threads);
  EXPECT_EQ(losses[0], losses[1]);
  EXPECT_EQ(losses[0], losses[2]);
}

// The sums accumulate (+=) in the backend's LossSums, and rows `stride`
// apart (padded logits) give the same sums and gradient as dense rows.
TEST_F(OpsTest, CrossEntropyAccumulatesAndTakesAStride) {
  const int N = 5, V = 11, stride = 16;
  const Vec logits = random_vec(static_cast<size_t>(N) * V, 58, -3.0f, 3.0f);
  const std::vector<int32_t> targets = {4, 0, 10, 7, 1};
  Vec dense = logits, strided(static_cast<size_t>(N) * stride, 5.0f);
  for (int i = 0; i < N; ++i) std::copy_n(&logits[i * V], V, &strided[i * stride]);
  LossSums once;
  ops->cross_entropy(act(dense), targets.data(), N, V, 0.1f, 0, 0.5f, true, &once);
  LossSums twice = once;
  ops->cross_entropy(act(strided), targets.data(), N, V, 0.1f, 0, 0.5f, true, &twice, stride);
  EXPECT_EQ(twice.tokens, 2 * once.tokens);
  EXPECT_EQ(twice.correct, 2 * once.correct);
  EXPECT_NEAR(twice.loss, 2 * once.loss, 1e-12 * std::fabs(once.loss));
  for (int i = 0; i < N; ++i) {
    for (int c = 0; c < stride; ++c) {
      EXPECT_EQ(strided[i * stride + c], c < V ? dense[i * V + c] : 5.0f) << i << "," << c;
    }
  }
}

TEST_F(OpsTest, SumSquaresIndependentOfThreadCount) {
  const Vec x = random_vec(200003, 54);
  const int threads = omp_get_max_threads();
  std::vector<double> sums;
  for (int t : {1, 2, 3}) {
    omp_set_num_threads(t);
    double sum = 0.0;
    ops->sum_squares(&sum, x.data(), x.size());
    sums.push_back(sum);
  }
  omp_set_num_threads(threads);
  EXPECT_EQ(sums[0], sums[1]);
  EXPECT_EQ(sums[0], sums[2]);
}

// ---- optimizer ------------------------------------------------------------

// Several ranges with their own weight decay, gradients that carry a loss
// scale, and the clip factor taken from the squared norm in backend memory.
// The exact sum's conversions against the formula: round to nearest even
// in units of 2^-40, elements at or above 2^20 (and NaN) counted instead,
// and the way back NaN everywhere once any was counted.
TEST_F(OpsTest, FixedPointAccumulateAndConvertBack) {
  const size_t n = 70001;  // above the threading threshold
  Vec g = random_vec(n, 91, -1e-3f, 1e-3f);
  g[1] = std::ldexp(3.0f, -41);  // 1.5 units: rounds to 2
  g[2] = std::ldexp(5.0f, -41);  // 2.5 units: rounds to 2
  g[3] = -std::ldexp(3.0f, -41);
  std::vector<int64_t> fixed(n + 1, 0);
  ops->fixed_point_accumulate(fixed.data() + 1, fixed.data(), g.data(), n, 40, 20);
  ops->fixed_point_accumulate(fixed.data() + 1, fixed.data(), g.data(), n, 40, 20);
  EXPECT_EQ(fixed[0], 0);
  EXPECT_EQ(fixed[2], 4);
  EXPECT_EQ(fixed[3], 4);
  EXPECT_EQ(fixed[4], -4);
  for (size_t i = 0; i < n; ++i) {
    const int64_t once = static_cast<int64_t>(std::nearbyint(std::ldexp(double{g[i]}, 40)));
    ASSERT_EQ(fixed[i + 1], 2 * once) << i;
  }
  Vec back(n);
  ops->fixed_point_to_float(back.data(), fixed.data() + 1, fixed.data(), n, 40);
  for (size_t i = 0; i < n; ++i)
    ASSERT_EQ(back[i], static_cast<float>(std::ldexp(static_cast<double>(fixed[i + 1]), -40)));

  Vec bad = g;
  bad[10] = std::ldexp(1.0f, 20);
  bad[11] = std::nanf("");
  bad[12] = -std::ldexp(1.0f, 21);
  ops->fixed_point_accumulate(fixed.data() + 1, fixed.data(), bad.data(), n, 40, 20);
  EXPECT_EQ(fixed[0], 3);
  ops->fixed_point_to_float(back.data(), fixed.data() + 1, fixed.data(), n, 40);
  EXPECT_TRUE(std::all_of(back.begin(), back.end(), [](float x) { return std::isnan(x); }));
}

// The direct exact sum's ops: an accumulation marked first writes over
// whatever the buffer held; rounding in place gives, element for element,
// the bits of that accumulation read back, leaving an element out of range
// as it was and counting it; the poison is NaN everywhere once one was
// counted, and nothing otherwise.
TEST_F(OpsTest, FixedPointFirstAccumulationAndRoundingInPlace) {
  const size_t n = 70001;
  Vec g = random_vec(n, 92, -1e-3f, 1e-3f);
  g[1] = std::ldexp(3.0f, -41);  // ties round to even
  g[2] = std::ldexp(5.0f, -41);
  g[3] = std::ldexp(1.0f, -60);  // below half a unit: 0
  g[4] = std::nextafter(std::ldexp(1.0f, 20), 0.0f);
  std::vector<int64_t> fixed(n + 1, 12345);
  fixed[0] = 0;
  ops->fixed_point_accumulate(fixed.data() + 1, fixed.data(), g.data(), n, 40, 20, true);
  EXPECT_EQ(fixed[0], 0);
  Vec back(n);
  ops->fixed_point_to_float(back.data(), fixed.data() + 1, fixed.data(), n, 40);
  Vec rounded = g;
  int64_t count = 0;
  ops->fixed_point_round(rounded.data(), &count, n, 40, 20);
  EXPECT_EQ(count, 0);
  EXPECT_EQ(std::memcmp(rounded.data(), back.data(), n * sizeof(float)), 0);
  EXPECT_EQ(rounded[1], std::ldexp(2.0f, -40));
  EXPECT_EQ(rounded[2], std::ldexp(2.0f, -40));
  EXPECT_EQ(rounded[3], 0.0f);
  EXPECT_EQ(rounded[4], g[4]);
  EXPECT_NE(std::memcmp(rounded.data(), g.data(), n * sizeof(float)), 0) << "nothing rounded";
  ops->fixed_point_poison(rounded.data(), &count, n);
  EXPECT_EQ(std::memcmp(rounded.data(), back.data(), n * sizeof(float)), 0);

  Vec bad = g;
  bad[10] = std::ldexp(1.0f, 20);
  bad[11] = std::nanf("");
  bad[12] = -INFINITY;
  ops->fixed_point_accumulate(fixed.data() + 1, fixed.data(), bad.data(), n, 40, 20, true);
  EXPECT_EQ(fixed[0], 3);
  EXPECT_EQ(fixed[11], 0);  // written, though out of range
  ops->fixed_point_round(bad.data(), &count, n, 40, 20);
  EXPECT_EQ(count, 3);
  EXPECT_EQ(bad[10], std::ldexp(1.0f, 20));  // left as it was
  EXPECT_EQ(bad[0], back[0]);
  ops->fixed_point_poison(bad.data(), &count, n);
  EXPECT_TRUE(std::all_of(bad.begin(), bad.end(), [](float x) { return std::isnan(x); }));
}

TEST_F(OpsTest, AdamWMatchesScalarReference) {
  const size_t n = 40000;
  Vec params = random_vec(n, 52), m(n), v(n);
  std::vector<double> ref_p(params.begin(), params.end()), ref_m(n), ref_v(n);
  const std::vector<AdamWRange> ranges = {
      {0, 15000, 0.1f}, {15000, 15007, 0.0f}, {15007, n, 0.01f}};
  AdamWConfig cfg;
  cfg.lr = 1e-2f;
  cfg.beta1 = 0.9f;
  cfg.beta2 = 0.98f;
  cfg.eps = 1e-6f;
  cfg.max_norm = 50.0f;
  for (int step = 1; step <= 3; ++step) {
    const Vec grads = random_vec(n, 60 + step);
    cfg.step = step;
    cfg.inv_loss_scale = step == 2 ? 0.25f : 1.0f;
    double norm_sq = 0.0;
    ops->sum_squares(&norm_sq, grads.data(), n);
    // The norm of uniform(-1, 1) grads is ~115: clipped at steps 1 and 3 only.
    const double norm = std::sqrt(norm_sq) * cfg.inv_loss_scale;
    const double scale =
        cfg.inv_loss_scale * (norm > cfg.max_norm ? cfg.max_norm / (norm + 1e-6) : 1.0);
    ops->adamw_update(params.data(), grads.data(), m.data(), v.data(), Act(), n, ranges.data(),
                      static_cast<int>(ranges.size()), cfg, &norm_sq);
    for (const AdamWRange& range : ranges) {
      for (size_t i = range.begin; i < range.end; ++i) {
        const double g = static_cast<double>(grads[i]) * scale;
        ref_m[i] = cfg.beta1 * ref_m[i] + (1.0 - cfg.beta1) * g;
        ref_v[i] = cfg.beta2 * ref_v[i] + (1.0 - cfg.beta2) * g * g;
        const double m_hat = ref_m[i] / (1.0 - std::pow(cfg.beta1, step));
        const double v_hat = ref_v[i] / (1.0 - std::pow(cfg.beta2, step));
        ref_p[i] -= cfg.lr * (m_hat / (std::sqrt(v_hat) + cfg.eps) + range.weight_decay * ref_p[i]);
      }
    }
  }
  for (size_t i = 0; i < n; ++i) {
    ASSERT_NEAR(m[i], ref_m[i], 1e-6) << i;
    ASSERT_NEAR(v[i], ref_v[i], 1e-7) << i;
    ASSERT_NEAR(params[i], ref_p[i], 1e-5) << i;
  }
}

// The compute copy of the weights is refreshed by the same pass, rounded.
TEST_F(OpsTest, AdamWRefreshesTheComputeCopy) {
  const size_t n = 1000;
  Vec params = random_vec(n, 74), m(n), v(n);
  const Vec grads = random_vec(n, 75);
  std::vector<uint16_t> copy(n);
  const AdamWRange range{0, n, 0.0f};
  AdamWConfig cfg;
  cfg.lr = 1e-3f;
  double norm_sq = 0.0;
  ops->adamw_update(params.data(), grads.data(), m.data(), v.data(), Act(copy.data(), DType::kBF16),
                    n, &range, 1, cfg, &norm_sq);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(copy[i], float_to_bf16(params[i])) << i;
}

// The clip is decided from *grad_norm_sq (the norm measured on the backend
// before the update), not from the gradients in hand, on the unscaled norm
// sqrt(*grad_norm_sq) * inv_loss_scale; gradients are then multiplied by
// inv_loss_scale * clip_factor. After one step m = (1 - beta1) g' and
// v = (1 - beta2) g'^2 for the multiplied g'.
TEST_F(OpsTest, AdamWClipsWithTheGivenSquaredNorm) {
  const size_t n = 1000;
  const Vec grads = random_vec(n, 83), start = random_vec(n, 84);
  const AdamWRange range{0, n, 0.0f};
  AdamWConfig cfg;
  cfg.lr = 1e-2f;
  cfg.inv_loss_scale = 0.5f;
  // A claimed squared norm of 1600 (the gradients' own is ~333): the norm is
  // 40, 20 unscaled.
  const double claimed = 1600.0;
  for (float max_norm : {2.0f, 30.0f, 0.0f}) {
    SCOPED_TRACE("max_norm " + std::to_string(max_norm));
    cfg.max_norm = max_norm;
    const double multiplier = 0.5 * (max_norm == 2.0f ? 2.0 / (20.0 + 1e-6) : 1.0);
    EXPECT_NEAR(clip_factor(20.0, max_norm), max_norm == 2.0f ? 2.0 / (20.0 + 1e-6) : 1.0, 1e-7);
    Vec params = start, m(n), v(n);
    ops->adamw_update(params.data(), grads.data(), m.data(), v.data(), Act(), n, &range, 1, cfg,
                      &claimed);
    for (size_t i = 0; i < n; ++i) {
      const double g = grads[i] * multiplier;
      ASSERT_NEAR(m[i], (1.0 - cfg.beta1) * g, 1e-6 * std::fabs((1.0 - cfg.beta1) * g) + 1e-12)
          << i;
      ASSERT_NEAR(v[i], (1.0 - cfg.beta2) * g * g, 1e-5 * (1.0 - cfg.beta2) * g * g + 1e-15) << i;
    }
  }
}

// The gradient norm's partials: one per kNormBlockFloats block, each the
// same whether taken over the whole buffer or over a slice that starts on a
// block boundary (a sharded optimizer's), and their sum in index order.
TEST_F(OpsTest, SumSquaresBlocksAreTheSameForAnyBlockAlignedSlice) {
  const size_t n = 5 * kNormBlockFloats + 123;
  const Vec x = random_vec(n, 55);
  ASSERT_EQ(norm_blocks(n), 6u);
  std::vector<double> whole(norm_blocks(n), -1.0);  // (blocks)
  ops->sum_squares_blocks(whole.data(), x.data(), n);
  for (size_t b = 0; b < whole.size(); ++b) {
    double expected = 0.0;
    for (size_t i = b * kNormBlockFloats; i < std::min(n, (b + 1) * kNormBlockFloats); ++i)
      expected += static_cast<double>(x[i]) * x[i];
    EXPECT_NEAR(whole[b], expected, 1e-12 * expected) << "block " << b;
  }
  // Slices [2, 4) and [4, end) of the blocks, as two ranks would take them.
  std::vector<double> sliced(whole.size(), 0.0);
  ops->sum_squares_blocks(sliced.data() + 2, x.data() + 2 * kNormBlockFloats, 2 * kNormBlockFloats);
  ops->sum_squares_blocks(sliced.data() + 4, x.data() + 4 * kNormBlockFloats,
                          n - 4 * kNormBlockFloats);
  ops->sum_squares_blocks(sliced.data(), x.data(), 2 * kNormBlockFloats);
  for (size_t b = 0; b < whole.size(); ++b) EXPECT_EQ(sliced[b], whole[b]) << "block " << b;

  double total = -1.0, expected = 0.0;
  for (double p : whole) expected += p;  // index order
  ops->sum_doubles(&total, whole.data(), whole.size());
  EXPECT_EQ(total, expected);
  ops->sum_doubles(&total, whole.data(), 0);
  EXPECT_EQ(total, 0.0);
}

TEST_F(OpsTest, SumSquaresBlocksIndependentOfThreadCount) {
  const Vec x = random_vec(200003, 56);
  const int threads = omp_get_max_threads();
  std::vector<std::vector<double>> partials;
  for (int t : {1, 2, 3}) {
    omp_set_num_threads(t);
    partials.emplace_back(norm_blocks(x.size()));
    ops->sum_squares_blocks(partials.back().data(), x.data(), x.size());
  }
  omp_set_num_threads(threads);
  EXPECT_EQ(partials[0], partials[1]);
  EXPECT_EQ(partials[0], partials[2]);
}

TEST_F(OpsTest, SumSquares) {
  const Vec x = random_vec(3 * 16384 + 17, 53);
  double expected = 0.0;
  for (float xi : x) expected += static_cast<double>(xi) * xi;
  double sum = -1.0;
  ops->sum_squares(&sum, x.data(), x.size());
  EXPECT_NEAR(sum, expected, 1e-12 * expected);
  ops->sum_squares(&sum, x.data(), 0);
  EXPECT_EQ(sum, 0.0);
}

// ---- decoding ---------------------------------------------------------------

// Batch-invariant matmul_forward: a row gets the same bits alone, among 3 or
// among 130 rows (OpenBLAS's do not, for this shape: 64 x 300 measured), and
// agrees with OpenBLAS's product to rounding.
TEST_F(OpsTest, BatchInvariantMatmulGivesARowTheSameBitsInAnyBatch) {
  // Shapes off every block size: rows, outputs and the inner dimension.
  struct Shape {
    int N, IC, OC;
  };
  for (const Shape& shape : {Shape{130, 64, 300}, Shape{13, 67, 45}}) {
    const int N = shape.N, IC = shape.IC, OC = shape.OC;
    const Vec x = random_vec(static_cast<size_t>(N) * IC, 41),
              w = random_vec(static_cast<size_t>(OC) * IC, 42), b = random_vec(OC, 43);
    Vec blas(static_cast<size_t>(N) * OC), all(blas.size());
    ops->matmul_forward(act(blas), act(x), act(w), act(b), N, IC, OC);
    ops->set_batch_invariant(true);
    ops->matmul_forward(act(all), act(x), act(w), act(b), N, IC, OC);
    expect_close(all, blas, 1e-5, 1e-5, "batch-invariant vs OpenBLAS");
    for (int first : {0, 1, 5, 61, 127}) {
      for (int rows : {1, 3, 7}) {
        if (first + rows > N) continue;
        Vec some(static_cast<size_t>(rows) * OC);
        ops->matmul_forward(act(some), Act::f32(const_cast<float*>(x.data()) + first * IC), act(w),
                            act(b), rows, IC, OC);
        EXPECT_EQ(0, std::memcmp(some.data(), all.data() + static_cast<size_t>(first) * OC,
                                 some.size() * sizeof(float)))
            << rows << " row(s) from " << first << " of " << N << "x" << IC << "x" << OC;
      }
    }
    ops->set_batch_invariant(false);
  }
}

// What the backend keeps of a weight while batch-invariant (the CPU's
// packed copy) goes when the switch goes off: new values are read.
TEST_F(OpsTest, BatchInvariantMatmulReadsWeightsChangedWhileOff) {
  const int N = 3, IC = 20, OC = 70;
  const Vec x = random_vec(static_cast<size_t>(N) * IC, 71);
  Vec w = random_vec(static_cast<size_t>(OC) * IC, 72);
  Vec first(static_cast<size_t>(N) * OC), second(first.size()), expected(first.size());
  ops->set_batch_invariant(true);
  ops->matmul_forward(act(first), act(x), act(w), Act(), N, IC, OC);
  ops->set_batch_invariant(false);
  for (float& v : w) v = -2.0f * v;
  ops->matmul_forward(act(expected), act(x), act(w), Act(), N, IC, OC);
  ops->set_batch_invariant(true);
  EXPECT_TRUE(ops->batch_invariant());
  ops->matmul_forward(act(second), act(x), act(w), Act(), N, IC, OC);
  ops->set_batch_invariant(false);
  expect_close(second, expected, 1e-5, 1e-5, "after the weights changed");
  for (size_t i = 0; i < first.size(); ++i) EXPECT_FLOAT_EQ(second[i], -2.0f * first[i]) << i;
}

TEST_F(OpsTest, ScatterRowsCopiesEachRowToItsPlace) {
  const int width = 5, src_stride = 7, dst_stride = 6, P = 9;
  const std::vector<int32_t> rows = {4, 0, 8};
  const Vec src = random_vec(static_cast<size_t>(rows.size()) * src_stride, 61);
  const Vec before = random_vec(static_cast<size_t>(P) * dst_stride, 62);
  Vec dst = before;
  ops->scatter_rows(act(dst), dst_stride, act(src), src_stride, rows.data(),
                    static_cast<int>(rows.size()), width);
  for (int p = 0; p < P; ++p) {
    const auto at = std::find(rows.begin(), rows.end(), p);
    for (int j = 0; j < dst_stride; ++j) {
      const float want = at != rows.end() && j < width
                             ? src[static_cast<size_t>(at - rows.begin()) * src_stride + j]
                             : before[static_cast<size_t>(p) * dst_stride + j];
      EXPECT_EQ(dst[static_cast<size_t>(p) * dst_stride + j], want) << "row " << p << " col " << j;
    }
  }
}

// attention_listed with each row's causal prefix listed is causal attention,
// and a row's bits do not depend on the other rows or where its keys lie.
TEST_F(OpsTest, ListedAttentionIsCausalAttentionRowByRow) {
  const int H = 2, D = 8, C = H * D;
  const std::vector<int> lengths = {5, 1, 9};
  const RaggedBatch rb(lengths);
  const Ragged rows = rb.view();
  AttentionConfig cfg;
  cfg.heads = H;
  cfg.head_dim = D;
  cfg.causal = true;
  for (AttentionScale scale : {AttentionScale::kStandard, AttentionScale::kLogLength}) {
    cfg.scale = scale;
    cfg.ref_len = 4.0f;
    const int N = rows.total;
    Vec qkv = random_vec(static_cast<size_t>(N) * 3 * C, 51);
    Vec expected(static_cast<size_t>(N) * C), stats(static_cast<size_t>(N) * H);
    ops->attention_forward(act(expected), stats.data(), act(qkv), 3 * C, act(qkv) + C,
                           act(qkv) + 2 * C, 3 * C, rows, rows, cfg);
    std::vector<int32_t> starts{0}, listed;
    for (int s = 0; s < rows.batch; ++s)
      for (int i = 0; i < rows.length(s); ++i) {
        for (int j = 0; j <= i; ++j) listed.push_back(rb.offsets[s] + j);
        starts.push_back(static_cast<int32_t>(listed.size()));
      }
    KeyLists keys{starts.data(), starts.data(), listed.data(), listed.data(), N, N, 9};
    Vec out(expected.size());
    ops->attention_listed(act(out), act(qkv), 3 * C, act(qkv) + C, act(qkv) + 2 * C, 3 * C, keys,
                          cfg);
    expect_close(out, expected, 1e-5, 1e-6, "listed vs causal attention");
    // The last row alone, its keys copied elsewhere: the same bits.
    const int last = N - 1, n = 9;
    Vec q(qkv.begin() + static_cast<size_t>(last) * 3 * C,
          qkv.begin() + static_cast<size_t>(last + 1) * 3 * C);
    Vec moved(static_cast<size_t>(n + 3) * 3 * C, 7.0f);
    std::vector<int32_t> alone_rows;
    for (int j = 0; j < n; ++j) {
      std::copy_n(qkv.begin() + static_cast<size_t>(rb.offsets[2] + j) * 3 * C, 3 * C,
                  moved.begin() + static_cast<size_t>(j + 3) * 3 * C);
      alone_rows.push_back(j + 3);
    }
    const std::vector<int32_t> alone_starts = {0, n};
    KeyLists alone{alone_starts.data(),
                   alone_starts.data(),
                   alone_rows.data(),
                   alone_rows.data(),
                   1,
                   n + 3,
                   n};
    Vec one(C);
    ops->attention_listed(act(one), act(q), 3 * C, act(moved) + C, act(moved) + 2 * C, 3 * C, alone,
                          cfg);
    EXPECT_EQ(
        0, std::memcmp(one.data(), out.data() + static_cast<size_t>(last) * C, C * sizeof(float)));
  }
}

}  // namespace
}  // namespace mpiformer
