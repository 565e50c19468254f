// Where each upload is staged in a ring of host memory that its copy to the
// device reads later (pinned memory on a GPU: CudaDevice::upload), and what the
// host must wait for before it writes there. Free of CUDA, so the placement
// is tested on the CPU against a stream whose copies run late
// (tests/staging_ring_test.cpp).
#pragma once

#include <cstddef>
#include <deque>

namespace mpiformer {

// Markers recorded on one stream behind the copies queued on it (CUDA events
// on a GPU). They complete in the order they were recorded: once one has
// completed, every copy queued before it has run.
class StreamMarkers {
 public:
  using Marker = void*;  // opaque: a cudaEvent_t on a GPU
  virtual ~StreamMarkers() = default;
  // A marker behind every copy queued so far.
  virtual Marker record() = 0;
  // Whether it has completed (a query, no wait).
  virtual bool completed(Marker marker) = 0;
  // Returns once it has completed.
  virtual void wait(Marker marker) = 0;
  // The ring is done with a completed marker: it may be recorded again.
  virtual void recycle(Marker marker) = 0;
};

// Regions of a ring of size() bytes, written in order and never split: a
// region that does not fit before the end starts again at 0. A region is
// free again once the copy that reads it has run (its marker).
class StagingRing {
 public:
  // markers: outlives the ring.
  explicit StagingRing(StreamMarkers& markers) : markers_(markers) {}
  StagingRing(const StagingRing&) = delete;
  StagingRing& operator=(const StagingRing&) = delete;

  size_t size() const { return size_; }
  // Regions whose copies may not have run yet.
  size_t staged() const { return staged_.size(); }

  // The ring becomes `size` bytes, all free. The caller has waited for every
  // copy out of the old ring.
  void reset(size_t size);
  // Where the next region of `bytes` (0 < bytes <= size()) starts. Returns
  // once no queued copy reads any of it, so the host may write it.
  size_t claim(size_t bytes);
  // The copy out of the region claimed last has been queued: records the
  // marker that frees it.
  void queued();

 private:
  struct Staged {
    size_t begin, end;
    StreamMarkers::Marker done;
  };
  // Recycles the oldest region's marker and forgets the region.
  void retire_front();

  StreamMarkers& markers_;
  size_t size_ = 0;
  size_t head_ = 0;  // where the next region would start
  size_t claimed_begin_ = 0, claimed_end_ = 0;
  bool claimed_ = false;
  std::deque<Staged> staged_;  // oldest first
};

}  // namespace mpiformer
