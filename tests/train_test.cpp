// The training loop's guards, without MPI: the divergence guard's verdicts,
// the loss watch, the run directory's lock, start point and branches, and
// the memory estimate against what the model really allocates.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/observed_ops.h"
#include "src/core/shard_plan.h"
#include "src/io/atomic_file.h"
#include "src/io/checkpoint.h"
#include "src/model/model.h"
#include "src/optim/adamw.h"
#include "src/parallel/collective_checkpoint.h"
#include "src/train/divergence_guard.h"
#include "src/train/memory_budget.h"
#include "src/train/run_directory.h"
#include "tests/test_batches.h"

namespace mpiformer {
namespace {

namespace fs = std::filesystem;
using Action = DivergenceGuard::Action;

TEST(DivergenceGuard, StopsOnTheFirstNonFiniteStepByDefault) {
  DivergenceGuard guard(OnDivergence::kStop);
  EXPECT_EQ(guard.judge(true, true, false), Action::kApply);
  EXPECT_EQ(guard.judge(false, true, false), Action::kStop);
  EXPECT_EQ(guard.reason(), "the loss is not finite");
  EXPECT_EQ(guard.judge(true, false, false), Action::kStop);
  EXPECT_EQ(guard.reason(), "the gradient norm is not finite");
  EXPECT_EQ(guard.judge(false, false, true), Action::kStop);
  EXPECT_EQ(guard.reason(), "the loss and the gradient norm are not finite");
}

TEST(DivergenceGuard, AnFp16OverflowIsSkippedWhileTheScaleCanFall) {
  DivergenceGuard guard(OnDivergence::kStop);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(guard.judge(true, false, true), Action::kSkipOverflow);
  EXPECT_EQ(guard.skipped_in_a_row(), 0) << "overflows are not divergence";
  // At the scale's floor of 1 an overflow is the run's own.
  EXPECT_EQ(guard.judge(true, false, false), Action::kStop);
  // A non-finite loss is no scaling problem: the forward pass overflowed.
  DivergenceGuard fresh(OnDivergence::kStop);
  EXPECT_EQ(fresh.judge(false, false, true), Action::kStop);
}

TEST(DivergenceGuard, SkipDropsStepsUntilTooManyInARow) {
  DivergenceGuard guard(OnDivergence::kSkip);
  for (int round = 0; round < 2; ++round) {
    for (int i = 1; i < DivergenceGuard::kMaxSkippedInARow; ++i) {
      EXPECT_EQ(guard.judge(false, true, false), Action::kSkipDiverged) << i;
      EXPECT_EQ(guard.skipped_in_a_row(), i);
    }
    if (round == 0) {
      EXPECT_EQ(guard.judge(true, true, false), Action::kApply);  // a good step resets the count
      EXPECT_EQ(guard.skipped_in_a_row(), 0);
    }
  }
  EXPECT_EQ(guard.judge(true, false, false), Action::kStop);
  EXPECT_EQ(guard.skipped_in_a_row(), DivergenceGuard::kMaxSkippedInARow);
}

TEST(LossWatch, WarnsOncePerRiseFarAboveTheLowest) {
  LossWatch watch(32);  // ln 32 = 3.47
  EXPECT_EQ(watch.observe(10, 3.3), "");
  EXPECT_EQ(watch.observe(20, 1.0), "");
  EXPECT_EQ(watch.observe(30, 1.9), "") << "twice the lowest but not 1 nat above it";
  const std::string warning = watch.observe(40, 2.5);
  EXPECT_NE(warning.find("warning: step 40: loss 2.5 is far above its lowest, 1 at step 20"),
            std::string::npos)
      << warning;
  EXPECT_EQ(watch.observe(50, 9.0), "") << "once per excursion";
  EXPECT_EQ(watch.observe(60, 1.5), "");
  EXPECT_NE(watch.observe(70, 4.0), "") << "a new excursion warns again";
  EXPECT_EQ(watch.observe(80, std::nan("")), "") << "non-finite is the guard's";

  // The first window of a run that starts diverging is above a uniform guess.
  LossWatch resumed(32);
  const std::string first = resumed.observe(5, 46.8);
  EXPECT_NE(first.find("far above 3.466, the loss of a uniform guess"), std::string::npos) << first;

  // A classifier's uniform guess is over its labels, not the vocabulary:
  // 60,000 labels start near ln 60000 = 11.0, which is no divergence.
  LossWatch labels(60000, "the labels");
  EXPECT_EQ(labels.observe(5, 11.02), "");
  EXPECT_NE(LossWatch(20).observe(5, 11.02), "") << "ln 20 = 3.0: far below 11.02";
  const std::string diverging = LossWatch(60000, "the labels").observe(5, 40.0);
  EXPECT_NE(diverging.find("far above 11, the loss of a uniform guess over the labels"),
            std::string::npos)
      << diverging;
}

// ---- the run directory

class RunDirectoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::path(::testing::TempDir()) /
           ("mpiformer_train_test_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    const ModelConfig c = testing::tiny(ModelKind::kLm);
    model_ = std::make_unique<Model>(*ops_, c, ModelCapacity{32, c.max_len});
    model_->init_parameters(3);
    moments_.assign(model_->parameters().count(), 0.0f);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string run() const { return (dir_ / "run").string(); }
  void save(int64_t step, const std::string& run_id = "") {
    CheckpointState s;
    s.step = s.optimizer_steps = step;
    s.run_id = run_id;
    s.vocab_size = model_->config().vocab;
    save_checkpoint(run(), model_->parameters(), moments_.data(), moments_.data(), s, 0);
  }
  std::vector<std::string> names(const fs::path& dir) const {
    std::vector<std::string> found;
    for (const auto& e : fs::directory_iterator(dir)) found.push_back(e.path().filename().string());
    std::sort(found.begin(), found.end());
    return found;
  }

  fs::path dir_;
  std::unique_ptr<Ops> ops_ = make_cpu_ops(1);
  std::unique_ptr<Model> model_;
  std::vector<float> moments_;
};

TEST_F(RunDirectoryTest, OneJobAtATimeAndAStaleLockIsNoLock) {
  RunDirectory first(run());
  EXPECT_EQ(first.open().code, 0);
  RunDirectory second(run());
  const Verdict refused = second.open();
  EXPECT_EQ(refused.code, 2);
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  EXPECT_NE(refused.message.find("is in use by another process (host " + std::string(host) +
                                 ", pid " + std::to_string(::getpid())),
            std::string::npos)
      << refused.message;
  {
    // A lock file whose holder is gone (a killed job) locks nothing.
    RunDirectory moved = std::move(first);
  }
  std::ofstream(fs::path(run()) / ".lock") << "deadhost 1\n";
  RunDirectory third(run());
  EXPECT_EQ(third.open().code, 0) << third.open().message;
}

TEST_F(RunDirectoryTest, AutoFollowsLatestAndAnOlderCheckpointStartsABranch) {
  for (int64_t step : {10, 20, 30, 40}) save(step);
  RunDirectory dir(run());
  ASSERT_EQ(dir.open().code, 0);
  std::ofstream(fs::path(run()) / "metrics.h5") << "rows";

  // --resume PATH to step 20: 30 and 40 move to abandoned/, latest follows.
  StartPoint start;
  const std::string older = (fs::path(run()) / "checkpoints" / "step_00000020.h5").string();
  ASSERT_EQ(dir.choose_start(older, false, &start).code, 0);
  EXPECT_EQ(start.state.step, 20);
  const std::string line = dir.make_head(start);
  EXPECT_NE(line.find("a new branch from step 20: 2 later checkpoint(s) (steps 30 to 40)"),
            std::string::npos)
      << line;
  EXPECT_EQ(names(fs::path(run()) / "checkpoints"),
            (std::vector<std::string>{"latest", "step_00000010.h5", "step_00000020.h5"}));
  const std::vector<std::string> branches = names(fs::path(run()) / "abandoned");
  ASSERT_EQ(branches.size(), 1u);
  EXPECT_EQ(names(fs::path(run()) / "abandoned" / branches[0]),
            (std::vector<std::string>{"metrics.h5", "step_00000030.h5", "step_00000040.h5"}));
  EXPECT_EQ(dir.latest(), older);

  // --resume auto takes `latest`, even with a later file beside it (a crash
  // between a checkpoint's rename and `latest`), which then moves away too.
  save(25);
  point_latest_at(run(), older);
  StartPoint again;
  ASSERT_EQ(dir.choose_start("auto", false, &again).code, 0);
  EXPECT_EQ(again.state.step, 20);
  EXPECT_NE(dir.make_head(again).find("1 later checkpoint(s) (steps 25 to 25)"), std::string::npos);
  EXPECT_EQ(names(fs::path(run()) / "abandoned").size(), 2u);

  // A damaged `latest` falls back to the one before it.
  fs::resize_file(older, fs::file_size(older) / 2);
  StartPoint fallback;
  ASSERT_EQ(dir.choose_start("auto", false, &fallback).code, 0);
  EXPECT_EQ(fallback.state.step, 10);
}

TEST_F(RunDirectoryTest, TheRunIdRefusesACheckpointOfAnotherRun) {
  // A directory of a version without ids is adopted: make_head gives it one.
  save(10);
  RunDirectory dir(run());
  ASSERT_EQ(dir.open().code, 0);
  StartPoint old;
  ASSERT_EQ(dir.choose_start("auto", false, &old).code, 0);
  EXPECT_EQ(dir.run_id(), "");
  dir.make_head(old);
  const std::string id = dir.run_id();
  EXPECT_EQ(id.size(), 16u);
  std::ofstream(fs::path(run()) / "config.ini") << "model = lm\n# run-id = " << id << "\n";
  save(20, id);

  // Another run's checkpoint copied in, later than `latest`: refused by auto.
  save(30, "0000000000000bad");
  point_latest_at(run(), (fs::path(run()) / "checkpoints" / "step_00000020.h5").string());
  StartPoint start;
  const Verdict foreign = dir.choose_start("auto", false, &start);
  EXPECT_EQ(foreign.code, 2);
  EXPECT_NE(foreign.message.find("step_00000030.h5 is a checkpoint of run 0000000000000bad, but " +
                                 run() + " holds run " + id + " (config.ini)"),
            std::string::npos)
      << foreign.message;
  // By path: only when asked, and the directory keeps its id.
  const std::string path = (fs::path(run()) / "checkpoints" / "step_00000030.h5").string();
  EXPECT_EQ(dir.choose_start(path, false, &start).code, 2);
  ASSERT_EQ(dir.choose_start(path, true, &start).code, 0);
  EXPECT_EQ(dir.run_id(), id);
  EXPECT_EQ(dir.origin(), path + " (run 0000000000000bad, step 30)");
}

TEST_F(RunDirectoryTest, UnfinishedWritesOfAKilledJobAreRemoved) {
  save(5);
  // Another node's writer counts as gone; a live one (this process) keeps
  // its file; NAME.tmp is what older versions left.
  const fs::path checkpoints = fs::path(run()) / "checkpoints";
  std::ofstream(checkpoints / "step_00000010.h5.tmp-othernode-12345") << "half";
  std::ofstream(fs::path(run()) / "metrics.jsonl.tmp-othernode-12345") << "half";
  std::ofstream(checkpoints / "step_00000008.h5.tmp") << "half";
  const std::string live = temporary_name((checkpoints / "step_00000012.h5").string());
  std::ofstream(live) << "being written";
  RunDirectory dir(run());
  ASSERT_EQ(dir.open().code, 0);
  EXPECT_EQ(dir.remove_unfinished_writes(), 3);
  fs::remove(live);
  EXPECT_EQ(names(fs::path(run()) / "checkpoints"),
            (std::vector<std::string>{"latest", "step_00000005.h5"}));
}

TEST_F(RunDirectoryTest, AWithdrawnStartLeavesNoDirectoryItMade) {
  // open() made both directories: withdraw() removes them again.
  const fs::path fresh = dir_ / "new" / "run";
  RunDirectory made(fresh.string() + "/");
  ASSERT_EQ(made.open().code, 0);
  EXPECT_TRUE(fs::exists(fresh / ".lock"));
  made.withdraw();
  EXPECT_FALSE(fs::exists(dir_ / "new"));

  // A directory that was there stays as it was.
  fs::create_directories(run());
  std::ofstream(fs::path(run()) / "notes.txt") << "mine";
  RunDirectory existing(run());
  ASSERT_EQ(existing.open().code, 0);
  existing.withdraw();
  EXPECT_EQ(names(run()), std::vector<std::string>{"notes.txt"});
}

// ---- memory

TEST(MemoryEstimate, AClassifiersScoresAreOneRowPerSequence) {
  std::unique_ptr<Ops> ops = make_cpu_ops(1);
  ModelConfig c = testing::tiny(ModelKind::kClassify);
  c.num_labels = 10000;
  c.loss = ClassifyLoss::kZlpr;
  const ModelCapacity per_token{4096, c.max_len}, per_sequence{4096, c.max_len, 64};
  const size_t tokens = Model::measure(*ops, c, per_token).activation_bytes;
  const ModelMemory sequences = Model::measure(*ops, c, per_sequence);
  // Scores and label targets: (4096 - 64) rows of 10000 fewer floats each.
  EXPECT_GE(tokens - sequences.activation_bytes, size_t{2} * (4096 - 64) * 10000 * 4);
  Model model(*ops, c, per_sequence);
  EXPECT_LE(ops->device().peak_allocated_bytes(), sequences.activation_bytes);
}

TEST(MemoryEstimate, CountsWhatTheModelAllocates) {
  for (ModelKind kind : {ModelKind::kLm, ModelKind::kSeq2seq, ModelKind::kMlm}) {
    for (DType compute : {DType::kF32, DType::kBF16}) {
      ModelConfig c = testing::tiny(kind);
      c.positions = kind == ModelKind::kSeq2seq ? PositionKind::kSinusoidal : c.positions;
      const ModelCapacity capacity{96, c.max_len};
      std::unique_ptr<Ops> ops = make_cpu_ops(1);
      const ModelMemory measured = Model::measure(*ops, c, capacity, compute);
      EXPECT_EQ(ops->device().peak_allocated_bytes(), 0u) << "measuring allocates nothing";

      Model model(*ops, c, capacity, compute);
      const size_t activations = ops->device().peak_allocated_bytes();
      model.init_parameters(1);
      AdamW adam(model.parameters(), OptimConfig{});
      const size_t total = ops->device().peak_allocated_bytes();
      EXPECT_EQ(measured.parameters, model.parameters().count());
      // The arena rounds each buffer to 64 bytes, as the backends align.
      EXPECT_GE(measured.activation_bytes, activations);
      EXPECT_LE(measured.activation_bytes, activations + 64 * 200);

      // The attention scratch is the ops' own, outside the model's buffers.
      const MemoryEstimate e =
          estimate_memory(*ops, c, capacity, compute, MemoryPlan{.training = true});
      EXPECT_GT(e.buffer_bytes, 0u);
      EXPECT_GE(e.device_total() + 64 * 200, total + e.buffer_bytes) << to_string(kind);
      EXPECT_LE(e.device_total(),
                total + 64 * 200 + e.activation_bytes - measured.activation_bytes + e.buffer_bytes)
          << to_string(kind);
    }
  }
}

TEST(MemoryEstimate, AttentionScratchGrowsWithTheSquareOfTheLongestSequence) {
  std::unique_ptr<Ops> ops = make_cpu_ops(1);
  ModelConfig c = testing::tiny(ModelKind::kLm);
  c.max_len = 4096;
  const auto scratch = [&](int longest, bool training) {
    // Without the exact sum's buffer, the buffers are the attention scratch.
    return estimate_memory(*ops, c, ModelCapacity{4096, longest}, DType::kF32,
                           MemoryPlan{.training = training})
        .buffer_bytes;
  };
  // The same tokens in sequences twice as long: four times the scores.
  EXPECT_EQ(scratch(2048, true), 4 * scratch(1024, true));
  // Backward keeps the probabilities and their gradient; forward only one.
  EXPECT_EQ(scratch(1024, true), 2 * scratch(1024, false));
  EXPECT_GE(scratch(1024, false), sizeof(float) * 1024 * 1024);
}

TEST(MemoryEstimate, ShardingDividesTheMomentsAndHalfPrecisionMastersByTheRanks) {
  std::unique_ptr<Ops> ops = make_cpu_ops(1);
  const ModelConfig c = testing::tiny(ModelKind::kLm);
  const ModelCapacity capacity{64, c.max_len};
  const MemoryPlan whole{.training = true, .world = 4, .reducer_exact_sum = true};
  MemoryPlan sharded = whole;
  sharded.shard_optimizer = true;
  for (DType compute : {DType::kF32, DType::kBF16}) {
    const MemoryEstimate a = estimate_memory(*ops, c, capacity, compute, whole);
    const MemoryEstimate b = estimate_memory(*ops, c, capacity, compute, sharded);
    const size_t P = a.parameters, slice = plan_shards(P, 4).largest();
    EXPECT_EQ(a.owned_parameters, P);
    EXPECT_EQ(b.owned_parameters, slice);
    EXPECT_LT(slice, P);
    EXPECT_EQ(a.moment_bytes, 8 * P);
    EXPECT_EQ(b.moment_bytes, 8 * slice);
    // fp32 runs have no masters apart from the weights; bf16's are sliced.
    EXPECT_EQ(a.master_bytes, compute == DType::kF32 ? 0 : 4 * P);
    EXPECT_EQ(b.master_bytes, compute == DType::kF32 ? 0 : 4 * slice);
    // Weights, gradients and the exact sum stay whole on every rank.
    EXPECT_EQ(a.weight_bytes, b.weight_bytes);
    EXPECT_EQ(b.gradient_bytes, 4 * P);
    EXPECT_EQ(a.buffer_bytes, b.buffer_bytes);
    EXPECT_NE(b.describe().find(std::to_string(slice) + " in this rank's slice: weights "),
              std::string::npos)
        << b.describe();
  }
  // Scoring keeps no gradients and no moments.
  const MemoryEstimate scoring = estimate_memory(*ops, c, capacity, DType::kF32);
  EXPECT_EQ(scoring.gradient_bytes + scoring.moment_bytes + scoring.master_bytes, 0u);
}

TEST(MemoryEstimate, RecomputeCountsFewerActivationsAndNothingElseChanges) {
  std::unique_ptr<Ops> ops = make_cpu_ops(1);
  ModelConfig c = testing::tiny(ModelKind::kLm);
  c.layers = 6;
  const MemoryPlan plan{.training = true};
  const MemoryEstimate keep =
      estimate_memory(*ops, c, ModelCapacity{256, c.max_len}, DType::kF32, plan);
  const MemoryEstimate rerun = estimate_memory(
      *ops, c, ModelCapacity{256, c.max_len, 0, Recompute::kLayer}, DType::kF32, plan);
  EXPECT_LT(rerun.activation_bytes, keep.activation_bytes);
  EXPECT_EQ(rerun.device_total() - rerun.activation_bytes,
            keep.device_total() - keep.activation_bytes);
}

TEST(MemoryEstimate, BytesAreWrittenInTheLargestUnitBelowThem) {
  EXPECT_EQ(format_bytes(512), "0.5 KiB");
  EXPECT_EQ(format_bytes(1536), "1.5 KiB");
  EXPECT_EQ(format_bytes(double(size_t{5} << 30)), "5.0 GiB");
  EXPECT_EQ(format_bytes(double(size_t{3} << 40)), "3.0 TiB");
  EXPECT_EQ(format_bytes(double(size_t{2048} << 40)), "2048.0 TiB");
}

TEST(MemoryEstimate, AModelLargerThanTheHostIsNamed) {
  std::unique_ptr<Ops> ops = make_cpu_ops(1);
  ModelConfig c = testing::tiny(ModelKind::kLm);
  c.d_model = 1 << 16;
  c.heads = 4;
  c.d_ff = 1 << 18;
  c.layers = 64;
  const MemoryEstimate e = estimate_memory(*ops, c, ModelCapacity{1 << 20, c.max_len}, DType::kF32,
                                           MemoryPlan{.training = true});
  EXPECT_GT(e.host_total(), size_t{1} << 44);  // far beyond any host
  const std::string why = memory_shortfall(e, *ops, 2, "--d-model");
  EXPECT_EQ(why.rfind("needs about ", 0), 0u) << why;
  EXPECT_NE(why.find("of host memory available to each of 2 rank(s) on this node; lower --d-model"),
            std::string::npos)
      << why;
  const ModelConfig small_model = testing::tiny(ModelKind::kLm);
  const MemoryEstimate small =
      estimate_memory(*ops, small_model, ModelCapacity{64, small_model.max_len}, DType::kF32,
                      MemoryPlan{.training = true});
  EXPECT_EQ(memory_shortfall(small, *ops, 1, "--max-tokens"), "");
}

// Ops whose attention preparation reserves a given workspace, or finds no
// room for it (as the CUDA backend's cuDNN graphs do), and records the cases.
class ReservingOps : public ObservedOps {
 public:
  ReservingOps(Ops& inner, size_t workspace, bool fits)
      : ObservedOps(inner), workspace_(workspace), fits_(fits) {}
  AttentionPreparation prepare_attention(const std::vector<AttentionCase>& cases, DType,
                                         bool) override {
    cases_ = cases;
    if (!fits_) throw std::runtime_error("cuDNN attention needs a workspace of 9.0 GiB");
    AttentionPreparation done;
    done.cases = static_cast<int>(cases.size());
    done.graphs = 2 * done.cases;
    done.workspace_bytes = workspace_;
    return done;
  }
  std::vector<AttentionCase> cases_;

 private:
  size_t workspace_;
  bool fits_;
};

TEST(MemoryEstimate, TheReservedAttentionWorkspaceIsCountedAndRefusedOverTheDevice) {
  std::unique_ptr<Ops> cpu = make_cpu_ops(1);
  const ModelConfig c = testing::tiny(ModelKind::kSeq2seq);
  const std::vector<BatchSource::BucketBound> bounds = {
      {SideBound{8, 16, 128}, SideBound{8, 24, 192}}, {SideBound{4, 32, 128}, SideBound{4, 8, 32}}};
  const MemoryEstimate before = estimate_memory(*cpu, c, ModelCapacity{256, c.max_len},
                                                DType::kBF16, MemoryPlan{.training = true});
  const size_t workspace = before.attention_bytes + (size_t{300} << 20);
  ReservingOps ops(*cpu, workspace, true);
  MemoryEstimate after = before;
  const AttentionPreparation done =
      prepare_attention(ops, c, bounds, DType::kBF16, true, &after, "--max-tokens");
  // Every attention kind of the model at every bucket's largest batch.
  ASSERT_EQ(ops.cases_.size(), 6u);
  EXPECT_EQ(ops.cases_[1].q.longest, 16);  // decoder self-attention
  EXPECT_EQ(ops.cases_[2].k.longest, 24);  // cross-attention reads the encoder's
  EXPECT_TRUE(ops.cases_[1].cfg.causal);
  EXPECT_FALSE(ops.cases_[0].cfg.causal);
  EXPECT_EQ(done.workspace_bytes, workspace);
  EXPECT_EQ(after.attention_bytes, workspace);
  EXPECT_EQ(after.device_total(), before.device_total() + (size_t{300} << 20));
  EXPECT_NE(after.describe().find("attention scratch"), std::string::npos);
  EXPECT_NE(describe_preparation(done).find("6 batch class(es) (12 graphs)"), std::string::npos)
      << describe_preparation(done);
  // A smaller workspace than the estimate's scratch changes nothing.
  MemoryEstimate small = before;
  count_attention_workspace(&small, 1);
  EXPECT_EQ(small.device_total(), before.device_total());
  // No room: a usage error that names the flags that shrink it.
  ReservingOps full(*cpu, workspace, false);
  MemoryEstimate refused = before;
  try {
    prepare_attention(full, c, bounds, DType::kBF16, true, &refused, "--max-tokens or --max-len");
    ADD_FAILURE() << "a workspace with no room was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("9.0 GiB; lower --max-tokens or --max-len"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace mpiformer
