// The invariant under real MPI (run by CTest on 3 ranks): whatever share of
// the step each rank holds -- many short sequences, a few long ones, or
// nothing -- every rank ends with the single-process gradient of the mean
// loss over all target tokens, and the naive per-rank mean does not.
#include "src/parallel/data_parallel.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kernels/backend.h"
#include "kernels/profiled_ops.h"
#include "src/parallel/mpi_transport.h"
#include "src/parallel/rank_device.h"
#include "src/parallel/replica_check.h"
#include "src/parallel/stream_transport.h"
#include "src/train/progress.h"
#include "src/train/step.h"
#include "tests/test_batches.h"

namespace mpiformer {

Communicator* g_comm = nullptr;

namespace {

using testing::append_batch;
using testing::random_batch;

constexpr int kCapacity = 256;

ModelConfig shape(ModelKind kind) {
  ModelConfig m = testing::tiny(kind);
  m.max_len = 32;
  m.vocab = 40;
  return m;
}

struct Replica {
  std::unique_ptr<Ops> ops = make_cpu_ops(1);
  std::unique_ptr<Model> model;
  explicit Replica(const ModelConfig& m) {
    model = std::make_unique<Model>(*ops, m, ModelCapacity{kCapacity, m.max_len});
    model->init_parameters(21);
  }
  std::vector<float> grads() {
    ParameterSet& p = model->parameters();
    return std::vector<float>(p.grads(), p.grads() + p.count());
  }
};

// Rank r's micro-batches of a step: rank 0 many short sequences, rank 1 a
// few long ones, rank 2 nothing; every rank can build every rank's share.
std::vector<Batch> share_of(const ModelConfig& m, int rank, int K) {
  std::vector<Batch> micro(K);
  for (int k = 0; k < K; ++k) {
    const uint32_t seed = 100 * rank + k;
    if (rank == 0)
      micro[k] = random_batch(m, {3, 4, 2, 5, 3, 4, 2, 3}, {4, 3, 5, 2, 6, 3, 4, 2}, seed);
    if (rank == 1) micro[k] = random_batch(m, {29, 31}, {30, 27}, seed);
  }
  return micro;
}

// Max over tensors of max|a - b| / max|b|.
double tensor_relative_difference(const ParameterSet& p, const std::vector<float>& a,
                                  const std::vector<float>& b, std::string* worst) {
  double result = 0.0;
  for (const ParamInfo& t : p.info()) {
    double diff = 0.0, scale = 1e-30;
    for (size_t i = t.offset; i < t.offset + t.size; ++i) {
      diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
      scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
    }
    if (diff / scale > result) {
      result = diff / scale;
      if (worst) *worst = t.name;
    }
  }
  return result;
}

class UnevenShares : public ::testing::TestWithParam<ModelKind> {};

TEST_P(UnevenShares, EveryRankGetsTheSingleProcessGradient) {
  const Communicator& comm = *g_comm;
  ASSERT_EQ(comm.size(), 3) << "run on 3 ranks";
  const ModelConfig m = shape(GetParam());
  const int K = 2;

  // The single-process reference: every sequence of the step in one batch.
  Batch all;
  for (int r = 0; r < comm.size(); ++r)
    for (const Batch& b : share_of(m, r, K)) append_batch(&all, b);
  const int64_t N = all.target_tokens(m.special.pad);
  Replica single(m);
  single.model->parameters().zero_grads();
  single.model->forward_backward(all, 0.1f, 1.0f / static_cast<float>(N), PassId{1, 1, 0});
  const std::vector<float> reference = single.grads();

  // Data-parallel: small buckets, so several start during backward.
  Replica replica(m);
  ParameterSet& params = replica.model->parameters();
  MpiTransport transport;
  GradientReducer reducer(params, params.grads(), 512, transport, true);
  const std::vector<Batch> mine = share_of(m, comm.rank(), K);
  const StepGradients step = step_gradients(*replica.model, mine, 1, 1, 0.1f, comm, &reducer);
  EXPECT_FALSE(step.skipped);
  EXPECT_EQ(step.global_targets, N);
  EXPECT_EQ(replica.model->take_train_sums().tokens, count_targets(mine, m.special.pad));
  EXPECT_GT(step.reduce.buckets, 3);
  std::string worst;
  const double ours = tensor_relative_difference(params, replica.grads(), reference, &worst);
  EXPECT_LE(ours, 1e-5) << "worst tensor " << worst;

  // The naive rule: each rank averages over its own tokens, then the ranks'
  // gradients are averaged (an empty rank contributes nothing).
  Replica naive(m);
  ParameterSet& naive_params = naive.model->parameters();
  naive_params.zero_grads();
  const int64_t local = count_targets(mine, m.special.pad);
  for (int k = 0; k < K && local > 0; ++k)
    naive.model->forward_backward(mine[k], 0.1f, 1.0f / static_cast<float>(local),
                                  PassId{1, 1, comm.rank() + k * comm.size()});
  const int64_t ranks_with_data = comm.allreduce_sum(int64_t{local > 0 ? 1 : 0});
  comm.allreduce_sum(naive_params.grads(), naive_params.count());
  std::vector<float> averaged = naive.grads();
  for (float& g : averaged) g /= static_cast<float>(ranks_with_data);
  const double naive_error = tensor_relative_difference(naive_params, averaged, reference, nullptr);
  EXPECT_GT(naive_error, 0.05) << "the naive mean should be visibly wrong on uneven shares";
  if (comm.is_root())
    std::printf("%s: ours max rel %.2e (worst %s), naive per-rank mean %.2e\n", to_string(m.kind),
                ours, worst.c_str(), naive_error);
}

TEST_P(UnevenShares, TheExactSumIsBitwiseTheSameOnOneRankAndOnThree) {
  const Communicator& comm = *g_comm;
  const ModelConfig m = shape(GetParam());
  const int K = 2;
  // Three ranks with two micro-batches each, exact sum.
  Replica replica(m);
  ParameterSet& params = replica.model->parameters();
  MpiTransport transport;
  GradientReducer reducer(params, params.grads(), 512, transport, true, GradSum::kExact);
  const StepGradients step =
      step_gradients(*replica.model, share_of(m, comm.rank(), K), 1, 1, 0.1f, comm, &reducer);
  EXPECT_EQ(step.reduce.bytes, (params.count() + 1) * sizeof(int64_t));

  // One rank with all six micro-batches in another order, computed here
  // alone: the sum of integers does not care about order or grouping.
  Replica single(m);
  ParameterSet& single_params = single.model->parameters();
  LocalTransport local;
  GradientReducer alone(single_params, single_params.grads(), 4096, local, false, GradSum::kExact);
  alone.begin_step(1.0f, comm.size() * K + 1);  // every share, then an empty backward
  for (int r = comm.size(); r-- > 0;) {
    for (const Batch& b : share_of(m, r, K)) {
      single_params.zero_grads();
      single.model->forward_backward(b, 0.1f, 1.0f / static_cast<float>(step.global_targets),
                                     PassId{1, 1, 0});
      alone.absorb_micro_batch();
    }
  }
  single_params.zero_grads();
  alone.finish();
  EXPECT_TRUE(std::equal(params.grads(), params.grads() + params.count(), single_params.grads()))
      << "the exact sum differs between 3 ranks x 2 micro-batches and 1 rank x 6";

  // ... and it is the float sum to within fp32 rounding.
  std::string worst;
  Replica floating(m);
  ParameterSet& float_params = floating.model->parameters();
  GradientReducer float_reducer(float_params, float_params.grads(), 512, transport, true);
  step_gradients(*floating.model, share_of(m, comm.rank(), K), 1, 1, 0.1f, comm, &float_reducer);
  EXPECT_LE(tensor_relative_difference(params, replica.grads(), floating.grads(), &worst), 1e-5)
      << worst;
}

// The path a GPU's gradients take with the MPI transport: every bucket
// copied to a host buffer, reduced there, copied back. On the CPU backend it
// must give bitwise the gradient of the direct path, float and exact sums.
TEST_P(UnevenShares, StagingThroughHostBuffersChangesNoBit) {
  const Communicator& comm = *g_comm;
  const ModelConfig m = shape(GetParam());
  MpiTransport transport;
  for (GradSum sum : {GradSum::kFloat, GradSum::kExact}) {
    std::vector<float> results[2];
    for (HostStaging staging : {HostStaging::kAuto, HostStaging::kAlways}) {
      Replica replica(m);
      ParameterSet& params = replica.model->parameters();
      GradientReducer reducer(params, params.grads(), 512, transport, true, sum, staging);
      EXPECT_EQ(reducer.stages_through_host(), staging == HostStaging::kAlways);
      step_gradients(*replica.model, share_of(m, comm.rank(), 2), 1, 1, 0.1f, comm, &reducer);
      results[staging == HostStaging::kAlways] = replica.grads();
    }
    EXPECT_TRUE(results[0] == results[1])
        << "host staging changed the " << to_string(sum) << " sum";
  }
}

TEST(DataParallel, TheExactSumTurnsAnOutOfRangeGradientIntoNaNOnEveryRank) {
  const Communicator& comm = *g_comm;
  const ModelConfig m = shape(ModelKind::kLm);
  Replica replica(m);
  ParameterSet& params = replica.model->parameters();
  MpiTransport transport;
  GradientReducer reducer(params, params.grads(), 512, transport, true, GradSum::kExact);
  reducer.begin_step();
  params.zero_grads();
  if (comm.rank() == 2) params.grads()[params.count() - 1] = std::ldexp(1.0f, kExactLimitBits);
  reducer.finish();
  EXPECT_TRUE(std::all_of(params.grads(), params.grads() + params.count(),
                          [](float g) { return std::isnan(g); }));
}

// fp16's loss scale through step_gradients: with S a power of two the exact
// sum is S times the unscaled one, bit for bit, though the scaled gradients
// pass the fixed point's limit 2^kExactLimitBits.
TEST(DataParallel, TheExactSumOfScaledGradientsIsTheScaledSum) {
  const Communicator& comm = *g_comm;
  const ModelConfig m = shape(ModelKind::kSeq2seq);
  const float S = 16777216.0f;  // 2^24, the loss scaler's largest
  std::vector<float> sums[2];
  for (float loss_scale : {1.0f, S}) {
    Replica replica(m);
    ParameterSet& params = replica.model->parameters();
    MpiTransport transport;
    GradientReducer reducer(params, params.grads(), 512, transport, true, GradSum::kExact);
    step_gradients(*replica.model, share_of(m, comm.rank(), 2), 1, 1, 0.1f, comm, &reducer,
                   loss_scale);
    sums[loss_scale != 1.0f] = replica.grads();
  }
  float largest = 0.0f;
  for (float g : sums[0]) largest = std::max(largest, std::fabs(g));
  ASSERT_GT(largest * S, std::ldexp(1.0f, kExactLimitBits))
      << "no scaled gradient passes the limit";
  int wrong = 0;
  for (size_t i = 0; i < sums[0].size(); ++i) wrong += sums[1][i] != sums[0][i] * S;
  EXPECT_EQ(wrong, 0) << "of " << sums[0].size() << " elements are not S times the unscaled sum";
}

// ---- the stream transport (NCCL's logic) on the CPU -----------------------

// One sequence of what a stream transport asks of the device and of the
// backend's ops, in the order the host issued them.
struct StreamLog {
  enum Kind { kComputeOp, kCommWaitsForCompute, kAllReduce, kRecordDone, kComputeWaitsFor };
  struct Entry {
    Kind kind;
    int slot;  // -1 for compute ops
  };
  std::vector<Entry> entries;
  int current_slot = -1;  // the slot whose collective comes next
  std::vector<std::string> faults;

  // Index of the first entry of `kind` for `slot`, or -1.
  int find(Kind kind, int slot) const {
    for (size_t i = 0; i < entries.size(); ++i)
      if (entries[i].kind == kind && entries[i].slot == slot) return static_cast<int>(i);
    return -1;
  }
};

// Every backend op (ProfiledOps calls begin once per op) as a compute entry.
class LoggingTimer final : public OpTimer {
 public:
  explicit LoggingTimer(StreamLog& log) : log_(log) {}
  void begin() override { log_.entries.push_back({StreamLog::kComputeOp, -1}); }
  void end() override {}
  std::vector<double> span_milliseconds() override { return {}; }
  void reset() override {}

 private:
  StreamLog& log_;
};

// Streams and events, as calls in the log. An event has passed once it was
// recorded (the CPU's ops are done when they return); querying one never
// recorded is a fault.
class FakeQueue final : public StreamQueue {
 public:
  explicit FakeQueue(StreamLog& log) : log_(log) {}
  void comm_waits_for_compute(int slot) override {
    log_.entries.push_back({StreamLog::kCommWaitsForCompute, slot});
    log_.current_slot = slot;
  }
  void record_done(int slot) override { log_.entries.push_back({StreamLog::kRecordDone, slot}); }
  bool done(int slot) override {
    if (log_.find(StreamLog::kRecordDone, slot) < 0)
      log_.faults.push_back("slot " + std::to_string(slot) + " queried before its done event");
    return true;
  }
  void compute_waits_for(int slot) override {
    log_.entries.push_back({StreamLog::kComputeWaitsFor, slot});
  }

 private:
  StreamLog& log_;
};

// NCCL's in-place SUM, done at once with MPI on the host.
class FakeCollective final : public StreamCollective {
 public:
  explicit FakeCollective(StreamLog& log) : log_(log) {}
  void all_reduce(float* x, size_t n) override {
    log_.entries.push_back({StreamLog::kAllReduce, log_.current_slot});
    MPI_Allreduce(MPI_IN_PLACE, x, static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  }
  void all_reduce(int64_t* x, size_t n) override {
    log_.entries.push_back({StreamLog::kAllReduce, log_.current_slot});
    MPI_Allreduce(MPI_IN_PLACE, x, static_cast<int>(n), MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  }
  std::string async_error() override { return ""; }

 private:
  StreamLog& log_;
};

// The order a GPU needs, on 3 ranks with uneven shares, for both sums:
//   - each bucket: the communication stream waits on a compute event, then
//     the collective, then its done event, with nothing between;
//   - exact sum: the bucket's fixed-point op is queued before that event;
//   - the compute stream waits on every done event before any op after the
//     last bucket (the exact sum's conversion, the optimizer);
// and the sums are bitwise the MPI transport's.
TEST_P(UnevenShares, TheStreamTransportOrdersItsStreamsAndSumsLikeMpi) {
  const Communicator& comm = *g_comm;
  const ModelConfig m = shape(GetParam());
  for (GradSum sum : {GradSum::kFloat, GradSum::kExact}) {
    SCOPED_TRACE(to_string(sum));
    Replica reference(m);
    {
      ParameterSet& params = reference.model->parameters();
      GradientReducer reducer(params, params.grads(), 512, std::make_unique<MpiTransport>(), true,
                              sum);
      step_gradients(*reference.model, share_of(m, comm.rank(), 2), 1, 1, 0.1f, comm, &reducer);
    }

    StreamLog log;
    std::unique_ptr<Ops> cpu = make_cpu_ops(1);
    ProfiledOps ops(*cpu, std::make_unique<LoggingTimer>(log));
    Model model(ops, m, ModelCapacity{kCapacity, m.max_len});
    model.init_parameters(21);
    ParameterSet& params = model.parameters();
    GradientReducer reducer(
        params, params.grads(), 512,
        std::make_unique<StreamTransport>("fake", std::make_unique<FakeQueue>(log),
                                          std::make_unique<FakeCollective>(log)),
        true, sum);
    EXPECT_FALSE(reducer.stages_through_host());
    step_gradients(model, share_of(m, comm.rank(), 2), 1, 1, 0.1f, comm, &reducer);
    double norm = 0.0;
    ops.sum_squares(&norm, params.grads(), params.count());  // the optimizer's first op

    EXPECT_TRUE(std::equal(params.grads(), params.grads() + params.count(),
                           reference.model->parameters().grads()))
        << "the stream transport's sum differs from MPI's";
    EXPECT_TRUE(log.faults.empty()) << log.faults.front();
    const int buckets = static_cast<int>(reducer.buckets().size());
    ASSERT_GE(buckets, 3);
    int last_done = -1, last_join = -1;
    for (int s = 0; s < buckets; ++s) {
      const int wait = log.find(StreamLog::kCommWaitsForCompute, s);
      const int reduce = log.find(StreamLog::kAllReduce, s);
      const int done = log.find(StreamLog::kRecordDone, s);
      const int join = log.find(StreamLog::kComputeWaitsFor, s);
      ASSERT_GE(wait, 0) << "slot " << s;
      EXPECT_EQ(reduce, wait + 1) << "slot " << s << ": the collective does not follow the wait";
      EXPECT_EQ(done, reduce + 1) << "slot " << s << ": the done event does not follow it";
      EXPECT_GT(join, done) << "slot " << s << ": compute never waits for it";
      if (sum == GradSum::kExact) {
        ASSERT_GE(wait, 1);
        EXPECT_EQ(log.entries[wait - 1].kind, StreamLog::kComputeOp)
            << "slot " << s << ": its fixed-point op is not queued before the event";
      }
      last_done = std::max(last_done, done);
      last_join = std::max(last_join, join);
    }
    int after_join = 0;
    for (int i = last_done + 1; i < static_cast<int>(log.entries.size()); ++i) {
      if (log.entries[i].kind != StreamLog::kComputeOp) continue;
      EXPECT_GT(i, last_join) << "a compute op was queued before the compute stream joined";
      ++after_join;
    }
    EXPECT_GE(after_join, sum == GradSum::kExact ? 2 : 1);
  }
}

INSTANTIATE_TEST_SUITE_P(AllKinds, UnevenShares,
                         ::testing::Values(ModelKind::kLm, ModelKind::kSeq2seq, ModelKind::kMlm),
                         [](const auto& info) { return std::string(to_string(info.param)); });

TEST(DataParallel, EmptyLastMicroBatchOnOneRankStillMatches) {
  // Rank 1's second micro-batch is empty, so its backward never reports;
  // its buckets start after backward, in the same order as everyone's.
  const Communicator& comm = *g_comm;
  const ModelConfig m = shape(ModelKind::kSeq2seq);
  std::vector<Batch> mine(2);
  mine[0] = random_batch(m, {6, 9}, {7, 5}, 10 + comm.rank());
  if (comm.rank() != 1) mine[1] = random_batch(m, {4}, {8}, 20 + comm.rank());
  Batch all;
  for (int k = 0; k < 2; ++k)
    for (int r = 0; r < comm.size(); ++r) {
      if (k == 1 && r == 1) continue;
      append_batch(&all, random_batch(m, k == 0 ? std::vector<int>{6, 9} : std::vector<int>{4},
                                      k == 0 ? std::vector<int>{7, 5} : std::vector<int>{8},
                                      (k == 0 ? 10 : 20) + r));
    }
  Replica single(m), replica(m);
  single.model->parameters().zero_grads();
  single.model->forward_backward(all, 0.0f, 1.0f / all.target_tokens(m.special.pad),
                                 PassId{1, 1, 0});
  ParameterSet& params = replica.model->parameters();
  MpiTransport transport;
  GradientReducer reducer(params, params.grads(), 300, transport, true);
  const StepGradients step = step_gradients(*replica.model, mine, 1, 1, 0.0f, comm, &reducer);
  EXPECT_EQ(step.global_targets, all.target_tokens(m.special.pad));
  EXPECT_LE(tensor_relative_difference(params, replica.grads(), single.grads(), nullptr), 1e-5);
}

TEST(DataParallel, AStepWithNoTokensAnywhereIsSkippedByEveryRank) {
  const Communicator& comm = *g_comm;
  const ModelConfig m = shape(ModelKind::kLm);
  Replica replica(m);
  ParameterSet& params = replica.model->parameters();
  std::fill(params.grads(), params.grads() + params.count(), 7.0f);  // must stay untouched
  MpiTransport transport;
  GradientReducer reducer(params, params.grads(), 512, transport, true);
  // Every rank: one micro-batch with sequences but only pad targets, one empty.
  std::vector<Batch> mine(2);
  mine[0] = random_batch(m, {5}, {}, 3);
  std::fill(mine[0].targets.begin(), mine[0].targets.end(), m.special.pad);
  const StepGradients step = step_gradients(*replica.model, mine, 1, 1, 0.1f, comm, &reducer);
  EXPECT_TRUE(step.skipped);
  EXPECT_EQ(step.global_targets, 0);
  EXPECT_TRUE(std::all_of(params.grads(), params.grads() + params.count(),
                          [](float g) { return g == 7.0f; }));
  // The reducer is left ready for the next step, which then works.
  std::vector<Batch> next(1);
  next[0] = random_batch(m, {6, 2}, {}, 40 + comm.rank());
  const StepGradients after = step_gradients(*replica.model, next, 1, 2, 0.1f, comm, &reducer);
  EXPECT_FALSE(after.skipped);
  EXPECT_GT(after.global_targets, 0);
}

// Each rank's text reaches every rank in rank order, an empty one included.
TEST(Communicator, AllgatherGivesEveryRanksTextInOrder) {
  const Communicator& comm = *g_comm;
  const std::string mine = comm.rank() == 1 ? "" : std::string(comm.rank() + 1, 'a' + comm.rank());
  const std::vector<std::string> all = comm.allgather(mine);
  ASSERT_EQ(all.size(), static_cast<size_t>(comm.size()));
  for (int r = 0; r < comm.size(); ++r)
    EXPECT_EQ(all[r], r == 1 ? "" : std::string(r + 1, 'a' + r)) << r;
}

// Ranks share a GPU when host and PCI address agree; SLURM's
// --gpus-per-task gives every rank device 0 of its own, which shares none.
TEST(SharedGpus, GroupsAreRanksOfOneHostAndAddress) {
  EXPECT_TRUE(shared_gpu_groups({"n1 0000:3B:00.0", "n1 0000:5C:00.0", "n2 0000:3B:00.0"}).empty());
  EXPECT_TRUE(shared_gpu_groups({"", "", ""}).empty());  // no GPUs: nothing shared
  const std::vector<std::vector<int>> groups =
      shared_gpu_groups({"n1 0000:3B:00.0", "n1 0000:5C:00.0", "n1 0000:3B:00.0", "n2 0000:5C:00.0",
                         "n2 0000:5C:00.0", "n2 0000:5C:00.0", ""});
  EXPECT_EQ(groups, (std::vector<std::vector<int>>{{0, 2}, {3, 4, 5}}));
  // Without GPUs (this machine's ranks) no rank shares one.
  if (cuda_device_count() == 0) {
    EXPECT_TRUE(ranks_sharing_gpus(*g_comm).empty());
  }
}

TEST(ReplicaCheck, FindsTheFirstDivergedTensorAndTheRankThatHoldsIt) {
  const Communicator& comm = *g_comm;
  Replica replica(shape(ModelKind::kSeq2seq));
  ParameterSet& params = replica.model->parameters();
  EXPECT_FALSE(check_replicas(params, comm).found());

  // Rank 2 changes tensor 9 and rank 1 tensor 5, by one bit each.
  const int changed = comm.rank() == 1 ? 5 : comm.rank() == 2 ? 9 : -1;
  if (changed >= 0) {
    float* x = params.param(changed);
    x[0] = std::nextafter(x[0], 1e30f);
  }
  const ReplicaMismatch mismatch = check_replicas(params, comm);
  ASSERT_TRUE(mismatch.found());
  EXPECT_EQ(mismatch.tensor, params.info()[5].name);
  EXPECT_EQ(mismatch.rank, 1);
}

// The progress line's tok/s is every rank's real tokens over the window's
// step time, the time ms/step counts: an evaluation or a checkpoint write
// in the window is left out of both.
TEST(ProgressWindow, TokensPerSecondAreRealTokensOverTheStepTime) {
  const Communicator& comm = *g_comm;
  ProgressWindow window;
  window.start_clock();
  Batch batch;  // rank r: r + 1 sequences of 10 tokens
  const std::vector<int32_t> ids(10, 7);
  for (int b = 0; b <= comm.rank(); ++b) batch.decoder.append(ids.data(), 10);
  window.add_batch(batch);
  window.add_step(LossSums{}, ReduceTiming{});
  std::this_thread::sleep_for(std::chrono::milliseconds(60));
  window.add_other_time(0.04);  // an evaluation, say, of the window's 60+ ms
  const ProgressWindow::Line line = window.close(1, 10, 1e-3f, 0.0, 1.0f, false, {}, comm);
  const int W = comm.size();
  const double real = 10.0 * W * (W + 1) / 2;
  // One step: ms/step is the step time itself.
  EXPECT_NEAR(line.row.tokens_per_s * line.row.step_ms / 1000.0, real, 1e-9 * real);
  EXPECT_GE(line.row.step_ms, 20.0);
}

}  // namespace
}  // namespace mpiformer

// One process per rank: every rank runs every test; the job fails when any
// rank fails. Only rank 0 prints the usual report; others print failures.
int main(int argc, char** argv) {
  mpiformer::Communicator comm(&argc, &argv);
  mpiformer::g_comm = &comm;
  ::testing::InitGoogleTest(&argc, argv);
  if (!comm.is_root()) {
    ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  const int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  const int64_t failed_ranks = comm.allreduce_sum(static_cast<int64_t>(failed));
  if (failed && !comm.is_root()) std::fprintf(stderr, "[rank %d] tests failed\n", comm.rank());
  return failed_ranks > 0 ? 1 : 0;
}
