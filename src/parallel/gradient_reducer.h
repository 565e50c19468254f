// The gradient all-reduce, bucketed and overlapped with backward.
//
// The flat gradient buffer is cut into buckets of whole tensors, in reverse
// buffer order (the order backward finishes them). On the last micro-batch
// of a step the model reports, block by block, the lowest offset whose
// gradient is final; every bucket above it starts its SUM at once, while
// backward goes on below. finish() starts what is left (all of it on a rank
// with no data this step) and waits. Buckets always start in the same order,
// so every rank issues the same collectives in the same order.
//
// Two ways to sum (--grad-sum):
//   float  sums fp32 gradients in place: the result depends, in its last
//          bits, on how micro-batches fall across ranks (summation order).
//   exact  turns each micro-batch's gradient into 64-bit fixed point
//          (2^-40 resolution, in units of the gradient without fp16's loss
//          scale) and sums integers, which is associative: the step's
//          gradient is then bitwise the same for any world size and
//          accumulation split. Twice the bytes on the wire, one extra pass
//          over the gradient per micro-batch. The conversions are backend
//          ops (Ops::fixed_point_accumulate, a kernel on a GPU), so the
//          fixed-point sum lives where the gradients do.
//
// Sharded optimizer (ZeRO-1, set_owners): each bucket is reduced to the
// owners of its elements instead (ReduceTransport::start_reduce_to_owners),
// so after finish() a rank holds the summed gradient of its own slice only;
// the rest of grads is garbage and must not be read. With the exact sum the
// out-of-range count is all-reduced beside the bucket at offset 0, so an
// overflow makes every rank's slice NaN, and only the slice is converted.
//
// Memory: a transport that takes the backend's memory (NCCL, or the local
// one) reads the gradients (or the fixed-point sum) in place. One that
// wants host memory (MPI) on a backend whose memory is a GPU's gets each
// bucket copied to pinned host memory when it is final, a copy queued
// behind the kernels that wrote it; the bucket's all-reduce starts once
// the host sees the copy arrive (buckets still start in order), and the
// sums go back in one copy queued before the optimizer. Neither the host
// nor the GPU waits for a copy while backward runs.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <vector>

#include "src/core/config.h"
#include "src/core/parameters.h"
#include "src/model/gradient_listener.h"
#include "src/parallel/transport.h"

namespace mpiformer {

struct GradientBucket {
  size_t begin = 0;  // floats from the start of the buffer
  size_t end = 0;
  int first_tensor = 0;  // tensor indices [first_tensor, last_tensor]
  int last_tensor = 0;
  size_t size() const { return end - begin; }
};

// Where the all-reduce time of a step went.
struct ReduceTiming {
  double in_flight_s = 0.0;  // union of each bucket's [start, seen complete]
  double hidden_s = 0.0;     // the part of in_flight_s before backward ended
  double wait_s = 0.0;       // from backward's end to the last bucket's completion
  size_t bytes = 0;          // bytes all-reduced this step
  int buckets = 0;

  // Share of all-reduce time spent while backward was still running.
  double hidden_share() const { return in_flight_s > 0 ? hidden_s / in_flight_s : 0.0; }
  ReduceTiming& operator+=(const ReduceTiming& o);
};

// Cuts tensors [0, count) into buckets of at least bucket_floats (a larger
// tensor is a bucket of its own), from the last tensor to the first.
std::vector<GradientBucket> plan_buckets(const std::vector<ParamInfo>& tensors,
                                         size_t bucket_floats);

// Fixed point of the exact sum: value = integer * 2^-kExactFractionBits. A
// micro-batch's gradient element must be below 2^kExactLimitBits in
// magnitude (the mean-loss gradient is a token-weighted mean, so the sum
// stays below that bound too); a larger or non-finite one makes the whole
// step's gradient NaN on every rank, as a float sum would.
constexpr int kExactFractionBits = 40;
constexpr int kExactLimitBits = 20;

// Gradients that carry fp16's loss scale S are converted with the fixed
// point shifted by e = exact_scale_exponent(S), the least e with S <= 2^e:
// kExactFractionBits - e fraction bits and the limit 2^(kExactLimitBits + e).
// The limit then bounds the gradient without S, the integers keep their
// range, and for S a power of two they are exactly those of the unscaled
// gradient. e is clamped to +-kExactMaxScaleExponent, far beyond the loss
// scaler's [1, 2^24]; a non-finite or non-positive S gives 0.
constexpr int kExactMaxScaleExponent = 32;
int exact_scale_exponent(float loss_scale);

// Whether the reducer copies buckets through host buffers: kAuto when the
// transport wants host memory and the backend's is a GPU's, kAlways to
// exercise that path on any backend (tests).
enum class HostStaging { kAuto, kAlways };

class GradientReducer : public GradientListener {
 public:
  // overlap false: nothing starts before finish() (one burst after backward).
  // grads: backend memory (params.count()).
  GradientReducer(const ParameterSet& params, float* grads, size_t bucket_floats,
                  ReduceTransport& transport, bool overlap, GradSum sum = GradSum::kFloat,
                  HostStaging staging = HostStaging::kAuto);
  // The same, owning its transport.
  GradientReducer(const ParameterSet& params, float* grads, size_t bucket_floats,
                  std::unique_ptr<ReduceTransport> transport, bool overlap,
                  GradSum sum = GradSum::kFloat, HostStaging staging = HostStaging::kAuto);

  ~GradientReducer() override;
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  bool stages_through_host() const { return staged_; }
  // Sharded optimizer: bounds (world + 1) of the ranks' slices
  // (src/core/shard_plan.h), and this rank. Before the first step.
  void set_owners(std::vector<size_t> bounds, int rank);

  const std::vector<GradientBucket>& buckets() const { return buckets_; }
  ReduceTransport& transport() { return transport_; }
  GradSum sum() const { return sum_; }
  size_t bytes_per_step() const;
  // Whether the exact sum is direct (at first Ops::direct_exact_sum): the
  // step's first contribution is written into the fixed-point buffer rather
  // than added to zeros, and one rank's single contribution is rounded in
  // place in the gradients without the buffer. Tests compare it with the
  // buffered way, which gives the same bits. Between steps.
  void set_direct_exact_sum(bool direct) { direct_ = direct; }

  // At the start of a step, before any backward pass. loss_scale: what the
  // step's gradients carry (fp16's S); with the exact sum a non-finite one
  // makes the step's gradient NaN on every rank, as an overflow would, even
  // where this rank's gradients are finite (no data this step).
  // micro_batches: the backward passes of the step (absorb_micro_batch
  // between them). One rank's direct exact sum of one micro-batch needs no
  // fixed-point buffer; the first step of more allocates it, once.
  void begin_step(float loss_scale = 1.0f, int micro_batches = 1);
  // Between micro-batches: with the exact sum, takes the gradient of the
  // micro-batch just done into the fixed-point sum; the caller then zeroes
  // the gradients. Returns whether it did (float: gradients accumulate in
  // place, nothing to do).
  bool absorb_micro_batch();
  // From the model, during the last backward pass.
  void gradients_final(size_t offset) override;
  // After the last backward pass (or instead of it): starts the remaining
  // buckets, waits for all, leaves the sum in grads, and says where the
  // time went.
  ReduceTiming finish();

 private:
  using Clock = std::chrono::steady_clock;
  void start_next();
  // Starts the all-reduce of every bucket whose copy to the host has
  // arrived, in bucket order (each at once without staging).
  void send_ready();
  void poll();
  // Where bucket i's all-reduce reads: the fixed-point sum (exact) or the
  // gradients, elements [first, first + n).
  void bucket_span(int i, size_t* first, size_t* n) const;
  // Starts bucket i's sum (all ranks, or to its owners when sharded).
  void send(int i);
  // The slot of the exact sum's out-of-range count when sharded.
  int count_slot() const { return static_cast<int>(buckets_.size()); }
  // Exact sum: fixed_, the whole (1 + count) buffer or its count alone.
  void allocate_fixed(bool whole);
  // Exact sum: fixed_[1 + i] += grads[i] in fixed point for i in [begin,
  // end) (=, the step's first contribution, when direct).
  void absorb(size_t begin, size_t end);
  // Direct exact sum of one rank and one micro-batch: the sum is that
  // contribution, so grads_ is rounded to the fixed point where it lies
  // and fixed_ keeps only the out-of-range count.
  bool rounds_in_place() const;
  void round_in_place(size_t begin, size_t end);
  // finish(), in order: starts the buckets not started yet and waits for
  // every sum (sharded exact sum: the out-of-range count too);
  void start_rest_and_wait();
  // then leaves in grads_ this rank's part of the sum (all of it, or its
  // slice), from the host buffers or the fixed-point sum, queued;
  void leave_sum_in_grads();
  // Exact sum: elements [lo, hi) of the fixed-point sum (from the host
  // when staged) into grads_ as floats.
  void exact_sum_to_grads(size_t lo, size_t hi);
  // then says where the step's all-reduce time went.
  ReduceTiming step_timing(Clock::time_point backward_end, Clock::time_point end) const;

  std::unique_ptr<ReduceTransport> owned_transport_;  // may be null
  GradSum sum_;
  Ops& ops_;      // the backend that owns grads_ and fixed_
  float* grads_;  // backend memory
  size_t count_;  // parameters
  // Exact sum: backend memory (1 + count); element 0 counts elements out
  // of range and travels with the bucket that starts last (the one at
  // offset 0). Null with the float sum; the count alone where one rank's
  // single micro-batch rounds in place (fixed_whole_ false).
  int64_t* fixed_ = nullptr;
  bool fixed_whole_ = false;
  int scale_exponent_ = 0;  // exact_scale_exponent of the step's loss scale
  // Host staging: pinned copies of what the transport sends.
  bool staged_ = false;
  float* host_grads_ = nullptr;    // (count) float sum
  int64_t* host_fixed_ = nullptr;  // (1 + count) exact sum
  std::vector<GradientBucket> buckets_;
  // Sharded: the ranks' slices (world + 1) and this rank's [own_begin_,
  // own_end_); empty owners_: every rank receives the whole sum.
  std::vector<size_t> owners_;
  size_t own_begin_ = 0, own_end_ = 0;
  ReduceTransport& transport_;
  bool overlap_;
  bool direct_;            // set_direct_exact_sum
  bool absorbed_ = false;  // an earlier micro-batch of this step is in fixed_
  bool active_ = false;
  size_t lowest_final_ = 0;  // last offset reported in this pass
  int started_ = 0;          // buckets [0, started_) are final (copying, in flight or done)
  int sent_ = 0;             // buckets [0, sent_) have their all-reduce started
  std::vector<Clock::time_point> start_time_, done_time_;
  std::vector<bool> done_;
};

}  // namespace mpiformer
