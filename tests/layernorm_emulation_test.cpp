// The warp-per-row layer norm (kernels/cuda/layernorm_warp_kernels.cuh,
// the forward's default, layernorm=warp) run on the CPU, where no GPU is:
// tests/emulated_cuda comes first on this test's include path and stands in
// for the CUDA built-ins (threads, barriers, warp shuffles). The kernels are
// launched as layernorm_warp.cu launches them and checked against layer
// norm in double precision: out, mean, rstd, the stored residual sum (bit
// for bit), dx (= and +=), and the blocks' dgamma and dbeta partials (and
// with +=, dx_sums': the sums of dx as it came in); so is the block
// backward (layernorm_block_kernels.cuh, the default).
// Also the layout itself (kernels/layernorm_rows.h): every column held by
// one lane, every row taken by one warp. fp16 and the CUDA intrinsics need
// a GPU (cuda_ops_test).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cuda/layernorm_block_kernels.cuh"
#include "kernels/cuda/layernorm_warp_kernels.cuh"

namespace mpiformer::cuda::layernorm_warp {
// The backward's dynamic shared memory (a launch's, on a GPU).
// (kWarps, 3, sum_span) of every instance, bf16's 8 slots too.
alignas(16) float warp_shared[1 << 16];
}  // namespace mpiformer::cuda::layernorm_warp

namespace mpiformer::cuda::layernorm_block {
// The block backward's: (8 warps, 3, C) up to C 1024.
alignas(16) float accumulators[8 * 3 * 1024];
}  // namespace mpiformer::cuda::layernorm_block

namespace mpiformer {
namespace {

namespace rows = layernorm_rows;
namespace kernels = cuda::layernorm_warp;

// ---- the layout -------------------------------------------------------------

TEST(LayerNormRows, EveryColumnHeldByOneLaneWhereTheRowFits) {
  for (int vec : {4, 8}) {
    for (int C = vec; C <= 1100; C += vec) {
      const bool fits = rows::fits(C, vec);
      EXPECT_EQ(fits, (C / vec + 31) / 32 * vec <= 32) << "vec " << vec << ", C " << C;
      if (!fits) continue;
      const int slots = rows::lane_slots(C, vec);
      ASSERT_GE(slots, rows::vectors_per_lane(C, vec));
      std::vector<int> held(C, 0);
      for (int lane = 0; lane < rows::kLanes; ++lane)
        for (int i = 0; i < slots; ++i)
          if (rows::vector_of(lane, i) < rows::row_vectors(C, vec))
            for (int k = 0; k < vec; ++k) ++held[rows::vector_of(lane, i) * vec + k];
      EXPECT_TRUE(std::all_of(held.begin(), held.end(), [](int n) { return n == 1; }))
          << "vec " << vec << ", C " << C;
    }
  }
  EXPECT_TRUE(rows::fits(1024, 4));
  EXPECT_TRUE(rows::fits(1024, 8));
  EXPECT_FALSE(rows::fits(1028, 4));
  EXPECT_FALSE(rows::fits(100, 8));  // not whole vectors
}

TEST(LayerNormRows, EveryRowTakenByOneWarpOfTheBackward) {
  for (int N : {1, 31, 32, 33, 70, 1000}) {
    std::vector<int> taken(N, 0);
    for (int block = 0; block < rows::backward_blocks(N); ++block)
      for (int warp = 0; warp < rows::kWarps; ++warp) {
        int row = rows::backward_first_row(block, warp);
        for (int k = 0; k < rows::kBackwardRowsPerWarp && row < N; ++k, row += rows::kWarps)
          ++taken[row];
      }
    EXPECT_TRUE(std::all_of(taken.begin(), taken.end(), [](int n) { return n == 1; })) << N;
  }
}

// ---- the kernels, emulated -------------------------------------------------

using emulated::stored;
using emulated::widened;

template <typename T>
std::vector<T> random_stored(size_t n, float scale, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<T> x(n);
  for (T& v : x) v = stored<T>(normal(rng));
  return x;
}

// |got - want| <= rel * max |want| everywhere.
void expect_close(const std::vector<double>& got, const std::vector<double>& want, double rel,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  double largest = 0.0, worst = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    largest = std::max(largest, std::abs(want[i]));
    worst = std::max(worst, std::abs(got[i] - want[i]));
  }
  EXPECT_LE(worst, rel * largest) << what;
}

template <typename T>
std::vector<double> widened_all(const std::vector<T>& x) {
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = widened(x[i]);
  return out;
}

constexpr float kEps = 1e-5f;

// What layernorm_warp.cu launches: the forward's grid of N / kWarps blocks.
template <typename T>
void forward(int N, int C, T* sum, T* out, float* mean, float* rstd, const T* s, const T* y,
             const Dropout& d, const T* gamma, const T* beta) {
  const unsigned blocks = (N + rows::kWarps - 1) / rows::kWarps;
  kernels::with_slots(rows::lane_slots(C, cuda::kVecSize<T>), [&](auto slots) {
    emulated::launch(dim3(blocks), kernels::kThreads, kernels::warp_shared, 0, [&] {
      kernels::forward_kernel<T, decltype(slots)::value>(sum, out, mean, rstd, s, y, d, gamma, beta,
                                                         N, C, kEps);
    });
  });
}

// What layernorm_warp.cu launches: the backward keeping kSums column sums.
template <int kSums, typename T>
void backward(int N, int C, T* dx, float* partial, const T* dout, const T* x, const T* gamma,
              const float* mean, const float* rstd, bool accumulate) {
  kernels::with_slots(rows::lane_slots(C, cuda::kVecSize<T>), [&](auto slots) {
    constexpr int kSlots = decltype(slots)::value;
    const size_t shared =
        static_cast<size_t>(rows::kWarps) * kSums * kernels::sum_span<kSlots, cuda::kVecSize<T>>();
    ASSERT_LE(shared, std::size(kernels::warp_shared));
    emulated::launch(dim3(rows::backward_blocks(N)), kernels::kThreads, kernels::warp_shared,
                     shared, [&] {
                       kernels::backward_kernel<T, kSlots, kSums>(dx, partial, dout, x, gamma, mean,
                                                                  rstd, N, C, accumulate);
                     });
  });
}

// What layernorm.cu launches for the block backward (layernorm_backward=
// block, the default): 8 warps of two rows each where dgamma's and dbeta's
// accumulators fit in 48 KiB, kSums column sums. Returns the blocks.
template <int kSums, typename T>
int block_backward(int N, int C, T* dx, float* partial, const T* dout, const T* x, const T* gamma,
                   const float* mean, const float* rstd, bool accumulate) {
  const int warps = std::clamp<int>((48 << 10) / (8 * C), 1, 8), rows_per_block = 2 * warps;
  const int blocks = (N + rows_per_block - 1) / rows_per_block;
  const size_t shared = static_cast<size_t>(warps) * kSums * C;
  EXPECT_LE(shared, std::size(cuda::layernorm_block::accumulators));
  emulated::launch(dim3(blocks), 32 * warps, cuda::layernorm_block::accumulators, shared, [&] {
    cuda::layernorm_block::backward_kernel<T>(dx, partial, dout, x, gamma, mean, rstd, N, C,
                                              rows_per_block, accumulate, kSums);
  });
  return blocks;
}

// The layer norm of the rows of v in double: out, and each row's mean and
// rstd.  v, out: (N, C)
void reference_forward(const std::vector<double>& v, const std::vector<double>& gamma,
                       const std::vector<double>& beta, int N, int C, std::vector<double>& out,
                       std::vector<double>& mean, std::vector<double>& rstd) {
  out.assign(v.size(), 0.0), mean.assign(N, 0.0), rstd.assign(N, 0.0);
  for (int r = 0; r < N; ++r) {
    const double* x = v.data() + static_cast<size_t>(r) * C;
    double m = 0.0, var = 0.0;
    for (int c = 0; c < C; ++c) m += x[c] / C;
    for (int c = 0; c < C; ++c) var += (x[c] - m) * (x[c] - m) / C;
    mean[r] = m, rstd[r] = 1.0 / std::sqrt(var + kEps);
    for (int c = 0; c < C; ++c)
      out[static_cast<size_t>(r) * C + c] = (x[c] - m) * rstd[r] * gamma[c] + beta[c];
  }
}

struct Backward {
  std::vector<double> dx, dgamma, dbeta;
};

// The backward in double from the kernel's mean and rstd (dx0 added when
// accumulating).  x, dout, dx0: (N, C)
Backward reference_backward(const std::vector<double>& x, const std::vector<double>& dout,
                            const std::vector<double>& gamma, const std::vector<float>& mean,
                            const std::vector<float>& rstd, const std::vector<double>& dx0, int N,
                            int C) {
  Backward b{dx0, std::vector<double>(C, 0.0), std::vector<double>(C, 0.0)};
  for (int r = 0; r < N; ++r) {
    const size_t base = static_cast<size_t>(r) * C;
    double g_mean = 0.0, g_xhat_mean = 0.0;
    for (int c = 0; c < C; ++c) {
      const double xhat = (x[base + c] - mean[r]) * rstd[r];
      g_mean += dout[base + c] * gamma[c] / C;
      g_xhat_mean += dout[base + c] * gamma[c] * xhat / C;
    }
    for (int c = 0; c < C; ++c) {
      const double xhat = (x[base + c] - mean[r]) * rstd[r];
      b.dx[base + c] += rstd[r] * (dout[base + c] * gamma[c] - g_mean - xhat * g_xhat_mean);
      b.dgamma[c] += dout[base + c] * xhat;
      b.dbeta[c] += dout[base + c];
    }
  }
  return b;
}

template <typename T>
class LayerNormEmulation : public ::testing::Test {
 protected:
  // The rounding of T's outputs, on top of fp32's sums.
  static double tolerance() { return std::is_same_v<T, float> ? 2e-5 : 1e-2; }

  void check(int N, int C) {
    SCOPED_TRACE("N " + std::to_string(N) + ", C " + std::to_string(C));
    const size_t n = static_cast<size_t>(N) * C;
    const std::vector<T> s = random_stored<T>(n, 3.0f, rng_), y = random_stored<T>(n, 1.0f, rng_);
    const std::vector<T> gamma = random_stored<T>(C, 1.0f, rng_),
                         beta = random_stored<T>(C, 1.0f, rng_);
    std::vector<T> sum(n, stored<T>(7.0f)), out(n);
    std::vector<float> mean(N), rstd(N);
    std::vector<double> want, want_mean, want_rstd;

    // The plain forward leaves `sum` alone.
    forward(N, C, sum.data(), out.data(), mean.data(), rstd.data(), s.data(),
            static_cast<const T*>(nullptr), Dropout{}, gamma.data(), beta.data());
    reference_forward(widened_all(s), widened_all(gamma), widened_all(beta), N, C, want, want_mean,
                      want_rstd);
    expect_close(widened_all(out), want, tolerance(), "layernorm_forward out");
    expect_close(std::vector<double>(mean.begin(), mean.end()), want_mean, 2e-5, "mean");
    expect_close(std::vector<double>(rstd.begin(), rstd.end()), want_rstd, 2e-5, "rstd");
    EXPECT_TRUE(std::all_of(sum.begin(), sum.end(), [](T v) { return widened(v) == 7.0f; }));

    // With the residual: the sum stored rounded, bit for bit, and normalized as stored.
    const Dropout d{0.2f, 5, 77};
    forward(N, C, sum.data(), out.data(), mean.data(), rstd.data(), s.data(), y.data(), d,
            gamma.data(), beta.data());
    std::vector<T> want_sum(n);
    for (size_t i = 0; i < n; ++i) {
      const float kept = dropout_keep(d.seed, d.stream, i, d.p) ? widened(y[i]) * (1.0f / 0.8f) : 0;
      want_sum[i] = stored<T>(widened(s[i]) + kept);
    }
    EXPECT_EQ(widened_all(sum), widened_all(want_sum)) << "residual sum";
    reference_forward(widened_all(want_sum), widened_all(gamma), widened_all(beta), N, C, want,
                      want_mean, want_rstd);
    expect_close(widened_all(out), want, tolerance(), "residual_layernorm_forward out");
    check_backward(N, C, sum, gamma, mean, rstd);
  }

  void check_backward(int N, int C, const std::vector<T>& x, const std::vector<T>& gamma,
                      const std::vector<float>& mean, const std::vector<float>& rstd) {
    for (bool block : {false, true}) {
      SCOPED_TRACE(block ? "block backward" : "warp backward");
      for (bool accumulate : {false, true}) {
        SCOPED_TRACE(accumulate ? "dx +=" : "dx =");
        check_backward<2>(N, C, x, gamma, mean, rstd, accumulate, block);
      }
      SCOPED_TRACE("dx += with dx_sums");
      check_backward<3>(N, C, x, gamma, mean, rstd, true, block);
    }
  }

  // The block backward alone on rows the warp kernels do not take, from
  // mean and rstd in double.
  void check_block_backward(int N, int C) {
    SCOPED_TRACE("N " + std::to_string(N) + ", C " + std::to_string(C));
    const size_t n = static_cast<size_t>(N) * C;
    const std::vector<T> x = random_stored<T>(n, 3.0f, rng_),
                         gamma = random_stored<T>(C, 1.0f, rng_);
    std::vector<double> out, mean64, rstd64;
    reference_forward(widened_all(x), widened_all(gamma), std::vector<double>(C, 0.0), N, C, out,
                      mean64, rstd64);
    const std::vector<float> mean(mean64.begin(), mean64.end()), rstd(rstd64.begin(), rstd64.end());
    for (bool accumulate : {false, true}) {
      SCOPED_TRACE(accumulate ? "dx +=" : "dx =");
      check_backward<2>(N, C, x, gamma, mean, rstd, accumulate, true);
    }
    SCOPED_TRACE("dx += with dx_sums");
    check_backward<3>(N, C, x, gamma, mean, rstd, true, true);
  }

  // The warp or block backward keeping kSums column sums: its blocks'
  // partials, (blocks, kSums, C), and how many blocks.
  template <int kSums>
  int run_backward(bool block, int N, int C, std::vector<T>& dx, std::vector<float>& partial,
                   const std::vector<T>& dout, const std::vector<T>& x, const std::vector<T>& gamma,
                   const std::vector<float>& mean, const std::vector<float>& rstd,
                   bool accumulate) {
    partial.assign(static_cast<size_t>(N) * kSums * C, NAN);  // at most a block a row
    if (block)
      return block_backward<kSums>(N, C, dx.data(), partial.data(), dout.data(), x.data(),
                                   gamma.data(), mean.data(), rstd.data(), accumulate);
    backward<kSums>(N, C, dx.data(), partial.data(), dout.data(), x.data(), gamma.data(),
                    mean.data(), rstd.data(), accumulate);
    return rows::backward_blocks(N);
  }

  // The backward keeping kSums column sums (3: dx_sums too) against double
  // precision: dx, and each sum over the blocks' partials. The same dx,
  // bit for bit, whatever the sums kept.
  template <int kSums>
  void check_backward(int N, int C, const std::vector<T>& x, const std::vector<T>& gamma,
                      const std::vector<float>& mean, const std::vector<float>& rstd,
                      bool accumulate, bool block) {
    const size_t n = static_cast<size_t>(N) * C;
    const std::vector<T> dout = random_stored<T>(n, 1.0f, rng_),
                         dx_in = random_stored<T>(n, 1.0f, rng_);
    const std::vector<double> dx0 = accumulate ? widened_all(dx_in) : std::vector<double>(n, 0.0);
    std::vector<T> dx = dx_in;
    std::vector<float> partial;
    const int blocks =
        run_backward<kSums>(block, N, C, dx, partial, dout, x, gamma, mean, rstd, accumulate);
    const Backward want = reference_backward(widened_all(x), widened_all(dout), widened_all(gamma),
                                             mean, rstd, dx0, N, C);
    expect_close(widened_all(dx), want.dx, tolerance(), "dx");
    std::vector<std::vector<double>> sums(kSums, std::vector<double>(C, 0.0));
    for (int b = 0; b < blocks; ++b)
      for (int j = 0; j < kSums; ++j)
        for (int c = 0; c < C; ++c)
          sums[j][c] += partial[(static_cast<size_t>(b) * kSums + j) * C + c];
    expect_close(sums[0], want.dgamma, 2e-5, "dgamma");
    expect_close(sums[1], want.dbeta, 2e-5, "dbeta");
    if constexpr (kSums == 3) {
      std::vector<double> want_dx_sums(C, 0.0);
      for (size_t i = 0; i < n; ++i) want_dx_sums[i % C] += dx0[i];
      expect_close(sums[2], want_dx_sums, 2e-5, "dx_sums");
      std::vector<T> dx_two = dx_in;
      run_backward<2>(block, N, C, dx_two, partial, dout, x, gamma, mean, rstd, accumulate);
      EXPECT_EQ(0, std::memcmp(dx.data(), dx_two.data(), n * sizeof(T))) << "dx with dx_sums";
    }
  }

  std::mt19937 rng_{5};
};

using Types = ::testing::Types<float, __nv_bfloat16>;
TYPED_TEST_SUITE(LayerNormEmulation, Types);

// dgamma and dbeta (and dx_sums, where kept) from 300 blocks' partials
// (the warp path's 16 loads in flight twice over, then a tail) of 100
// columns (the last block of columns part full), added to what they held:
// the documented order, bit for bit, with 16 loads in flight and with the
// block path's 1.
TEST(LayerNormParamGrads, AddsThePartialsInOneOrderHoweverManyLoadsInFlight) {
  constexpr int kBlocks = 300, C = 100;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int count : {2, 3}) {
    SCOPED_TRACE(std::to_string(count) + " sums");
    std::vector<float> partial(static_cast<size_t>(kBlocks) * count * C);
    for (float& p : partial) p = normal(rng);
    std::vector<float> grads(count * C);  // dgamma, dbeta, then dx_sums
    for (float& g : grads) g = normal(rng);
    std::vector<float> want = grads;
    for (int c = 0; c < count * C; ++c) {
      float row_sums[kernels::kParamRows] = {};
      for (int y = 0; y < kernels::kParamRows; ++y)
        for (int b = y; b < kBlocks; b += kernels::kParamRows)
          row_sums[y] += partial[static_cast<size_t>(b) * count * C + c];
      float total = 0.0f;
      for (float s : row_sums) total += s;
      want[c] += total;
    }
    const unsigned column_blocks =
        (count * C + kernels::kParamColumns - 1) / kernels::kParamColumns;
    const auto run = [&](auto in_flight) {
      std::vector<float> got = grads;
      const rows::Sums sums{got.data(), got.data() + C, count == 3 ? got.data() + 2 * C : nullptr};
      emulated::launch(dim3(column_blocks), kernels::kParamThreads, nullptr, 0, [&] {
        kernels::param_grads_kernel<decltype(in_flight)::value>(sums, partial.data(), kBlocks, C);
      });
      EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)))
          << decltype(in_flight)::value << " loads in flight";
    };
    run(std::integral_constant<int, kernels::kParamLoadsInFlight>{});
    run(std::integral_constant<int, 1>{});
  }
}

// The backward's L2 hint for the next row's dx: the 32 lanes ask for
// every 128-byte line the row touches, once, and for no other, whether
// the row starts on a line or 16 to 112 bytes into one, and for rows of
// more lines than lanes (fp32 4096: 128).
TEST(LayerNormPrefetch, AsksForEveryLineOfTheRowOnce) {
  constexpr uintptr_t kLine = 128;
  alignas(128) static float buffer[3 * 4096 + 64];
  std::vector<uintptr_t> asked;
  emulated::prefetched = &asked;
  for (int C : {4, 96, 384, 768, 4096}) {
    for (int offset : {0, 4, 12, 28}) {  // floats: 0, 16, 48 and 112 bytes
      for (int r : {0, 2}) {
        asked.clear();
        for (int lane = 0; lane < rows::kLanes; ++lane)
          kernels::prefetch_row_l2(buffer + offset, r, C, lane);
        const auto begin = reinterpret_cast<uintptr_t>(buffer + offset + r * C);
        const auto end = begin + C * sizeof(float);
        std::vector<uintptr_t> want;
        for (uintptr_t line = begin / kLine * kLine; line < end; line += kLine)
          want.push_back(line);
        std::sort(asked.begin(), asked.end());
        EXPECT_EQ(asked, want) << "C " << C << ", offset " << offset << ", row " << r;
      }
    }
  }
  emulated::prefetched = nullptr;
}

// 70 rows: a forward's last block of 6 rows, a backward's of 6. Lanes hold
// 1 vector (fp32 C 96, bf16 C 64: some lanes none), 3 (bf16 768), 4 (bf16
// 1024), 6 (fp32 768), 8 (fp32 1024).
TYPED_TEST(LayerNormEmulation, AgainstDoublePrecision) {
  const bool fp32 = std::is_same_v<TypeParam, float>;
  for (int C : {fp32 ? 96 : 64, 768, 1024}) this->check(70, C);
}

// The block backward on rows the warp kernels leave to it: C 102 (not a
// multiple of 4: every column in its scalar loop) and 1040 (past 1024: 5
// warps a block, their accumulators within 48 KiB).
TYPED_TEST(LayerNormEmulation, BlockBackwardOfOtherWidths) {
  for (int C : {102, 1040}) this->check_block_backward(45, C);
}

}  // namespace
}  // namespace mpiformer
