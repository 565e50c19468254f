// The bias gradients' column sums (kernels/cuda/column_sums_kernels.cuh)
// without a GPU, the kernels run under emulation: each column's tokens in
// order within a block of rows, then the blocks in order, so a thread that
// loads 16 bytes of columns at once gives the bits of one that loads an
// element; every column summed once, rows `ld` apart, added into dst.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cuda/column_sums_kernels.cuh"

namespace mpiformer {
namespace {

namespace sums = cuda::column_sums;

// dst + the column sums of src (N, C) rows ld apart, by the kernels with
// `vec` columns a thread (1 or kVecSize<T>).
template <typename T>
std::vector<float> kernel_sums(const std::vector<T>& src, int N, int C, int ld, int vec,
                               std::vector<float> dst) {
  const int blocks = (N + sums::kRowBlock - 1) / sums::kRowBlock;
  std::vector<float> partial(static_cast<size_t>(blocks) * C, std::nanf(""));
  const sums::Launch partial_launch = sums::partial_launch(N, C, vec);
  emulated::launch(partial_launch.grid, partial_launch.threads, nullptr, 0, [&] {
    if (vec == 1)
      sums::partial_kernel<T, 1>(partial.data(), src.data(), N, C, ld);
    else
      sums::partial_kernel<T, cuda::kVecSize<T>>(partial.data(), src.data(), N, C, ld);
  });
  const sums::Launch total_launch = sums::total_launch(C);
  emulated::launch(total_launch.grid, total_launch.threads, nullptr, 0,
                   [&] { sums::total_kernel(dst.data(), partial.data(), blocks, C); });
  return dst;
}

// The documented order on the host: rows in order within each block of
// kRowBlock, then the blocks in order, then added to dst.
template <typename T>
std::vector<float> ordered_sums(const std::vector<T>& src, int N, int C, int ld,
                                std::vector<float> dst) {
  for (int c = 0; c < C; ++c) {
    float total = 0.0f;
    for (int r0 = 0; r0 < N; r0 += sums::kRowBlock) {
      float block = 0.0f;
      for (int r = r0; r < std::min(N, r0 + sums::kRowBlock); ++r)
        block += emulated::widened(src[static_cast<size_t>(r) * ld + c]);
      total += block;
    }
    dst[c] += total;
  }
  return dst;
}

template <typename T>
void check_shapes() {
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  constexpr int kVec = cuda::kVecSize<T>;
  // Rows over blocks (a last block part full), wide and narrow; ld past C;
  // more vectors a row than a block has threads (blocks side by side).
  for (const auto& [N, C, ld] : {std::tuple{200, 3 * kVec, 4 * kVec}, std::tuple{64, kVec, kVec},
                                 std::tuple{130, 33 * kVec, 40 * kVec}, std::tuple{5, 3, 7},
                                 std::tuple{70, 300 * kVec, 300 * kVec}}) {
    SCOPED_TRACE("N " + std::to_string(N) + ", C " + std::to_string(C) + ", ld " +
                 std::to_string(ld));
    std::vector<T> src(static_cast<size_t>(N) * ld);
    for (T& x : src) x = emulated::stored<T>(normal(rng));
    std::vector<float> dst(C);
    for (float& x : dst) x = normal(rng);
    const std::vector<float> want = ordered_sums(src, N, C, ld, dst);
    EXPECT_EQ(kernel_sums(src, N, C, ld, 1, dst), want) << "one column a thread";
    if (sums::vectorizable(src.data(), C, ld))
      EXPECT_EQ(kernel_sums(src, N, C, ld, kVec, dst), want) << kVec << " columns a thread";
    else
      EXPECT_EQ(C, 3) << "only the odd shape is not vectorizable";
  }
}

TEST(ColumnSums, EachColumnsRowsInOrderWhateverTheColumnsAThread) {
  check_shapes<float>();
  check_shapes<__nv_bfloat16>();
}

TEST(ColumnSums, VectorsWhereEveryRowStartsAligned) {
  alignas(16) float rows[64] = {};
  EXPECT_TRUE(sums::vectorizable(rows, 8, 12));
  EXPECT_FALSE(sums::vectorizable(rows + 1, 8, 12)) << "a base off 16 bytes";
  EXPECT_FALSE(sums::vectorizable(rows, 8, 10)) << "rows 40 bytes apart";
  EXPECT_FALSE(sums::vectorizable(rows, 6, 12)) << "a partial vector at each row's end";
  const sums::Launch wide = sums::partial_launch(32768, 3072, 8),
                     narrow = sums::partial_launch(32768, 768, 8);
  EXPECT_EQ((std::vector<int>{int(wide.grid.x), int(wide.grid.y), wide.threads}),
            (std::vector<int>{2, 512, 256}))
      << "384 vectors of 8 columns: two blocks a row block, 64 rows each";
  EXPECT_EQ((std::vector<int>{int(narrow.grid.x), narrow.threads}), (std::vector<int>{1, 96}))
      << "96 vectors: one block of 96 threads";
  EXPECT_EQ(sums::partial_launch(10, 3, 1).threads, 32) << "a warp at least";
}

}  // namespace
}  // namespace mpiformer
