#include "src/parallel/stream_transport.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

namespace mpiformer {

StreamTransport::StreamTransport(std::string name, std::unique_ptr<StreamQueue> queue,
                                 std::unique_ptr<StreamCollective> collective)
    : name_(std::move(name)), queue_(std::move(queue)), collective_(std::move(collective)) {}

template <typename T>
void StreamTransport::start_typed(int slot, T* x, size_t n) {
  if (slot < 0) throw std::invalid_argument("StreamTransport: negative slot");
  if (std::find(in_flight_.begin(), in_flight_.end(), slot) != in_flight_.end())
    throw std::logic_error("StreamTransport: slot " + std::to_string(slot) + " started twice");
  in_flight_.push_back(slot);
  queue_->comm_waits_for_compute(slot);
  collective_->all_reduce(x, n);
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
