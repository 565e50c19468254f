#include "src/parallel/gradient_reducer.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>

namespace mpiformer {

namespace {

double seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

ReduceTiming& ReduceTiming::operator+=(const ReduceTiming& o) {
  in_flight_s += o.in_flight_s;
  hidden_s += o.hidden_s;
  wait_s += o.wait_s;
  bytes += o.bytes;
  buckets += o.buckets;
  return *this;
}

std::vector<GradientBucket> plan_buckets(const std::vector<ParamInfo>& tensors,
                                         size_t bucket_floats) {
  std::vector<GradientBucket> buckets;
  bucket_floats = std::max<size_t>(bucket_floats, 1);
  GradientBucket open;
  bool has_open = false;
  for (int i = static_cast<int>(tensors.size()); i-- > 0;) {
    const ParamInfo& t = tensors[i];
    if (i + 1 < static_cast<int>(tensors.size()) && t.offset + t.size != tensors[i + 1].offset)
      throw std::logic_error("plan_buckets: tensor '" + t.name + "' is not packed");
    if (!has_open) {
      open = GradientBucket{t.offset, t.offset + t.size, i, i};
      has_open = true;
    } else {
      open.begin = t.offset;
      open.first_tensor = i;
    }
    if (open.size() >= bucket_floats) {
      buckets.push_back(open);
      has_open = false;
    }
  }
  if (has_open) buckets.push_back(open);
  return buckets;
}

GradientReducer::GradientReducer(const ParameterSet& params, float* grads, size_t bucket_floats,
                                 ReduceTransport& transport, bool overlap, GradSum sum,
                                 HostStaging staging)
    : sum_(sum),
      ops_(params.ops()),
      grads_(grads),
      count_(params.count()),
      buckets_(plan_buckets(params.info(), bucket_floats)),
      transport_(transport),
      overlap_(overlap),
      direct_(ops_.direct_exact_sum()),
      start_time_(buckets_.size()),
      done_time_(buckets_.size()),
      done_(buckets_.size(), false) {
  own_end_ = count_;
  staged_ = staging == HostStaging::kAlways ||
            (!transport_.takes_device_memory() && !ops_.device().host_accessible());
  if (sum_ == GradSum::kExact) {
    // One rank's single micro-batch rounds in place and needs only the
    // count; begin_step makes the whole buffer when a step needs it.
    allocate_fixed(!rounds_in_place());
    if (staged_)
      host_fixed_ =
          static_cast<int64_t*>(ops_.device().allocate_host((count_ + 1) * sizeof(int64_t)));
  } else if (staged_) {
    host_grads_ = static_cast<float*>(ops_.device().allocate_host(count_ * sizeof(float)));
  }
}

GradientReducer::GradientReducer(const ParameterSet& params, float* grads, size_t bucket_floats,
                                 std::unique_ptr<ReduceTransport> transport, bool overlap,
                                 GradSum sum, HostStaging staging)
    : GradientReducer(params, grads, bucket_floats, *transport, overlap, sum, staging) {
  owned_transport_ = std::move(transport);
}

GradientReducer::~GradientReducer() {
  // No copy may still be reading or writing these. A device already in
  // error (the reason this is unwinding, perhaps) must not end the process
  // from a destructor.
  try {
    ops_.device().synchronize();
  } catch (const std::exception&) {
  }
  ops_.device().release(fixed_);
  ops_.device().release_host(host_fixed_);
  ops_.device().release_host(host_grads_);
}

void GradientReducer::allocate_fixed(bool whole) {
  ops_.device().release(fixed_);
  fixed_whole_ = whole;
  fixed_ =
      static_cast<int64_t*>(ops_.device().allocate((whole ? count_ + 1 : 1) * sizeof(int64_t)));
}

void GradientReducer::set_owners(std::vector<size_t> bounds, int rank) {
  if (active_) throw std::logic_error("GradientReducer: set_owners during a step");
  if (rank < 0 || static_cast<size_t>(rank) + 1 >= bounds.size() || bounds.back() != count_)
    throw std::logic_error("GradientReducer: slices that do not cover the parameters");
  own_begin_ = bounds[rank];
  own_end_ = bounds[rank + 1];
  owners_ = std::move(bounds);
}

size_t GradientReducer::bytes_per_step() const {
  if (sum_ == GradSum::kExact) return (count_ + 1) * sizeof(int64_t);
  return buckets_.empty() ? 0 : buckets_.front().end * sizeof(float);
}

int exact_scale_exponent(float loss_scale) {
  if (!std::isfinite(loss_scale) || loss_scale <= 0.0f) return 0;
  int e = 0;
  if (std::frexp(loss_scale, &e) == 0.5f) --e;  // S = m 2^e, m in [0.5, 1)
  return std::clamp(e, -kExactMaxScaleExponent, kExactMaxScaleExponent);
}

void GradientReducer::begin_step(float loss_scale, int micro_batches) {
  if (active_) throw std::logic_error("GradientReducer: begin_step twice without finish");
  if (micro_batches < 1)
    throw std::logic_error("GradientReducer: a step of " + std::to_string(micro_batches) +
                           " micro-batches");
  active_ = true;
  started_ = 0;
  sent_ = 0;
  lowest_final_ = buckets_.empty() ? 0 : buckets_.front().end;
  std::fill(done_.begin(), done_.end(), false);
  absorbed_ = false;
  scale_exponent_ = exact_scale_exponent(loss_scale);
  if (fixed_ && !fixed_whole_ && !(rounds_in_place() && micro_batches == 1))
    allocate_fixed(true);  // once, between steps
  if (fixed_) {
    // Direct: the first contribution writes every element, so only the
    // out-of-range count needs its zero.
    ops_.device().fill_zero(fixed_, (direct_ ? 1 : count_ + 1) * sizeof(int64_t));
    if (!std::isfinite(loss_scale)) {  // counted out of range: the sum is NaN everywhere
      const int64_t out_of_range = 1;
      ops_.device().upload(fixed_, &out_of_range, sizeof out_of_range);
    }
  }
}

void GradientReducer::absorb(size_t begin, size_t end) {
  // Queued behind the backward ops that wrote these gradients.
  ops_.fixed_point_accumulate(fixed_ + 1 + begin, fixed_, grads_ + begin, end - begin,
                              kExactFractionBits - scale_exponent_,
                              kExactLimitBits + scale_exponent_, direct_ && !absorbed_);
}

bool GradientReducer::rounds_in_place() const {
  return direct_ && transport_.one_rank() && !staged_ && !absorbed_;
}

void GradientReducer::round_in_place(size_t begin, size_t end) {
  ops_.fixed_point_round(grads_ + begin, fixed_, end - begin, kExactFractionBits - scale_exponent_,
                         kExactLimitBits + scale_exponent_);
}

bool GradientReducer::absorb_micro_batch() {
  if (sum_ != GradSum::kExact) return false;
  if (!fixed_whole_)
    throw std::logic_error("GradientReducer: absorb_micro_batch in a step of one micro-batch");
  if (!buckets_.empty()) absorb(0, buckets_.front().end);
  absorbed_ = true;
  return true;
}

void GradientReducer::bucket_span(int i, size_t* first, size_t* n) const {
  const GradientBucket& b = buckets_[i];
  if (sum_ == GradSum::kExact) {
    // The bucket at offset 0 starts last and carries the out-of-range count.
    *first = b.begin == 0 ? 0 : b.begin + 1;
    *n = b.end + 1 - *first;
  } else {
    *first = b.begin;
    *n = b.size();
  }
}

void GradientReducer::start_next() {
  const GradientBucket& b = buckets_[started_];
  // The exact sum takes this bucket's part of the last micro-batch (one
  // rank's only contribution: rounded where it lies).
  if (sum_ == GradSum::kExact && rounds_in_place())
    round_in_place(b.begin, b.end);
  else if (sum_ == GradSum::kExact)
    absorb(b.begin, b.end);
  start_time_[started_] = Clock::now();
  if (staged_) {
    size_t first = 0, n = 0;
    bucket_span(started_, &first, &n);
    if (sum_ == GradSum::kExact)
      ops_.device().copy_to_host_async(started_, host_fixed_ + first, fixed_ + first,
                                       n * sizeof(int64_t));
    else
      ops_.device().copy_to_host_async(started_, host_grads_ + first, grads_ + first,
                                       n * sizeof(float));
  }
  ++started_;
  send_ready();
}

void GradientReducer::send_ready() {
  // In bucket order: every rank starts the same collectives in the same order.
  while (sent_ < started_ && (!staged_ || ops_.device().host_copy_done(sent_))) {
    send(sent_);
    ++sent_;
  }
}

void GradientReducer::send(int i) {
  int64_t* fixed = staged_ ? host_fixed_ : fixed_;
  float* grads = staged_ ? host_grads_ : grads_;
  if (owners_.empty()) {
    size_t first = 0, n = 0;
    bucket_span(i, &first, &n);
    if (sum_ == GradSum::kExact)
      transport_.start(i, fixed + first, n);
    else
      transport_.start(i, grads + first, n);
    return;
  }
  const GradientBucket& b = buckets_[i];
  if (sum_ == GradSum::kExact) {
    transport_.start_reduce_to_owners(i, fixed + 1 + b.begin, b.begin, b.size(), owners_);
    // Every rank needs the count: any element out of range spoils the step.
    if (b.begin == 0) transport_.start(count_slot(), fixed, 1);
  } else {
    transport_.start_reduce_to_owners(i, grads + b.begin, b.begin, b.size(), owners_);
  }
}

void GradientReducer::poll() {
  send_ready();
  for (int i = 0; i < sent_; ++i) {
    if (!done_[i] && transport_.test(i)) {
      done_[i] = true;
      done_time_[i] = Clock::now();
    }
  }
}

void GradientReducer::gradients_final(size_t offset) {
  if (!active_) return;  // an earlier micro-batch: its gradients are not final
  if (offset > lowest_final_)
    throw std::logic_error("GradientReducer: final offset went up from " +
                           std::to_string(lowest_final_) + " to " + std::to_string(offset));
  lowest_final_ = offset;
  if (!overlap_) return;
  while (started_ < static_cast<int>(buckets_.size()) && buckets_[started_].begin >= offset)
    start_next();
  poll();
}

ReduceTiming GradientReducer::finish() {
  if (!active_) throw std::logic_error("GradientReducer: finish without begin_step");
  const Clock::time_point backward_end = Clock::now();
  start_rest_and_wait();
  leave_sum_in_grads();
  const Clock::time_point end = Clock::now();
  active_ = false;
  return step_timing(backward_end, end);
}

void GradientReducer::start_rest_and_wait() {
  while (started_ < static_cast<int>(buckets_.size())) start_next();
  // Wait by testing, so each bucket's completion time is seen, not just the last.
  for (;;) {
    poll();
    if (std::all_of(done_.begin(), done_.end(), [](bool d) { return d; })) break;
  }
  if (!owners_.empty() && sum_ == GradSum::kExact) {
    while (!transport_.test(count_slot())) {
    }
  }
  transport_.join();
}

void GradientReducer::leave_sum_in_grads() {
  const size_t n = buckets_.empty() ? 0 : buckets_.front().end;
  // What this rank reads of the sum: all of it, or its own slice.
  const size_t lo = std::min(own_begin_, n), hi = std::min(own_end_, n);
  // Queued, not waited for: the host buffers change again only after the
  // next step's copies to the host, which are queued behind these.
  if (sum_ == GradSum::kExact && n > 0 && rounds_in_place()) {
    ops_.fixed_point_poison(grads_ + lo, fixed_, hi - lo);
  } else if (sum_ == GradSum::kExact && n > 0) {
    exact_sum_to_grads(lo, hi);
  } else if (staged_ && hi > lo) {
    ops_.device().copy_to_device_async(grads_ + lo, host_grads_ + lo, (hi - lo) * sizeof(float));
  }
}

void GradientReducer::exact_sum_to_grads(size_t lo, size_t hi) {
  // Staged: the out-of-range count (element 0) comes back too, in one copy
  // with a slice that starts at 0.
  if (staged_ && lo == 0) {
    ops_.device().copy_to_device_async(fixed_, host_fixed_, (hi + 1) * sizeof(int64_t));
  } else if (staged_) {
    ops_.device().copy_to_device_async(fixed_, host_fixed_, sizeof(int64_t));
    if (hi > lo)
      ops_.device().copy_to_device_async(fixed_ + 1 + lo, host_fixed_ + 1 + lo,
                                         (hi - lo) * sizeof(int64_t));
  }
  if (hi > lo)
    ops_.fixed_point_to_float(grads_ + lo, fixed_ + 1 + lo, fixed_, hi - lo,
                              kExactFractionBits - scale_exponent_);
}

ReduceTiming GradientReducer::step_timing(Clock::time_point backward_end,
                                          Clock::time_point end) const {
  ReduceTiming timing;
  timing.buckets = static_cast<int>(buckets_.size());
  timing.bytes = bytes_per_step();
  timing.wait_s = seconds(end - backward_end);
  // Buckets start in order, so merging consecutive intervals gives the union.
  Clock::time_point run_begin{}, run_end{};
  bool open = false;
  auto close_run = [&] {
    timing.in_flight_s += seconds(run_end - run_begin);
    if (run_begin < backward_end)
      timing.hidden_s += seconds(std::min(run_end, backward_end) - run_begin);
  };
  for (size_t i = 0; i < buckets_.size(); ++i) {
    if (open && start_time_[i] <= run_end) {
      run_end = std::max(run_end, done_time_[i]);
      continue;
    }
    if (open) close_run();
    run_begin = start_time_[i];
    run_end = done_time_[i];
    open = true;
  }
  if (open) close_run();
  return timing;
}

}  // namespace mpiformer
