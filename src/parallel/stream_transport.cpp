#include "src/parallel/stream_transport.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

namespace mpiformer {

StreamTransport::StreamTransport(std::string name, std::unique_ptr<StreamQueue> queue,
                                 std::unique_ptr<StreamCollective> collective)
    : name_(std::move(name)), queue_(std::move(queue)), collective_(std::move(collective)) {}

void StreamTransport::open_slot(int slot) {
  if (slot < 0) throw std::invalid_argument("StreamTransport: negative slot");
  if (std::find(in_flight_.begin(), in_flight_.end(), slot) != in_flight_.end())
    throw std::logic_error("StreamTransport: slot " + std::to_string(slot) + " started twice");
  in_flight_.push_back(slot);
  queue_->comm_waits_for_compute(slot);
}

template <typename T>
void StreamTransport::start_typed(int slot, T* x, size_t n) {
  open_slot(slot);
  collective_->all_reduce(x, n);
  queue_->record_done(slot);
}

template <typename T>
void StreamTransport::reduce_to_owners(int slot, T* x, size_t offset, size_t n,
                                       const std::vector<size_t>& bounds) {
  open_slot(slot);
  // One reduce per owner whose slice meets the bucket, as one group.
  collective_->group_start();
  for (size_t r = 0; r + 1 < bounds.size(); ++r) {
    const size_t lo = std::max(offset, bounds[r]), hi = std::min(offset + n, bounds[r + 1]);
    if (lo < hi) collective_->reduce(x + (lo - offset), hi - lo, static_cast<int>(r));
  }
  collective_->group_end();
  queue_->record_done(slot);
}

void StreamTransport::start_reduce_to_owners(int slot, float* x, size_t offset, size_t n,
                                             const std::vector<size_t>& bounds) {
  reduce_to_owners(slot, x, offset, n, bounds);
}

void StreamTransport::start_reduce_to_owners(int slot, int64_t* x, size_t offset, size_t n,
                                             const std::vector<size_t>& bounds) {
  reduce_to_owners(slot, x, offset, n, bounds);
}

void StreamTransport::start_all_gather(int slot, float* x, const std::vector<size_t>& bounds) {
  open_slot(slot);
  // Uneven slices: one broadcast per owner (ncclAllGather wants equal counts).
  collective_->group_start();
  for (size_t r = 0; r + 1 < bounds.size(); ++r) {
    if (bounds[r] < bounds[r + 1])
      collective_->broadcast(x + bounds[r], bounds[r + 1] - bounds[r], static_cast<int>(r));
  }
  collective_->group_end();
  queue_->record_done(slot);
}

void StreamTransport::start(int slot, float* x, size_t n) {
  start_typed(slot, x, n);
}

void StreamTransport::start(int slot, int64_t* x, size_t n) {
  start_typed(slot, x, n);
}

bool StreamTransport::test(int slot) {
  if (std::find(in_flight_.begin(), in_flight_.end(), slot) == in_flight_.end()) return true;
  if (queue_->done(slot)) return true;
  // A failed collective never passes its done event: the error path, not a hang.
  const std::string error = collective_->async_error();
  if (!error.empty()) throw std::runtime_error(name_ + " transport: " + error);
  return false;
}

void StreamTransport::join() {
  for (int slot : in_flight_) queue_->compute_waits_for(slot);
  in_flight_.clear();
}

}  // namespace mpiformer
