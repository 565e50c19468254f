// AdamW's two kernels (kernels/cuda/adamw_kernels.cuh: ranged, the older
// path, MPIFORMER_KERNELS=adamw=ranged, and vector, the default) run on the
// CPU, where no GPU is: tests/emulated_cuda comes first on this test's
// include path and stands in for the CUDA built-ins. On ranges whose ends fall anywhere in a
// float4 (and ranges shorter than one), the vector kernel leaves bitwise the
// ranged kernel's parameters, moments and compute copy, and both match
// AdamW in double precision. fp16 and the CUDA intrinsics need a GPU
// (cuda_ops_test).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cuda/adamw_kernels.cuh"

namespace mpiformer {
namespace {

using emulated::stored;
using emulated::widened;
namespace adamw = cuda::adamw;

constexpr int kThreads = 64;  // adamw.cu launches 256; fewer keep the emulation quick

// Ends at every remainder mod 4, a range inside one float4, one of a single
// element and an empty one.
const std::vector<AdamWRange> kRanges = {{0, 1001, 0.01f},   {1001, 1003, 0.0f},
                                         {1003, 1004, 0.1f}, {1004, 1004, 0.1f},
                                         {1004, 2602, 0.0f}, {2602, 4099, 0.05f}};
constexpr size_t kCount = 4099;

template <typename T>
struct Buffers {
  std::vector<float> params, grads, m, v;
  std::vector<T> compute;
};

template <typename T>
Buffers<T> initial(std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Buffers<T> b;
  for (auto* x : {&b.params, &b.grads, &b.m, &b.v}) {
    x->resize(kCount);
    for (float& e : *x) e = normal(rng);
  }
  for (float& e : b.v) e = std::abs(e) * 0.01f;
  b.compute.assign(kCount, stored<T>(0.0f));
  return b;
}

adamw::Step step_of() {
  const double t = 3.0, beta1 = 0.9, beta2 = 0.999;
  return adamw::Step{1e-3f,
                     0.9f,
                     0.999f,
                     1e-8f,
                     static_cast<float>(1.0 / (1.0 - std::pow(beta1, t))),
                     static_cast<float>(1.0 / (1.0 - std::pow(beta2, t))),
                     0.5f,
                     10.0f};
}

// The buffers after one update by the vector or the ranged kernel.
template <typename T>
Buffers<T> run(bool vector, Buffers<T> b, double grad_norm_sq) {
  const adamw::Step s = step_of();
  T* compute = std::is_same_v<T, float> ? nullptr : b.compute.data();
  emulated::launch(dim3(static_cast<unsigned>(kRanges.size())), kThreads, nullptr, 0, [&] {
    if (vector)
      adamw::vector_kernel<T>(b.params.data(), b.grads.data(), b.m.data(), b.v.data(), compute,
                              kRanges.data(), s, &grad_norm_sq);
    else
      adamw::ranged_kernel<T>(b.params.data(), b.grads.data(), b.m.data(), b.v.data(), compute,
                              kRanges.data(), s, &grad_norm_sq);
  });
  return b;
}

template <typename T>
class AdamWEmulation : public ::testing::Test {};
using Types = ::testing::Types<float, __nv_bfloat16>;
TYPED_TEST_SUITE(AdamWEmulation, Types);

TYPED_TEST(AdamWEmulation, VectorGivesTheRangedBitsAndBothAdamW) {
  using T = TypeParam;
  std::mt19937 rng(4);
  const Buffers<T> before = initial<T>(rng);
  for (double grad_norm_sq : {1.0, 1e6}) {  // a norm of 1 / 2, and one clipped to 10
    SCOPED_TRACE("squared norm " + std::to_string(grad_norm_sq));
    const Buffers<T> ranged = run<T>(false, before, grad_norm_sq);
    const Buffers<T> vector = run<T>(true, before, grad_norm_sq);
    EXPECT_EQ(0, std::memcmp(ranged.params.data(), vector.params.data(), kCount * 4));
    EXPECT_EQ(0, std::memcmp(ranged.m.data(), vector.m.data(), kCount * 4));
    EXPECT_EQ(0, std::memcmp(ranged.v.data(), vector.v.data(), kCount * 4));
    EXPECT_EQ(0, std::memcmp(ranged.compute.data(), vector.compute.data(), kCount * sizeof(T)));

    // AdamW in double, element by element, with each range's decay.
    const adamw::Step s = step_of();
    const double norm = std::sqrt(grad_norm_sq) * s.inv_loss_scale;
    const double scale = (norm > s.max_norm ? s.max_norm / (norm + 1e-6) : 1.0) * s.inv_loss_scale;
    int wrong = 0;
    for (const AdamWRange& r : kRanges) {
      for (size_t i = r.begin; i < r.end; ++i) {
        const double g = before.grads[i] * scale;
        const double m = 0.9 * before.m[i] + 0.1 * g, v = 0.999 * before.v[i] + 0.001 * g * g;
        const double p =
            before.params[i] - 1e-3 * (m * s.inv_bias1 / (std::sqrt(v * s.inv_bias2) + 1e-8) +
                                       r.weight_decay * before.params[i]);
        // m's two terms may nearly cancel: its rounding is theirs.
        const double m_terms = std::abs(before.m[i]) + std::abs(g);
        const bool close = std::abs(vector.params[i] - p) <= 1e-6 * (1.0 + std::abs(p)) &&
                           std::abs(vector.m[i] - m) <= 1e-6 * m_terms;
        const bool copied = std::is_same_v<T, float> ||
                            widened(vector.compute[i]) == widened(stored<T>(vector.params[i]));
        if ((!close || !copied) && ++wrong <= 3)
          ADD_FAILURE() << "element " << i << ": " << vector.params[i] << ", not " << p << "; m "
                        << vector.m[i] << ", not " << m << (copied ? "" : "; compute copy differs");
      }
    }
    EXPECT_EQ(wrong, 0);
  }
}

TEST(AdamWEmulation, TheVectorBodyIsWholeFloat4sInsideTheRange) {
  for (size_t begin = 0; begin < 9; ++begin) {
    for (size_t end = begin; end < 18; ++end) {
      size_t body_begin = 0, body_end = 0;
      adamw::vector_body(AdamWRange{begin, end, 0.0f}, &body_begin, &body_end);
      SCOPED_TRACE(std::to_string(begin) + ".." + std::to_string(end));
      EXPECT_TRUE(begin <= body_begin && body_begin <= body_end && body_end <= end);
      EXPECT_LT(body_begin - begin, 4u);
      const size_t whole = end / 4 > (begin + 3) / 4 ? end / 4 - (begin + 3) / 4 : 0;
      EXPECT_EQ(body_end - body_begin, 4 * whole);
      if (whole > 0) {
        EXPECT_EQ(body_begin % 4, 0u);
        EXPECT_LT(end - body_end, 4u);
      }
    }
  }
}

}  // namespace
}  // namespace mpiformer
