#include "kernels/staging_ring.h"

#include <stdexcept>
#include <string>

namespace mpiformer {

void StagingRing::reset(size_t size) {
  while (!staged_.empty()) retire_front();
  size_ = size;
  head_ = 0;
  claimed_ = false;
}

void StagingRing::retire_front() {
  markers_.recycle(staged_.front().done);
  staged_.pop_front();
}

size_t StagingRing::claim(size_t bytes) {
  if (bytes == 0 || bytes > size_)
    throw std::logic_error("StagingRing: a region of " + std::to_string(bytes) +
                           " bytes in a ring of " + std::to_string(size_));
  // Regions whose copies have run, from the oldest: a query each, and one
  // more for the first still to run, so the list stays short.
  while (!staged_.empty() && markers_.completed(staged_.front().done)) retire_front();
  size_t begin = head_;
  if (begin + bytes > size_) begin = 0;  // wrap: a region is never split
  const size_t end = begin + bytes;
  // After a wrap the oldest regions may lie in the tail skipped, not here:
  // wait for the newest region [begin, end) overlaps. Markers complete in
  // order, so every older copy has run then too.
  for (size_t i = staged_.size(); i-- > 0;) {
    if (staged_[i].begin < end && begin < staged_[i].end) {
      markers_.wait(staged_[i].done);
      for (size_t k = 0; k <= i; ++k) retire_front();
      break;
    }
  }
  claimed_begin_ = begin;
  claimed_end_ = end;
  claimed_ = true;
  return begin;
}

void StagingRing::queued() {
  if (!claimed_) throw std::logic_error("StagingRing: queued() without claim()");
  staged_.push_back({claimed_begin_, claimed_end_, markers_.record()});
  head_ = claimed_end_;
  claimed_ = false;
}

}  // namespace mpiformer
