#include "src/parallel/optimizer_shards.h"

#include <algorithm>
#include <utility>

namespace mpiformer {

CollectiveShardLink::CollectiveShardLink(const Communicator& comm, Ops& ops, ShardPlan plan)
    : comm_(comm), ops_(ops), plan_(std::move(plan)) {}

void CollectiveShardLink::use_transport(ReduceTransport& transport, int slot) {
  transport_ = &transport;
  slot_ = slot;
  staged_ = !transport.takes_device_memory() && !ops_.device().host_accessible();
  if (staged_ && !host_)
    host_ = static_cast<float*>(
        ops_.device().allocate_host(std::max<size_t>(plan_.bounds.back(), 1) * sizeof(float)));
}

CollectiveShardLink::~CollectiveShardLink() {
  ops_.device().release_host(host_);
}

void CollectiveShardLink::sum_partials(double* partial, size_t n) {
  // One double per 4096 floats: small enough to cross the host every step.
  host_partials_.resize(n);  // (n); allocated by the first step only
  double* host = host_partials_.data();
  ops_.device().copy_to_host(host, partial, n * sizeof(double));
  comm_.allreduce_sum(host, static_cast<int>(n));
  ops_.device().copy_to_device(partial, host, n * sizeof(double));
}

void CollectiveShardLink::start_gather(void* weights, size_t element_bytes) {
  // The transports move floats: a slice of 2-byte elements is half as many
  // floats (the slices start at whole norm blocks, so at even elements; the
  // last ends at the padded end).
  weights_ = static_cast<float*>(weights);
  float_bounds_.resize(plan_.bounds.size());
  for (size_t i = 0; i < plan_.bounds.size(); ++i)
    float_bounds_[i] = (plan_.bounds[i] * element_bytes + sizeof(float) - 1) / sizeof(float);
  if (!staged_) {
    transport_->start_all_gather(slot_, weights_, float_bounds_);
    return;
  }
  const int r = comm_.rank();
  ops_.device().copy_to_host(host_ + float_bounds_[r], weights_ + float_bounds_[r],
                             (float_bounds_[r + 1] - float_bounds_[r]) * sizeof(float));
  transport_->start_all_gather(slot_, host_, float_bounds_);
}

void CollectiveShardLink::finish_gather() {
  while (!transport_->test(slot_)) {
  }
  transport_->join();
  if (staged_) ops_.device().copy_to_device(weights_, host_, float_bounds_.back() * sizeof(float));
}

}  // namespace mpiformer
