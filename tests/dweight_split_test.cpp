// The weight gradient's split along the tokens without a GPU
// (kernels/dweight_split.h): the split each shape takes, that its parts and
// tail cover every token once, and the order the parts are added in, by
// the adding kernel (kernels/cuda/dweight_split_kernels.cuh) run under
// emulation.
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/dweight_split_kernels.cuh"

namespace mpiformer {
namespace {

namespace split = dweight_split;

std::string shape(int N, int IC, int OC, int ld) {
  return "N " + std::to_string(N) + ", IC " + std::to_string(IC) + ", OC " + std::to_string(OC) +
         ", ld " + std::to_string(ld);
}

TEST(DWeightSplit, GPT2SmallsShapes) {
  // B32's 32,768 tokens: the projection, QKV, the MLP's two, the LM head.
  EXPECT_EQ(split::split_for(32768, 768, 768, 768).parts, 16);
  EXPECT_EQ(split::split_for(32768, 768, 768, 768).rows, 2048);
  EXPECT_EQ(split::split_for(32768, 768, 2304, 2304).parts, 8);
  EXPECT_EQ(split::split_for(32768, 768, 3072, 3072).parts, 4);
  EXPECT_EQ(split::split_for(32768, 3072, 768, 768).parts, 4);
  EXPECT_EQ(split::split_for(10672, 768, 50256, 50304).parts, 1);  // enough tiles already
  // B8's 8,192: each part keeps 2,048 tokens at the least.
  EXPECT_EQ(split::split_for(8192, 768, 768, 768).parts, 4);
  // Short micro-batches take the whole GEMM, as without the switch.
  EXPECT_EQ(split::split_for(4095, 768, 768, 768).parts, 1);
  EXPECT_EQ(split::split_for(4095, 768, 768, 768).rows, 4095);
}

TEST(DWeightSplit, PartsAndTailCoverEveryTokenOnce) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 2000; ++trial) {
    const int N = std::uniform_int_distribution<int>(1, 70000)(rng);
    const int IC = std::uniform_int_distribution<int>(1, 4096)(rng);
    const int OC = std::uniform_int_distribution<int>(1, 4096)(rng);
    const int ld = OC + std::uniform_int_distribution<int>(0, 64)(rng);
    const split::Split s = split::split_for(N, IC, OC, ld);
    SCOPED_TRACE(shape(N, IC, OC, ld));
    ASSERT_GE(s.parts, 1);
    ASSERT_LE(s.parts, split::kMaxParts);
    EXPECT_EQ(s.parts & (s.parts - 1), 0) << "a power of two";
    if (s.parts == 1) {
      EXPECT_EQ(s.rows, N);
      continue;
    }
    EXPECT_GE(s.rows, split::kMinRows);
    // Tokens [p * rows, (p + 1) * rows) in part p, the tail after them.
    const long long covered = static_cast<long long>(s.parts) * s.rows;
    EXPECT_LE(covered, N);
    EXPECT_LT(N - covered, s.parts) << "the tail is fewer tokens than the parts";
    // No more parts than the tiles need: half as many would fall short.
    const long long tiles = static_cast<long long>((IC + 127) / 128) * ((OC + 127) / 128);
    EXPECT_LT(tiles * (s.parts / 2), split::kTargetTiles);
  }
}

TEST(DWeightSplit, NoSplitWhereTheStridesWouldNotFitAnInt) {
  // One tile wants 16 parts; 4,096 rows of 2^20 elements overflow an int.
  EXPECT_EQ(split::split_for(65536, 64, 64, 64).parts, 16);
  EXPECT_EQ(split::split_for(65536, 64, 64, 1 << 20).parts, 1);
  EXPECT_EQ(split::split_for(65536, 64, 64, 1 << 20).rows, 65536);
}

// The parts are added part 0 first, their sum then into dW; floats where
// that order shows: 1e8 + 1 - 1e8 is 0 in fp32, (1e8 - 1e8) + 1 is 1.
TEST(DWeightSplit, PartsAddedInOrderThenIntoTheGradient) {
  const size_t count = 2;
  const float partial[] = {1e8f, 0.0f, 1.0f, 0.0f, -1e8f, 0.0f};  // (3 parts, 2)
  EXPECT_EQ(split::add_parts(5.0f, partial, count, 3, 0), 5.0f);  // ((1e8 + 1) - 1e8) = 0
  EXPECT_EQ(split::add_parts(5.0f, partial, count, 1, 0), 5.0f + 1e8f);
  EXPECT_EQ(split::add_parts(0.5f, partial, count, 3, 1), 0.5f);
}

// The kernel as matmul.cu launches it gives add_parts' bits for every
// element, whatever the grid, with the parts `stride` apart (dW's count,
// or the bias gradients' padded stride) and the padding never read.
TEST(DWeightSplit, TheKernelAddsEachElementsParts) {
  std::mt19937 rng(4);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const size_t count = 5000;
  for (const size_t stride : {count, split::bias_stride(static_cast<int>(count))}) {
    for (int parts : {2, 3, 16}) {
      std::vector<float> partial(stride * parts, std::nanf("")), dweight(count), want(count);
      for (int p = 0; p < parts; ++p)
        for (size_t i = 0; i < count; ++i) partial[p * stride + i] = normal(rng);
      for (float& v : dweight) v = normal(rng);
      for (size_t i = 0; i < count; ++i)
        want[i] = split::add_parts(dweight[i], partial.data(), stride, parts, i);
      emulated::launch(dim3(3), 256, nullptr, 0, [&] {
        cuda::add_split_parts_kernel(dweight.data(), partial.data(), count, stride, parts);
      });
      EXPECT_EQ(dweight, want) << parts << " parts, stride " << stride;
      for (float v : dweight) ASSERT_FALSE(std::isnan(v)) << "padding read, stride " << stride;
    }
  }
}

// Each part's bias gradient starts 256 bytes after the last whatever OC
// (GPT-2's vocabulary tail of 1, a classifier's 10 classes).
TEST(DWeightSplit, BiasPartsStay256BytesAligned) {
  for (int OC : {1, 10, 64, 65, 768, 3072, 50257}) {
    const size_t stride = split::bias_stride(OC);
    EXPECT_GE(stride, static_cast<size_t>(OC));
    EXPECT_LT(stride, static_cast<size_t>(OC) + 64);
    EXPECT_EQ(stride * sizeof(float) % 256, 0u) << OC;
  }
}

}  // namespace
}  // namespace mpiformer
