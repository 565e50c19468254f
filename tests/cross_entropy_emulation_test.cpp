// The fused cross entropy's row kernels (kernels/cuda/
// cross_entropy_kernels.cuh) run on the CPU, where no GPU is:
// tests/emulated_cuda stands in for the CUDA built-ins. The staged kernel
// (MPIFORMER_KERNELS=loss=staged) must give the reread kernel's bits, row
// results and gradient alike, and both must match label-smoothed cross
// entropy in double precision: on rows that start 16-byte aligned and rows
// that do not, with a pad row, on GPT-2's vocabulary. fp16 and the CUDA
// intrinsics need a GPU (cuda_ops_test).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cuda/cross_entropy_kernels.cuh"

namespace mpiformer::cuda::cross_entropy {
// The staged kernel's dynamic shared memory (a launch's, on a GPU).
uint4 staged_row[1 << 14];
}  // namespace mpiformer::cuda::cross_entropy

namespace mpiformer {
namespace {

namespace kernels = cuda::cross_entropy;

using emulated::stored;
using emulated::widened;

constexpr float kSmoothing = 0.1f, kGradScale = 0.5f;
constexpr int kPad = 0;

struct Case {
  int N, V, stride;
};

// The rows' results and the logits after the call (the gradient).
template <typename T>
struct Outcome {
  std::vector<kernels::RowResult> rows;
  std::vector<T> logits;
};

// One launch as cross_entropy.cu makes it: a block of kThreads per row.
template <typename T>
Outcome<T> run(bool staged, const Case& c, std::vector<T> logits,
               const std::vector<int32_t>& targets) {
  Outcome<T> o{std::vector<kernels::RowResult>(c.N), {}};
  const float off = static_cast<float>(kSmoothing / (c.V - 1));
  const double constant = 0.0;  // the same in both kernels; the reference leaves it out too
  auto* shared = reinterpret_cast<float*>(kernels::staged_row);
  const size_t shared_floats = staged ? (c.V * sizeof(T) + 15) / 16 * 4 : 0;
  emulated::launch(dim3(c.N), kernels::kThreads, shared, shared_floats, [&] {
    auto* kernel =
        staged ? kernels::cross_entropy_staged_kernel<T> : kernels::cross_entropy_kernel<T>;
    kernel(logits.data(), targets.data(), o.rows.data(), c.V, c.stride, 1.0f - kSmoothing, off,
           constant, kPad, kGradScale, true);
  });
  o.logits = std::move(logits);
  return o;
}

// Label-smoothed cross entropy of one row in double (without the constant
// term), and its gradient scaled by kGradScale.  x: (V)
double reference_row(const std::vector<double>& x, int target, std::vector<double>& grad) {
  const int V = static_cast<int>(x.size());
  const double top = *std::max_element(x.begin(), x.end());
  double sum_exp = 0.0, sum = 0.0;
  for (double v : x) sum_exp += std::exp(v - top), sum += v;
  const double lse = top + std::log(sum_exp), off = kSmoothing / (V - 1.0);
  grad.resize(V);
  for (int j = 0; j < V; ++j)
    grad[j] = (std::exp(x[j] - lse) - (j == target ? 1.0 - kSmoothing : off)) * kGradScale;
  return lse - (1.0 - kSmoothing) * x[target] - off * (sum - x[target]);
}

template <typename T>
class CrossEntropyEmulation : public ::testing::Test {
 protected:
  void check(const Case& c) {
    SCOPED_TRACE("N " + std::to_string(c.N) + ", V " + std::to_string(c.V) + ", stride " +
                 std::to_string(c.stride));
    std::normal_distribution<float> normal(0.0f, 2.0f);
    std::vector<T> logits(static_cast<size_t>(c.N) * c.stride);
    for (T& x : logits) x = stored<T>(normal(rng_));
    std::vector<int32_t> targets(c.N);
    for (int32_t& t : targets) t = std::uniform_int_distribution<int>(1, c.V - 1)(rng_);
    targets[1] = kPad;
    const Outcome<T> reread = run(false, c, logits, targets);
    const Outcome<T> staged = run(true, c, logits, targets);
    EXPECT_EQ(0, std::memcmp(reread.logits.data(), staged.logits.data(), logits.size() * sizeof(T)))
        << "the staged gradient differs from the reread kernel's";
    for (int r = 0; r < c.N; ++r) {
      EXPECT_EQ(reread.rows[r].loss, staged.rows[r].loss) << "row " << r;
      EXPECT_EQ(reread.rows[r].nll, staged.rows[r].nll) << "row " << r;
      EXPECT_EQ(reread.rows[r].counted, staged.rows[r].counted) << "row " << r;
      EXPECT_EQ(reread.rows[r].correct, staged.rows[r].correct) << "row " << r;
      check_row(c, r, logits, targets[r], staged);
    }
  }

  // Row r of the staged outcome against double precision.
  void check_row(const Case& c, int r, const std::vector<T>& logits, int target,
                 const Outcome<T>& got) {
    const size_t base = static_cast<size_t>(r) * c.stride;
    if (target == kPad) {
      EXPECT_EQ(got.rows[r].counted, 0);
      for (int j = 0; j < c.V; ++j) ASSERT_EQ(widened(got.logits[base + j]), 0.0) << j;
      return;
    }
    std::vector<double> x(c.V), grad;
    for (int j = 0; j < c.V; ++j) x[j] = widened(logits[base + j]);
    const double loss = reference_row(x, target, grad);
    EXPECT_NEAR(got.rows[r].loss, loss, 1e-4 * std::abs(loss)) << "row " << r;
    const double rounding = std::is_same_v<T, float> ? 1e-6 : 4e-3;
    double worst = 0.0;
    for (int j = 0; j < c.V; ++j)
      worst = std::max(worst, std::abs(widened(got.logits[base + j]) - grad[j]));
    EXPECT_LE(worst, rounding) << "row " << r << ": the gradient";
    // The pad column past V is never written.
    for (int j = c.V; j < c.stride; ++j)
      ASSERT_EQ(widened(got.logits[base + j]), widened(logits[base + j])) << j;
  }

  std::mt19937 rng_{9};
};

using Types = ::testing::Types<float, __nv_bfloat16>;
TYPED_TEST_SUITE(CrossEntropyEmulation, Types);

// Rows 520 apart start 16-byte aligned (16-byte loads, a tail of 5); rows
// 517 apart mostly do not (no vectors at all); GPT-2's vocabulary is the
// staged row the GPU will hold (98 KiB in bf16).
TYPED_TEST(CrossEntropyEmulation, StagedGivesTheRereadBitsAndBothTheReference) {
  for (const Case& c : {Case{5, 517, 520}, Case{5, 517, 517}, Case{3, 50257, 50304}})
    this->check(c);
}

}  // namespace
}  // namespace mpiformer
