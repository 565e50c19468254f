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

// ---- the workspace reserved before the first step --------------------------

TEST(AttentionWorkspace, TheReservedSizeIsTheLargestPreparedGraphs) {
  EXPECT_EQ(reserved_workspace({}), 0u);
  EXPECT_EQ(reserved_workspace({size_t{3} << 20, size_t{114} << 20, size_t{47} << 20}),
            size_t{114} << 20);
}

TEST(AttentionWorkspace, ItIsRefusedOverTheDevicesFreeMemory) {
  const size_t gib = size_t{1} << 30;
  EXPECT_TRUE(workspace_fits(gib, 0, 2 * gib));
  // The headroom for the libraries stays free.
  EXPECT_TRUE(workspace_fits(gib, 0, gib + kWorkspaceHeadroom));
  EXPECT_FALSE(workspace_fits(gib, 0, gib + kWorkspaceHeadroom - 1));
  // What is already reserved needs no more memory.
  EXPECT_TRUE(workspace_fits(gib, gib, 0));
  EXPECT_TRUE(workspace_fits(gib, gib / 2, gib / 2 + kWorkspaceHeadroom));
  EXPECT_FALSE(workspace_fits(gib, gib / 2, gib / 2));
}

TEST(AttentionWorkspace, AnUnpreparedCallsBudgetComesFromTheDevice) {
  // The ragged batch the plain kernels took for want of 8 MiB: 320
  // sequences of 16..128 tokens, whose cuDNN backward needs 193.7 MiB.
  std::vector<int> lengths;
  for (int b = 0; b < 320; ++b) lengths.push_back(16 + (b * 37) % 113);
  const Lengths ragged(lengths);
  const size_t need = static_cast<size_t>(193.7 * (1 << 20));
  const size_t old_budget = attention_workspace_budget(ragged.ragged(), ragged.ragged(), 12);
  EXPECT_LT(old_budget, need);
  const size_t h100_free = size_t{60} << 30;
  EXPECT_GE(unplanned_workspace_budget(ragged.ragged(), ragged.ragged(), 12, 0, h100_free), need);
  // Never less than the reserved workspace, nor the old budget.
  EXPECT_EQ(unplanned_workspace_budget(ragged.ragged(), ragged.ragged(), 12, need, 0), need);
  EXPECT_EQ(unplanned_workspace_budget(ragged.ragged(), ragged.ragged(), 12, 0, 0), old_budget);
}

// ---- graph classes ----------------------------------------------------------

TEST(AttentionGraphShapes, TwoRaggedBatchesOfOneBucketGiveOneKey) {
  const GraphLayout causal{12, 64, 3 * 768, 3 * 768, true};
  PlannedShapes planned;
  // Buckets (103, 113] and (113, 124] with --max-tokens 32768: one class
  // of graphs 128 long (both round up to it); (94, 103] rounds to 112.
  for (const int boundary : {103, 113, 124}) {
    const int sequences = 32768 / boundary;
    const SideBound side{sequences, boundary, int64_t{sequences} * boundary};
    planned.add(causal, side, side);
  }
  ASSERT_EQ(planned.entries().size(), 2u);
  // Two batches of bucket (103, 113]: one of 200 sequences up to 110 long
  // (which alone would fit the 112 class), one of 289 up to 113.
  std::vector<int> a(200, 104), b(289, 113);
  a[7] = 110;
  b[0] = 105;
  const Lengths first(a), second(b);
  const PlannedShapes::Entry* one = planned.covering(causal, first.ragged(), first.ragged());
  const PlannedShapes::Entry* two = planned.covering(causal, second.ragged(), second.ragged());
  ASSERT_NE(one, nullptr);
  EXPECT_EQ(one, two);
  EXPECT_EQ(one->shape.max_q, 128);
  EXPECT_EQ(one->shape.slots, 32768 / 113);
  EXPECT_EQ(one->shape.total_q, int64_t{32768 / 124} * 124);  // the largest batch of either
  // A batch of bucket (94, 103] takes the 112 class.
  const Lengths shorter(std::vector<int>(300, 100));
  const PlannedShapes::Entry* other = planned.covering(causal, shorter.ragged(), shorter.ragged());
  ASSERT_NE(other, nullptr);
  EXPECT_EQ(other->shape.max_q, 112);
  // Another layout, or a batch larger than any bucket's, has no class.
  const GraphLayout bidirectional{12, 64, 3 * 768, 3 * 768, false};
  EXPECT_EQ(planned.covering(bidirectional, first.ragged(), first.ragged()), nullptr);
  const Lengths longer(std::vector<int>(4, 200)), more(std::vector<int>(400, 110));
  EXPECT_EQ(planned.covering(causal, longer.ragged(), longer.ragged()), nullptr);
  EXPECT_EQ(planned.covering(causal, more.ragged(), more.ragged()), nullptr);
}

TEST(AttentionGraphShapes, CrossAttentionClassesFollowBothSides) {
  const GraphLayout cross{8, 64, 512, 1024, false};
  PlannedShapes planned;
  // 2-D buckets (source, target) of 24 and 40 tokens a side.
  for (const int source : {24, 40}) {
    for (const int target : {24, 40}) {
      const int sequences = 4096 / (source + target);
      planned.add(cross, SideBound{sequences, target, int64_t{sequences} * target},
                  SideBound{sequences, source, int64_t{sequences} * source});
    }
  }
  ASSERT_EQ(planned.entries().size(), 4u);
  const Lengths targets(std::vector<int>(50, 30)), sources(std::vector<int>(50, 20));
  const PlannedShapes::Entry* entry = planned.covering(cross, targets.ragged(), sources.ragged());
  ASSERT_NE(entry, nullptr);
  EXPECT_EQ(entry->shape.max_q, 48);
  EXPECT_EQ(entry->shape.max_kv, 32);
}

// attention=dense: only a class of one length (a benchmark's one batch, a
// bucket whose sequences all have one length) has a dense graph prepared,
// for its full batches, and only a batch of that very shape takes it. A
// ragged bucket's equal-length batches vary in length and count, so a
// graph of their own would be built mid-step, one per shape.
TEST(AttentionGraphShapes, OnlyAUniformClassHasADenseGraph) {
  const GraphLayout causal{12, 64, 3 * 768, 3 * 768, true};
  PlannedShapes planned;
  const SideBound one_batch{32, 1024, 32 * 1024, 1024};
  const SideBound bucket{288, 113, 288 * 113};
  planned.add_uniform(causal, bucket, bucket);
  EXPECT_TRUE(planned.uniform().empty()) << "a bucket's bound is no uniform class";
  planned.add_uniform(causal, one_batch, one_batch);
  planned.add_uniform(causal, one_batch, one_batch);
  ASSERT_EQ(planned.uniform().size(), 1u) << "the same class twice is one graph";
  EXPECT_EQ(planned.uniform()[0].shape, (GraphShape{32, 1024, 1024, 32 * 1024, 32 * 1024}));

  const Lengths same(std::vector<int>(32, 1024)), fewer(std::vector<int>(31, 1024)),
      shorter(std::vector<int>(32, 1000));
  EXPECT_TRUE(planned.holds_uniform(causal, dense_shape(same.ragged(), same.ragged())));
  EXPECT_FALSE(planned.holds_uniform(causal, dense_shape(fewer.ragged(), fewer.ragged())));
  EXPECT_FALSE(planned.holds_uniform(causal, dense_shape(shorter.ragged(), shorter.ragged())));
  const GraphLayout bidirectional{12, 64, 3 * 768, 3 * 768, false};
  EXPECT_FALSE(planned.holds_uniform(bidirectional, dense_shape(same.ragged(), same.ragged())));

  // A bucket of boundary 128 whose sequences all have 65 tokens: its full
  // batches of 40.
  const SideBound images{40, 128, 40 * 128, 65};
  planned.add_uniform(bidirectional, images, images);
  ASSERT_EQ(planned.uniform().size(), 2u);
  EXPECT_EQ(planned.uniform()[1].shape, (GraphShape{40, 65, 65, 40 * 65, 40 * 65}));
  const Lengths full(std::vector<int>(40, 65)), partial(std::vector<int>(7, 65));
  EXPECT_TRUE(planned.holds_uniform(bidirectional, dense_shape(full.ragged(), full.ragged())));
  EXPECT_FALSE(
      planned.holds_uniform(bidirectional, dense_shape(partial.ragged(), partial.ragged())));

  // Cross-attention: both sides uniform, the same sequences; each side its
  // own length.
  const GraphLayout cross{8, 64, 512, 1024, false};
  const SideBound targets{64, 40, 64 * 40, 40}, sources{64, 24, 64 * 24, 24};
  planned.add_uniform(cross, targets, SideBound{64, 24, 64 * 24});
  planned.add_uniform(cross, targets, SideBound{32, 24, 32 * 24, 24});
  EXPECT_EQ(planned.uniform().size(), 2u) << "one side not uniform, or other sequences";
  planned.add_uniform(cross, targets, sources);
  ASSERT_EQ(planned.uniform().size(), 3u);
  const Lengths t(std::vector<int>(64, 40)), s(std::vector<int>(64, 24));
  EXPECT_TRUE(planned.holds_uniform(cross, dense_shape(t.ragged(), s.ragged())));
  EXPECT_FALSE(planned.holds_uniform(cross, dense_shape(s.ragged(), t.ragged())));
}

}  // namespace
}  // namespace mpiformer::cuda
