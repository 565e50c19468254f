// Decoding attention's kernel (kernels/cuda/attention_listed_kernels.cuh)
// run on the CPU, where no GPU is: tests/emulated_cuda stands in for the
// CUDA built-ins. Lists of 0 to 12,050 keys, taken in one pass or in
// chunks (the kernel's own, 11,000 keys at head size 32, and 64), against
// attention in double precision; the scores rise along the longest list,
// so each chunk finds a larger largest score and rescales the sums so far.
// fp16 and the CUDA intrinsics need a GPU (cuda_ops_test).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/attention_listed_kernels.cuh"

namespace mpiformer::cuda::attention_listed {
// The kernel's dynamic shared memory (a launch's, on a GPU).
float listed_shared[kSharedFloats];
}  // namespace mpiformer::cuda::attention_listed

namespace mpiformer {
namespace {

using emulated::stored;
using emulated::widened;
namespace kernels = cuda::attention_listed;

constexpr int H = 2, D = 32, C = H * D;
constexpr int kCacheRows = 12100;

TEST(AttentionListedChunks, AChunkIsWhatSharedMemoryLeavesUpTo11000Keys) {
  EXPECT_EQ(kernels::chunk_for(32), kernels::kMaxChunk);
  EXPECT_EQ(kernels::chunk_for(1256), kernels::kMaxChunk);
  EXPECT_EQ(kernels::chunk_for(2048), kernels::kSharedFloats - 32 - 2048);
  EXPECT_EQ(kernels::chunk_for(kernels::kSharedFloats - 33), 1);
  EXPECT_EQ(kernels::chunk_for(kernels::kSharedFloats - 32), 0);
  for (int d : {8, 64, 128, 1024, 4096}) {
    EXPECT_LE((32 + d + kernels::chunk_for(d)) * sizeof(float), 48u * 1024) << "head size " << d;
  }
}

template <typename T>
class AttentionListedEmulation : public ::testing::Test {
 protected:
  void SetUp() override {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    q_.resize(static_cast<size_t>(kLengths.size()) * C);
    for (T& x : q_) x = stored<T>(normal(rng_));
    // Cache row p's keys grow with p: along the longest list (rows in
    // order) the scores rise.
    kv_.resize(static_cast<size_t>(kCacheRows) * 2 * C);
    for (int p = 0; p < kCacheRows; ++p) {
      const float growth = 1.0f + 3.0f * p / kCacheRows;
      for (int c = 0; c < 2 * C; ++c)
        kv_[static_cast<size_t>(p) * 2 * C + c] = stored<T>(normal(rng_) * (c < C ? growth : 1.0f));
    }
    starts_ = {0};
    for (const int n : kLengths) {
      for (int j = 0; j < n; ++j) rows_.push_back(n > 1000 ? j : (j * 37 + n) % kCacheRows);
      starts_.push_back(static_cast<int32_t>(rows_.size()));
    }
  }

  // out: (R, C) of one launch as attention_listed.cu makes it.
  std::vector<T> run(int chunk, AttentionScale scale) {
    const int R = static_cast<int>(kLengths.size());
    std::vector<T> out(static_cast<size_t>(R) * C, stored<T>(7.0f));
    const int longest = *std::max_element(kLengths.begin(), kLengths.end());
    const int shared = kernels::shared_floats(D, longest, chunk);
    // Past the launch's shared memory: a sentinel that must stay.
    float* past = kernels::listed_shared + shared;
    std::fill(past, kernels::listed_shared + kernels::kSharedFloats, -3.0f);
    emulated::launch(dim3(R * H), kernels::kThreads, kernels::listed_shared, shared, [&] {
      kernels::attention_listed_kernel<T>(out.data(), q_.data(), C, kv_.data(), kv_.data() + C,
                                          2 * C, starts_.data(), rows_.data(), H, D, scale, 512.0f,
                                          chunk);
    });
    EXPECT_TRUE(std::all_of(past, kernels::listed_shared + kernels::kSharedFloats,
                            [](float x) { return x == -3.0f; }))
        << "a write past the launch's shared memory (chunk " << chunk << ")";
    return out;
  }

  // Row r, head h in double: softmax of the scaled scores over the listed
  // keys, then their values' mean under it.  out: (D)
  std::vector<double> reference(int r, int h, AttentionScale scale) const {
    const int first = starts_[r], n = starts_[r + 1] - first;
    std::vector<double> out(D, 0.0);
    if (n == 0) return out;
    const double s = attention_scale(scale, D, 512.0f, n);
    std::vector<double> scores(n);
    for (int j = 0; j < n; ++j) {
      const size_t key = static_cast<size_t>(rows_[first + j]) * 2 * C + h * D;
      double dot = 0.0;
      for (int d = 0; d < D; ++d)
        dot += widened(q_[static_cast<size_t>(r) * C + h * D + d]) * widened(kv_[key + d]);
      scores[j] = dot * s;
    }
    const double top = *std::max_element(scores.begin(), scores.end());
    double sum = 0.0;
    for (double& x : scores) sum += (x = std::exp(x - top));
    for (int j = 0; j < n; ++j) {
      const size_t value = static_cast<size_t>(rows_[first + j]) * 2 * C + C + h * D;
      for (int d = 0; d < D; ++d) out[d] += scores[j] / sum * widened(kv_[value + d]);
    }
    return out;
  }

  void check(const std::vector<T>& got, AttentionScale scale, const std::string& what) {
    const double rounding = std::is_same_v<T, float> ? 0.0 : 1.0 / 256;
    for (size_t r = 0; r < kLengths.size(); ++r) {
      for (int h = 0; h < H; ++h) {
        const std::vector<double> want = reference(static_cast<int>(r), h, scale);
        double worst = 0.0, allowed = 0.0;
        for (int d = 0; d < D; ++d) {
          const double g = widened(got[r * C + h * D + d]);
          worst = std::max(worst, std::abs(g - want[d]));
          allowed = std::max(allowed, 2e-5 + rounding * std::abs(want[d]));
        }
        EXPECT_LE(worst, allowed) << what << ": list of " << kLengths[r] << " keys, head " << h;
      }
    }
  }

  // Empty, one key, chunk 64's edges, and longer than one chunk of 11,000.
  const std::vector<int> kLengths = {0, 1, 7, 64, 65, 300, 12050};
  std::mt19937 rng_{11};
  std::vector<T> q_, kv_;  // (R, C); (kCacheRows, 2C): k then v
  std::vector<int32_t> starts_, rows_;
};

using Types = ::testing::Types<float, __nv_bfloat16>;
TYPED_TEST_SUITE(AttentionListedEmulation, Types);

TYPED_TEST(AttentionListedEmulation, ChunkedListsMatchDoublePrecision) {
  for (AttentionScale scale : {AttentionScale::kStandard, AttentionScale::kLogLength}) {
    const std::string name = scale == AttentionScale::kStandard ? "standard" : "log-length";
    const auto own = this->run(kernels::chunk_for(D), scale);
    this->check(own, scale, name + ", chunks of " + std::to_string(kernels::chunk_for(D)));
    const auto small = this->run(64, scale);
    this->check(small, scale, name + ", chunks of 64");
    // A list within a chunk takes one pass, whatever the chunk: the same
    // bits. (They are the single-pass kernel's, the one before chunks, by
    // construction: the first chunk's sums are its sums.)
    for (size_t r = 0; r + 1 < this->kLengths.size() && this->kLengths[r] <= 64; ++r) {
      EXPECT_EQ(0, std::memcmp(&own[r * C], &small[r * C], C * sizeof(TypeParam)))
          << name << ": list of " << this->kLengths[r] << " keys";
    }
  }
}

}  // namespace
}  // namespace mpiformer
