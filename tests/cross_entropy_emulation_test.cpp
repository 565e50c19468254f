// The fused cross entropy's row kernels (kernels/cuda/
// cross_entropy_kernels.cuh) run on the CPU, where no GPU is:
// tests/emulated_cuda stands in for the CUDA built-ins, its cp.async copies
// landing only at their wait, or (a second run, the same bits) at once. The reread kernel and the
// pipelined one (MPIFORMER_KERNELS=loss=pipelined) must both match label-smoothed cross entropy in
// double precision, and agree with each other: with a pad row, on GPT-2's vocabulary, on rows whose
// length leaves a tail of fewer than a vector, and (the reread kernel alone) on rows that start
// unaligned; the pipelined kernel on a grid of fewer blocks than rows, so that each block works
// through several, each row copied while the one before is worked on. fp16 and the CUDA intrinsics
// need a GPU (cuda_ops_test).
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
// The pipelined kernel's dynamic shared memory (a launch's, on a GPU): two
// rows of GPT-2's vocabulary in fp32 (which a GPU's block cannot hold: there
// the reread kernel takes them; here they test the kernel's logic).
uint4 staged_rows[2 * 50304 * 4 / 16];
}  // namespace mpiformer::cuda::cross_entropy

namespace mpiformer {
namespace {

namespace kernels = cuda::cross_entropy;

using emulated::stored;
using emulated::widened;

constexpr float kSmoothing = 0.1f, kGradScale = 0.5f;
constexpr int kPad = 0;

// Rows of V logits `stride` apart; aligned: each row starts 16-byte
// aligned (the pipelined kernel's condition), run by `blocks` blocks.
struct Case {
  int N, V, stride;
  bool aligned;
  unsigned blocks;
};

// The rows' results and the logits after the call (the gradient).
template <typename T>
struct Outcome {
  std::vector<kernels::RowResult> rows;
  std::vector<T> logits;
};

// One launch as cross_entropy.cu makes it: the reread kernel, a block of
// kThreads per row; the pipelined one, `blocks` blocks of kPipelinedThreads
// (a GPU's are its SMs), with two rows of shared memory.
template <typename T>
Outcome<T> run(bool pipelined, const Case& c, std::vector<T> logits,
               const std::vector<int32_t>& targets, unsigned blocks) {
  Outcome<T> o{std::vector<kernels::RowResult>(c.N), {}};
  const float off = static_cast<float>(kSmoothing / (c.V - 1));
  const double constant = 0.0;  // the same in both kernels; the reference leaves it out too
  auto* shared = reinterpret_cast<float*>(kernels::staged_rows);
  constexpr int kVec = 16 / sizeof(T);
  const int span = (c.V + kVec - 1) / kVec * kVec;
  if (pipelined) {
    const size_t shared_floats = 2 * span * sizeof(T) / sizeof(float);
    EXPECT_LE(shared_floats * sizeof(float), sizeof kernels::staged_rows);
    emulated::launch(dim3(blocks), kernels::kPipelinedThreads, shared, shared_floats, [&] {
      kernels::cross_entropy_pipelined_kernel<T>(logits.data(), targets.data(), o.rows.data(), c.N,
                                                 c.V, c.stride, span, 1.0f - kSmoothing, off,
                                                 constant, kPad, kGradScale, true);
    });
  } else {
    emulated::launch(dim3(c.N), kernels::kThreads, shared, 0, [&] {
      kernels::cross_entropy_kernel<T>(logits.data(), targets.data(), o.rows.data(), c.V, c.stride,
                                       1.0f - kSmoothing, off, constant, kPad, kGradScale, true);
    });
  }
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
    // Row 0's target is its largest logit; rows 2 and 3 hold their largest
    // twice, at 7 and V - 2, row 2's target the first of the two, row 3's
    // the second (which the first index must not count as correct).
    const auto at = [&](int r, int j) -> T& {
      return logits[static_cast<size_t>(r) * c.stride + j];
    };
    int largest = 0;
    for (int j = 1; j < c.V; ++j)
      if (widened(at(0, j)) > widened(at(0, largest))) largest = j;
    targets[0] = largest;
    for (int r = 2; r < 4 && r < c.N; ++r) at(r, 7) = at(r, c.V - 2) = stored<T>(20.0f);
    if (c.N > 3) targets[2] = 7, targets[3] = c.V - 2;
    const Outcome<T> reread = run(false, c, logits, targets, 0);
    for (int r = 0; r < c.N; ++r) check_row(c, r, logits, targets[r], reread);
    if (!c.aligned) return;
    const Outcome<T> pipelined = run(true, c, logits, targets, c.blocks);
    emulated::copies_land_at_issue = true;
    const Outcome<T> landed_early = run(true, c, logits, targets, c.blocks);
    emulated::copies_land_at_issue = false;
    EXPECT_EQ(0, std::memcmp(pipelined.logits.data(), landed_early.logits.data(),
                             logits.size() * sizeof(T)))
        << "the gradient depends on when the copies land";
    for (int r = 0; r < c.N; ++r) {
      EXPECT_EQ(pipelined.rows[r].loss, landed_early.rows[r].loss) << "row " << r;
      SCOPED_TRACE("pipelined");
      check_row(c, r, logits, targets[r], pipelined);
      EXPECT_NEAR(pipelined.rows[r].loss, reread.rows[r].loss, 1e-5 * std::abs(reread.rows[r].loss))
          << "row " << r;
      EXPECT_EQ(pipelined.rows[r].counted, reread.rows[r].counted) << "row " << r;
      EXPECT_EQ(pipelined.rows[r].correct, reread.rows[r].correct) << "row " << r;
    }
  }

  // Row r of an outcome against double precision.
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
    const int first_largest =
        static_cast<int>(std::max_element(x.begin(), x.end()) - x.begin());  // the first
    EXPECT_EQ(got.rows[r].correct, first_largest == target ? 1 : 0) << "row " << r;
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

// Rows 520 apart start 16-byte aligned (16-byte loads, a tail of 5), here
// 7 rows on 3 blocks of the pipelined kernel; rows 517 apart mostly do not
// (no vectors at all); GPT-2's vocabulary, 3 rows on 2 blocks.
TYPED_TEST(CrossEntropyEmulation, BothKernelsGiveTheReferenceAndAgree) {
  for (const Case& c :
       {Case{7, 517, 520, true, 3}, Case{5, 517, 517, false, 0}, Case{3, 50257, 50304, true, 2}})
    this->check(c);
}

}  // namespace
}  // namespace mpiformer
