// The cuDNN attention graphs' metadata buffer (kernels/cuda/attention_plan.h):
// every array 16-byte aligned, none overlapping, all inside the buffer, for
// every slot count a run can have. Plain C++: no GPU needed.
#include "kernels/cuda/attention_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

namespace mpiformer::cuda {
namespace {

TEST(AttentionMeta, EveryArrayIsAlignedApartAndInside) {
  // cudaMalloc's buffers start 256-byte aligned.
  alignas(256) static char base[1 << 18];
  int misaligned = 0;
  for (int slots = 1; slots <= 4096; ++slots) {
    const size_t bytes = attention_meta_bytes(slots);
    ASSERT_LE(bytes, sizeof base);
    const AttentionMeta meta = attention_meta(base, slots);
    const auto at = [&](const void* p) { return static_cast<const char*>(p) - base; };
    // [begin, end) of each array.
    std::vector<std::pair<ptrdiff_t, ptrdiff_t>> arrays = {
        {at(meta.seq_q), at(meta.seq_q + slots)},
        {at(meta.seq_kv), at(meta.seq_kv + slots)},
        {at(meta.ro_q), at(meta.ro_q + slots + 1)},
        {at(meta.ro_kv), at(meta.ro_kv + slots + 1)},
        {at(meta.ro_o), at(meta.ro_o + slots + 1)},
        {at(meta.ro_stats), at(meta.ro_stats + slots + 1)}};
    for (const auto& [begin, end] : arrays) {
      if (begin % 16 != 0) ++misaligned;
      EXPECT_GE(begin, 0);
      EXPECT_LE(end, static_cast<ptrdiff_t>(bytes)) << slots << " slots";
    }
    std::sort(arrays.begin(), arrays.end());
    for (size_t i = 1; i < arrays.size(); ++i)
      EXPECT_LE(arrays[i - 1].second, arrays[i].first) << slots << " slots: arrays overlap";
  }
  EXPECT_EQ(misaligned, 0) << "arrays not 16-byte aligned, over slot counts 1..4096";
}

// Host lengths of a batch, as a Ragged views them.
struct Lengths {
  std::vector<int32_t> offsets{0};
  explicit Lengths(const std::vector<int>& lengths) {
    for (int n : lengths) offsets.push_back(offsets.back() + n);
  }
  Ragged ragged() const {
    Ragged r;
    r.host_offsets = offsets.data();
    r.batch = static_cast<int>(offsets.size()) - 1;
    r.total = offsets.back();
    for (int b = 0; b < r.batch; ++b) r.max_len = std::max(r.max_len, r.length(b));
    return r;
  }
};

TEST(AttentionPlan, TheWorkspaceBudgetIsThePlainScoresOrTheFloor) {
  // GPT-2 small at B8 T1024: the plain backward keeps 2 x 4 bytes x 12 heads
  // x 8 x 1024^2 (805 MB); cuDNN's deterministic dP is about 8 slots x 12 x
  // 1024^2 x 2 bytes (201 MB), within it.
  const Lengths gpt2(std::vector<int>(8, 1024));
  const size_t budget = attention_workspace_budget(gpt2.ragged(), gpt2.ragged(), 12);
  EXPECT_EQ(budget, size_t{8} * 12 * 8 * 1024 * 1024);
  EXPECT_GT(budget, size_t{8} * 12 * 1024 * 1024 * 2);
  // Many short sequences and one long one: cuDNN rounds the slots (4096)
  // and the length (1024) up, so dP would need 4096 x 8 x 1024^2 x 2 bytes
  // (64 GiB) where the plain kernels need 2 x 4 x 8 x (1024^2 + 3071).
  std::vector<int> ragged(3071, 1);
  ragged.push_back(1024);
  const Lengths mixed(ragged);
  const size_t mixed_budget = attention_workspace_budget(mixed.ragged(), mixed.ragged(), 8);
  EXPECT_EQ(mixed_budget, size_t{2} * 4 * 8 * (1024 * 1024 + 3071));
  EXPECT_LT(mixed_budget, size_t{4096} * 8 * 1024 * 1024 * 2);
  // Short batches keep at least the floor, where cuDNN's dP of a few MB fits.
  const Lengths short_batch(std::vector<int>(128, 30));
  EXPECT_EQ(attention_workspace_budget(short_batch.ragged(), short_batch.ragged(), 8),
            kAttentionWorkspaceFloor);
}

TEST(AttentionPlan, TheMemoryEstimateCountsWhatACallMayTake) {
  const AttentionConfig standard{12, 64, true, AttentionScale::kStandard, 512.0f};
  const size_t tokens = 8192, longest = 1024;
  const size_t plain = 2 * sizeof(float) * 12 * tokens * longest;
  EXPECT_EQ(attention_scratch_bytes(DType::kBF16, tokens, longest, standard, true, false), plain);
  EXPECT_EQ(attention_scratch_bytes(DType::kBF16, tokens, longest, standard, false, false), 0u);
  // cuDNN's workspace shares the scores' buffer: the budget of the largest
  // batch, at least the floor, also for a forward pass.
  EXPECT_EQ(attention_scratch_bytes(DType::kBF16, tokens, longest, standard, true, true), plain);
  EXPECT_EQ(attention_scratch_bytes(DType::kBF16, 64, 8, standard, true, true),
            kAttentionWorkspaceFloor);
  EXPECT_EQ(attention_scratch_bytes(DType::kBF16, tokens, longest, standard, false, true),
            kAttentionWorkspaceFloor);
  // A log-length scale adds the dense copy of q (and its gradient).
  const AttentionConfig log_length{12, 64, true, AttentionScale::kLogLength, 512.0f};
  const size_t q = tokens * 12 * 64 * 2;
  EXPECT_EQ(attention_scratch_bytes(DType::kBF16, tokens, longest, log_length, true, true),
            plain + 2 * q);
  EXPECT_EQ(attention_scratch_bytes(DType::kBF16, tokens, longest, log_length, false, true),
            kAttentionWorkspaceFloor + q);
}

}  // namespace
}  // namespace mpiformer::cuda
