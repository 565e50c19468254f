// The gradient reducer without MPI: how buckets are cut, when they start
// (during backward, in order, each once), and the model's promise the
// overlap rests on: a gradient reported final never changes afterwards.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/observed_ops.h"
#include "src/model/model.h"
#include "src/parallel/gradient_reducer.h"
#include "src/parallel/stream_transport.h"
#include "tests/forwarding_device.h"
#include "tests/test_batches.h"

namespace mpiformer {
namespace {

using testing::random_batch;
using testing::tiny;

// Records what the reducer asks for; a reduction completes on its second test.
class RecordingTransport : public ReduceTransport {
 public:
  struct Start {
    int slot;
    const float* x;
    size_t n;
  };
  std::vector<Start> starts;
  std::vector<int> tests_left;

  std::string name() const override { return "recording"; }
  void start(int slot, int64_t*, size_t n) override {
    start(slot, static_cast<float*>(nullptr), n);
  }
  void start(int slot, float* x, size_t n) override {
    starts.push_back({slot, x, n});
    if (static_cast<size_t>(slot) >= tests_left.size()) tests_left.resize(slot + 1, 0);
    tests_left[slot] = 2;
  }
  bool test(int slot) override { return tests_left[slot] == 0 || --tests_left[slot] == 0; }
};

// Snapshots grads[offset, end) at every report, to compare with the end.
class SnapshotListener : public GradientListener {
 public:
  explicit SnapshotListener(const ParameterSet& p) : params(p) {}
  void gradients_final(size_t offset) override {
    offsets.push_back(offset);
    const float* g = const_cast<ParameterSet&>(params).grads();
    snapshots.emplace_back(g + offset, g + params.count());
  }
  const ParameterSet& params;
  std::vector<size_t> offsets;
  std::vector<std::vector<float>> snapshots;
};

struct Tiny {
  std::unique_ptr<Ops> ops = make_cpu_ops(1);
  std::unique_ptr<Model> model;
  Batch batch;
  explicit Tiny(const ModelConfig& m) {
    model = std::make_unique<Model>(*ops, m, ModelCapacity{64, m.max_len});
    model->init_parameters(5);
    batch = random_batch(m, {5, 9, 3}, {4, 7, 6}, 11);
  }
};

std::vector<ModelConfig> every_layout() {
  std::vector<ModelConfig> all;
  for (ModelKind kind : {ModelKind::kLm, ModelKind::kSeq2seq, ModelKind::kMlm}) {
    ModelConfig m = tiny(kind);
    all.push_back(m);
    m.tied_embeddings = false;
    m.pre_norm = false;
    all.push_back(m);
  }
  return all;
}

TEST(ModelGradientListener, ReportedGradientsNeverChangeAfterwards) {
  for (const ModelConfig& m : every_layout()) {
    SCOPED_TRACE(std::string(to_string(m.kind)) +
                 (m.tied_embeddings ? " tied pre-LN" : " untied post-LN"));
    Tiny t(m);
    ParameterSet& params = t.model->parameters();
    params.zero_grads();
    // An earlier micro-batch, then the last one with the listener: the
    // reports speak of the accumulated gradient.
    t.model->forward_backward(random_batch(m, {7}, {8}, 3), 0.1f, 0.01f, PassId{1, 1, 0});
    SnapshotListener listener(params);
    t.model->forward_backward(t.batch, 0.1f, 0.01f, PassId{1, 1, 1}, &listener);

    ASSERT_FALSE(listener.offsets.empty());
    EXPECT_EQ(listener.offsets.back(), 0u);
    EXPECT_TRUE(std::is_sorted(listener.offsets.rbegin(), listener.offsets.rend()));
    // One report per sub-layer at least, so buckets can start layer by layer.
    const int sublayers = m.kind == ModelKind::kSeq2seq ? 2 * 2 + 3 * 2 : 2 * 2;
    EXPECT_GE(static_cast<int>(listener.offsets.size()), sublayers);
    const float* final_grads = params.grads();
    for (size_t i = 0; i < listener.offsets.size(); ++i) {
      const size_t offset = listener.offsets[i];
      EXPECT_TRUE(std::equal(listener.snapshots[i].begin(), listener.snapshots[i].end(),
                             final_grads + offset))
          << "gradients from offset " << offset << " changed after being reported final";
    }
  }
}

TEST(GradientReducer, BucketsTileTheBufferInReverseTensorOrder) {
  Tiny t(tiny(ModelKind::kSeq2seq));
  const ParameterSet& params = t.model->parameters();
  for (size_t bucket_floats : {size_t{1}, size_t{700}, size_t{5000}, params.count() * 2}) {
    const std::vector<GradientBucket> buckets = plan_buckets(params.info(), bucket_floats);
    ASSERT_FALSE(buckets.empty());
    EXPECT_EQ(buckets.front().end, params.count());
    EXPECT_EQ(buckets.back().begin, 0u);
    EXPECT_EQ(buckets.front().last_tensor, static_cast<int>(params.info().size()) - 1);
    for (size_t i = 0; i < buckets.size(); ++i) {
      const GradientBucket& b = buckets[i];
      EXPECT_EQ(b.begin, params.info()[b.first_tensor].offset);
      EXPECT_EQ(b.end, params.info()[b.last_tensor].offset + params.info()[b.last_tensor].size);
      if (i + 1 < buckets.size()) {
        EXPECT_EQ(buckets[i + 1].end, b.begin);  // no gap, no overlap
        EXPECT_GE(b.size(), bucket_floats);      // only the last may be short
        // ... and a bucket is closed as soon as it is big enough.
        EXPECT_LT(b.size() - params.info()[b.first_tensor].size, bucket_floats);
      }
    }
    if (bucket_floats == 1) {
      EXPECT_EQ(buckets.size(), params.info().size());
    }
    if (bucket_floats > params.count()) {
      EXPECT_EQ(buckets.size(), 1u);
    }
  }
}

TEST(GradientReducer, OverlapStartsBucketsInOrderDuringBackwardEachOnce) {
  for (bool overlap : {true, false}) {
    SCOPED_TRACE(overlap ? "overlap on" : "overlap off");
    Tiny t(tiny(ModelKind::kLm));
    ParameterSet& params = t.model->parameters();
    RecordingTransport transport;
    GradientReducer reducer(params, params.grads(), 600, transport, overlap);
    const int n = static_cast<int>(reducer.buckets().size());
    ASSERT_GE(n, 4);
    for (int step = 1; step <= 2; ++step) {
      transport.starts.clear();
      params.zero_grads();
      reducer.begin_step();
      t.model->forward_backward(t.batch, 0.1f, 0.01f, PassId{1, step, 0}, &reducer);
      const size_t during_backward = transport.starts.size();
      const ReduceTiming timing = reducer.finish();
      if (overlap) {
        // Everything but the shared embedding bucket could start early.
        EXPECT_GE(during_backward, static_cast<size_t>(n - 1));
      } else {
        EXPECT_EQ(during_backward, 0u);
        EXPECT_EQ(timing.hidden_s, 0.0);
      }
      ASSERT_EQ(static_cast<int>(transport.starts.size()), n);
      for (int i = 0; i < n; ++i) {
        EXPECT_EQ(transport.starts[i].slot, i);
        EXPECT_EQ(transport.starts[i].x, params.grads() + reducer.buckets()[i].begin);
        EXPECT_EQ(transport.starts[i].n, reducer.buckets()[i].size());
      }
      EXPECT_EQ(timing.bytes, params.count() * sizeof(float));
      EXPECT_EQ(timing.buckets, n);
      EXPECT_GE(timing.in_flight_s, timing.hidden_s);
      EXPECT_GE(timing.hidden_share(), 0.0);
      EXPECT_LE(timing.hidden_share(), 1.0);
    }
  }
}

TEST(GradientReducer, EarlierMicroBatchesAndEmptyPassesStartNothingEarly) {
  Tiny t(tiny(ModelKind::kMlm));
  ParameterSet& params = t.model->parameters();
  RecordingTransport transport;
  GradientReducer reducer(params, params.grads(), 600, transport, true);
  // Not armed: reports of an earlier micro-batch are ignored.
  t.model->forward_backward(t.batch, 0.1f, 0.01f, PassId{1, 1, 0}, &reducer);
  EXPECT_TRUE(transport.starts.empty());
  // Armed, but this rank's last micro-batch is empty: finish starts them all.
  reducer.begin_step();
  t.model->forward_backward(Batch{}, 0.1f, 0.01f, PassId{1, 1, 1}, &reducer);
  EXPECT_TRUE(transport.starts.empty());
  reducer.finish();
  EXPECT_EQ(transport.starts.size(), reducer.buckets().size());
}

// A GPU's copies to the host, slowed down: a copy is carried out only when
// its slot has been asked about three times, so a reducer that reads the
// host buffer (or copies it back) before the copy arrived sees stale bits.
class SlowCopies final : public ForwardingDevice {
 public:
  explicit SlowCopies(Device& inner) : ForwardingDevice(inner) {}
  void copy_to_host_async(int slot, void* dst, const void* src, size_t bytes) override {
    if (static_cast<size_t>(slot) >= pending_.size()) pending_.resize(slot + 1);
    pending_[slot] = {dst,
                      std::vector<unsigned char>(static_cast<const unsigned char*>(src),
                                                 static_cast<const unsigned char*>(src) + bytes),
                      3};
  }
  bool host_copy_done(int slot) override {
    Pending& p = pending_.at(slot);
    if (p.queries_left > 0 && --p.queries_left == 0)
      std::copy(p.bytes.begin(), p.bytes.end(), static_cast<unsigned char*>(p.dst));
    return p.queries_left == 0;
  }

 private:
  struct Pending {
    void* dst;
    std::vector<unsigned char> bytes;  // what the device held when the copy was queued
    int queries_left;
  };
  std::vector<Pending> pending_;
};

// Host staging with copies that arrive late: each bucket's all-reduce
// starts only once its copy has arrived, still in bucket order, and the sum
// is bitwise the one without staging.
TEST(GradientReducer, StagedBucketsStartInOrderOnlyAfterTheirCopiesArrive) {
  for (GradSum sum : {GradSum::kFloat, GradSum::kExact}) {
    SCOPED_TRACE(to_string(sum));
    std::vector<float> results[2];
    for (HostStaging staging : {HostStaging::kAuto, HostStaging::kAlways}) {
      std::unique_ptr<Ops> cpu = make_cpu_ops(1);
      SlowCopies slow(cpu->device());
      ObservedOps ops(*cpu, slow);
      const ModelConfig m = tiny(ModelKind::kLm);
      Model model(ops, m, ModelCapacity{64, m.max_len});
      model.init_parameters(5);
      ParameterSet& params = model.parameters();
      RecordingTransport transport;
      GradientReducer reducer(params, params.grads(), 600, transport, true, sum, staging);
      ASSERT_EQ(reducer.stages_through_host(), staging == HostStaging::kAlways);
      params.zero_grads();
      reducer.begin_step();
      model.forward_backward(random_batch(m, {5, 9, 3}, {4, 7, 6}, 11), 0.1f, 0.01f,
                             PassId{1, 1, 0}, &reducer);
      reducer.finish();
      const int n = static_cast<int>(reducer.buckets().size());
      ASSERT_GE(n, 4);
      ASSERT_EQ(static_cast<int>(transport.starts.size()), n);
      for (int i = 0; i < n; ++i) EXPECT_EQ(transport.starts[i].slot, i);
      results[staging == HostStaging::kAlways].assign(params.grads(),
                                                      params.grads() + params.count());
    }
    EXPECT_TRUE(results[0] == results[1]) << "staging with late copies changed the sum";
  }
}

// fp16's gradients carry the loss scale S. The exact sum shifts its fixed
// point by S's exponent: a gradient whose true value is in range counts as
// in range, and for S a power of two the integers are those of the unscaled
// gradient, so the sum is S times the unscaled sum, bit for bit.
TEST(GradientReducer, TheExactSumTakesGradientsThatCarryTheLossScale) {
  Tiny t(tiny(ModelKind::kLm));
  ParameterSet& params = t.model->parameters();
  const size_t n = params.count();
  float* grads = params.grads();
  RecordingTransport one_rank;
  GradientReducer reducer(params, grads, 600, one_rank, true, GradSum::kExact);
  // Two micro-batches of true values m 2^k (|m| < 2^10, k in [-30, 8]): up
  // to 2^18, inside the limit 2^kExactLimitBits, yet far beyond it scaled.
  std::mt19937 rng(7);
  auto true_values = [&] {
    std::vector<float> g(n);
    for (float& x : g)
      x = std::ldexp(static_cast<float>(static_cast<int>(rng() % 2047) - 1023),
                     static_cast<int>(rng() % 39) - 30);
    return g;
  };
  const std::vector<float> a = true_values(), b = true_values();
  auto sum_scaled = [&](float S) {
    reducer.begin_step(S);
    for (size_t i = 0; i < n; ++i) grads[i] = a[i] * S;
    reducer.absorb_micro_batch();
    for (size_t i = 0; i < n; ++i) grads[i] = b[i] * S;
    reducer.finish();
  };

  sum_scaled(65536.0f);
  int wrong = 0;
  for (size_t i = 0; i < n; ++i) {
    const int64_t fixed = std::llround(std::ldexp(static_cast<double>(a[i]), kExactFractionBits)) +
                          std::llround(std::ldexp(static_cast<double>(b[i]), kExactFractionBits));
    const float unscaled =
        static_cast<float>(std::ldexp(static_cast<double>(fixed), -kExactFractionBits));
    if (grads[i] != unscaled * 65536.0f && ++wrong <= 3)
      ADD_FAILURE() << "element " << i << ": " << grads[i] << ", not " << unscaled * 65536.0f;
  }
  EXPECT_EQ(wrong, 0) << "of " << n << " elements differ from 2^16 times the unscaled sum";

  // A scale that is no power of two: the sum to within fp32 rounding.
  const float S = 3000.0f;
  sum_scaled(S);
  wrong = 0;
  for (size_t i = 0; i < n; ++i) {
    const double expected = (static_cast<double>(a[i]) + b[i]) * S;
    const double tolerance = (std::fabs(a[i]) + std::fabs(b[i])) * S * 0x1p-22 + 0x1p-26;
    if (!(std::fabs(grads[i] - expected) <= tolerance) && ++wrong <= 3)
      ADD_FAILURE() << "element " << i << ": " << grads[i] << ", not " << expected;
  }
  EXPECT_EQ(wrong, 0) << "of " << n << " elements are off with S = " << S;

  // The limit still holds for the true value: just below it the sum is
  // exact, at it the whole step's gradient is NaN.
  const float largest = std::nextafter(std::ldexp(1.0f, kExactLimitBits), 0.0f);
  for (float value : {largest, std::ldexp(1.0f, kExactLimitBits)}) {
    reducer.begin_step(65536.0f);
    std::fill(grads, grads + n, 0.0f);
    grads[n / 2] = value * 65536.0f;
    reducer.finish();
    if (value == largest) {
      EXPECT_EQ(grads[n / 2], value * 65536.0f);
      EXPECT_EQ(grads[0], 0.0f);
    } else {
      EXPECT_TRUE(std::all_of(grads, grads + n, [](float g) { return std::isnan(g); }));
    }
  }
}

// Counts the exact sum's calls by op name, " first" added to an
// accumulation that wrote the step's first contribution.
class CountingOps final : public ObservedOps {
 public:
  using ObservedOps::ObservedOps;
  std::map<std::string, int> calls;

 protected:
  void begin(const OpCall& call) override {
    std::string name = call.name;
    if (name.rfind("fixed_point_", 0) != 0) return;
    for (const OpCall::Size& size : call.sizes)
      if (std::string(size.name) == "first" && size.value) name += " first";
    ++calls[name];
  }
};

// One way to sum a step: the transport, the micro-batches, host staging,
// the loss scale the gradients carry (infinite: spoiled) and a gradient
// scale that puts elements out of range.
struct ExactStep {
  bool one_rank;
  int micro_batches;
  HostStaging staging;
  float loss_scale;
  float grad_scale;
};

// The step's summed gradient and the exact sum's calls, direct or buffered.
std::vector<float> exact_step(const ExactStep& c, bool direct, std::map<std::string, int>* calls) {
  std::unique_ptr<Ops> cpu = make_cpu_ops(1);
  CountingOps ops(*cpu);
  const ModelConfig m = tiny(ModelKind::kLm);
  Model model(ops, m, ModelCapacity{64, m.max_len});
  model.init_parameters(5);
  ParameterSet& params = model.parameters();
  LocalTransport local;
  RecordingTransport recording;
  ReduceTransport& transport = c.one_rank ? static_cast<ReduceTransport&>(local) : recording;
  GradientReducer reducer(params, params.grads(), 600, transport, true, GradSum::kExact, c.staging);
  reducer.set_direct_exact_sum(direct);
  for (int step = 0; step < 2; ++step) {  // the second step sees the first's leftovers
    params.zero_grads();
    reducer.begin_step(c.loss_scale, c.micro_batches);
    for (int k = 0; k < c.micro_batches; ++k) {
      if (k > 0 && reducer.absorb_micro_batch()) params.zero_grads();
      const bool last = k + 1 == c.micro_batches;
      model.forward_backward(random_batch(m, {5, 9, 3}, {4, 7, 6}, 11 + k + 7 * step), 0.1f,
                             c.grad_scale, PassId{1, step, k}, last ? &reducer : nullptr);
    }
    reducer.finish();
  }
  *calls = ops.calls;
  return std::vector<float>(params.grads(), params.grads() + params.count());
}

// The direct exact sum gives the buffered one's bits: one rank's single
// micro-batch rounded in place (no accumulation), the first of several
// micro-batches written rather than added, other transports and host
// staging (written, not rounded), gradients that carry a loss scale, and
// steps spoiled by an element out of range or a non-finite scale.
TEST(GradientReducer, TheDirectExactSumGivesTheBufferedBits) {
  const ExactStep cases[] = {
      {true, 1, HostStaging::kAuto, 1.0f, 0.01f},     {true, 3, HostStaging::kAuto, 1.0f, 0.01f},
      {true, 1, HostStaging::kAlways, 1.0f, 0.01f},   {false, 1, HostStaging::kAuto, 1.0f, 0.01f},
      {false, 2, HostStaging::kAuto, 1.0f, 0.01f},    {true, 1, HostStaging::kAuto, 3000.0f, 30.0f},
      {true, 1, HostStaging::kAuto, INFINITY, 0.01f}, {true, 1, HostStaging::kAuto, 1.0f, 1e9f},
      {false, 1, HostStaging::kAuto, 1.0f, 1e9f}};
  for (const ExactStep& c : cases) {
    SCOPED_TRACE("one rank " + std::to_string(c.one_rank) + ", micro-batches " +
                 std::to_string(c.micro_batches) + ", staged " +
                 std::to_string(c.staging == HostStaging::kAlways) + ", loss scale " +
                 std::to_string(c.loss_scale) + ", gradient scale " + std::to_string(c.grad_scale));
    std::map<std::string, int> direct_calls, buffered_calls;
    const std::vector<float> direct = exact_step(c, true, &direct_calls);
    const std::vector<float> buffered = exact_step(c, false, &buffered_calls);
    EXPECT_EQ(std::memcmp(direct.data(), buffered.data(), direct.size() * sizeof(float)), 0);
    const bool spoiled = !std::isfinite(c.loss_scale) || c.grad_scale > 1e6f;
    EXPECT_EQ(std::isnan(direct[0]), spoiled);

    // Two steps each: the buffered way adds into zeros and reads back;
    // the direct way writes the first contribution, or rounds in place.
    const bool rounds = c.one_rank && c.micro_batches == 1 && c.staging == HostStaging::kAuto;
    EXPECT_EQ(buffered_calls.count("fixed_point_accumulate first"), 0u);
    EXPECT_EQ(buffered_calls["fixed_point_to_float"], 2);
    EXPECT_EQ(direct_calls["fixed_point_round"] > 0, rounds);
    EXPECT_EQ(direct_calls["fixed_point_poison"], rounds ? 2 : 0);
    EXPECT_EQ(direct_calls["fixed_point_to_float"], rounds ? 0 : 2);
    EXPECT_EQ(direct_calls["fixed_point_accumulate"] + direct_calls["fixed_point_accumulate first"],
              rounds ? 0 : buffered_calls["fixed_point_accumulate"]);
    if (c.micro_batches > 1) {
      EXPECT_EQ(direct_calls["fixed_point_accumulate first"], 2);
    }
  }
}

// One rank's direct exact sum of a single micro-batch keeps no fixed-point
// buffer, only the out-of-range count; a step of several micro-batches
// makes the buffer at its start, once, and one that absorbs more than it
// announced is refused.
TEST(GradientReducer, OneRanksSingleMicroBatchNeedsNoFixedPointBuffer) {
  Tiny t(tiny(ModelKind::kLm));
  ParameterSet& params = t.model->parameters();
  const size_t buffer = (params.count() + 1) * sizeof(int64_t);
  Device& device = params.ops().device();
  LocalTransport local;
  const size_t before = device.peak_allocated_bytes();
  GradientReducer reducer(params, params.grads(), 600, local, true, GradSum::kExact);
  reducer.begin_step(1.0f, 1);
  reducer.finish();
  const size_t single = device.peak_allocated_bytes();
  EXPECT_LT(single - before, size_t{1024}) << "one micro-batch: the count alone";

  reducer.begin_step(1.0f, 1);
  EXPECT_THROW(reducer.absorb_micro_batch(), std::logic_error);
  reducer.finish();
  reducer.begin_step(1.0f, 2);
  EXPECT_GE(device.peak_allocated_bytes() - before, buffer) << "two: the whole buffer";
  reducer.absorb_micro_batch();
  reducer.finish();
  const size_t whole = device.peak_allocated_bytes();
  reducer.begin_step(1.0f, 1);  // kept, not made again
  reducer.finish();
  EXPECT_EQ(device.peak_allocated_bytes(), whole);
  EXPECT_THROW(reducer.begin_step(1.0f, 0), std::logic_error);
}

TEST(GradientReducer, TheFixedPointShiftsByTheLeastExponentThatHoldsTheScale) {
  EXPECT_EQ(exact_scale_exponent(1.0f), 0);
  EXPECT_EQ(exact_scale_exponent(65536.0f), 16);
  EXPECT_EQ(exact_scale_exponent(16777216.0f), 24);
  EXPECT_EQ(exact_scale_exponent(3000.0f), 12);  // 2^11 < 3000 <= 2^12
  EXPECT_EQ(exact_scale_exponent(0.5f), -1);
  EXPECT_EQ(exact_scale_exponent(0x1p100f), kExactMaxScaleExponent);
  EXPECT_EQ(exact_scale_exponent(0x1p-100f), -kExactMaxScaleExponent);
  for (float S : {0.0f, -4.0f, INFINITY, NAN}) EXPECT_EQ(exact_scale_exponent(S), 0) << S;
}

// A non-finite scale (an overflow injected on one rank) makes the step's
// gradient NaN even where the gradients themselves are finite: a rank with
// no data this step sums zeros.
TEST(GradientReducer, ANonFiniteLossScaleMakesTheExactSumNaN) {
  Tiny t(tiny(ModelKind::kLm));
  ParameterSet& params = t.model->parameters();
  RecordingTransport one_rank;
  GradientReducer reducer(params, params.grads(), 600, one_rank, true, GradSum::kExact);
  for (float S : {INFINITY, -INFINITY, NAN, 1.0f}) {
    SCOPED_TRACE("S = " + std::to_string(S));
    reducer.begin_step(S);
    params.zero_grads();
    reducer.finish();
    const float* g = params.grads();
    if (std::isfinite(S))
      EXPECT_TRUE(std::all_of(g, g + params.count(), [](float x) { return x == 0.0f; }));
    else
      EXPECT_TRUE(std::all_of(g, g + params.count(), [](float x) { return std::isnan(x); }));
  }
}

// A stream transport whose collective failed (a peer died): the done events
// never pass, and the collective reports the error after a few queries.
// finish() must throw it rather than wait; the queue gives up (and the test
// fails) where a reducer would have polled forever.
class StalledQueue final : public StreamQueue {
 public:
  static constexpr int kGiveUp = 10000;
  int polls = 0;
  void comm_waits_for_compute(int) override {}
  void record_done(int) override {}
  bool done(int slot) override {
    if (++polls > kGiveUp)
      throw std::logic_error("slot " + std::to_string(slot) + " still polled after " +
                             std::to_string(kGiveUp) + " queries: the collective's error was " +
                             "never seen");
    return false;
  }
  void compute_waits_for(int) override {}
};

class FailingCollective final : public StreamCollective {
 public:
  explicit FailingCollective(int queries_before_error) : queries_left_(queries_before_error) {}
  void all_reduce(float*, size_t) override {}
  void all_reduce(int64_t*, size_t) override {}
  std::string async_error() override {
    if (queries_left_ == 0) return "remote process exited";
    --queries_left_;
    return "";
  }

 private:
  int queries_left_;
};

TEST(GradientReducer, AFailedStreamCollectiveMakesFinishThrowInsteadOfWaiting) {
  for (GradSum sum : {GradSum::kFloat, GradSum::kExact}) {
    SCOPED_TRACE(to_string(sum));
    Tiny t(tiny(ModelKind::kLm));
    ParameterSet& params = t.model->parameters();
    auto queue = std::make_unique<StalledQueue>();
    const StalledQueue& polled = *queue;
    GradientReducer reducer(params, params.grads(), 600,
                            std::make_unique<StreamTransport>(
                                "fake", std::move(queue), std::make_unique<FailingCollective>(3)),
                            true, sum);
    reducer.begin_step();
    try {
      reducer.finish();
      ADD_FAILURE() << "finish() returned though the collective failed";
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "fake transport: remote process exited");
    } catch (const std::logic_error& e) {
      ADD_FAILURE() << e.what();
    }
    EXPECT_LE(polled.polls, 10);
  }
}

TEST(GradientReducer, RefusesOffsetsThatGoBackUp) {
  Tiny t(tiny(ModelKind::kLm));
  ParameterSet& params = t.model->parameters();
  RecordingTransport transport;
  GradientReducer reducer(params, params.grads(), 600, transport, true);
  reducer.begin_step();
  reducer.gradients_final(params.count() / 2);
  EXPECT_THROW(reducer.gradients_final(params.count() / 2 + 1), std::logic_error);
  EXPECT_THROW(reducer.begin_step(), std::logic_error);
}

}  // namespace
}  // namespace mpiformer
