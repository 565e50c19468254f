// The upload ring's placement (kernels/staging_ring.h) against a stream whose
// copies run late: the host must never write a region that a queued copy
// has yet to read, however uneven the uploads, and completed regions are
// retired as the ring goes.
#include "kernels/staging_ring.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <deque>
#include <random>
#include <string>
#include <vector>

namespace mpiformer {
namespace {

// A stream whose copies run late, in order: the queued copies run only when
// a marker recorded after them is waited for, or has been queried
// `queries_to_run` times. A copy reads the ring when it runs, so a region
// the host overwrote too early delivers the wrong bytes.
class LateStream final : public StreamMarkers {
 public:
  explicit LateStream(int queries_to_run) : queries_to_run_(queries_to_run) {}

  void copy(unsigned char* dst, const unsigned char* src, size_t bytes) {
    copies_.push_back({dst, src, bytes});
  }
  Marker record() override {
    marks_.push_back({copies_.size(), 0});
    return &marks_.back();
  }
  bool completed(Marker marker) override {
    ++queries_;
    Mark& mark = *static_cast<Mark*>(marker);
    if (++mark.queries >= queries_to_run_) run_until(mark.after);
    return ran_ >= mark.after;
  }
  void wait(Marker marker) override { run_until(static_cast<Mark*>(marker)->after); }
  void recycle(Marker marker) override {
    if (ran_ < static_cast<Mark*>(marker)->after)
      faults.push_back("a marker was recycled before its copies ran");
  }
  void run_all() { run_until(copies_.size()); }

  // Whether a copy still to run reads [src, src + bytes).
  bool pending_reads(const unsigned char* src, size_t bytes) const {
    for (size_t i = ran_; i < copies_.size(); ++i)
      if (copies_[i].src < src + bytes && src < copies_[i].src + copies_[i].bytes) return true;
    return false;
  }
  long queries() const { return queries_; }
  std::vector<std::string> faults;

 private:
  struct Copy {
    unsigned char* dst;
    const unsigned char* src;
    size_t bytes;
  };
  struct Mark {
    size_t after;  // copies queued before it
    int queries;
  };
  void run_until(size_t n) {
    for (; ran_ < n; ++ran_) std::memcpy(copies_[ran_].dst, copies_[ran_].src, copies_[ran_].bytes);
  }

  int queries_to_run_;
  std::vector<Copy> copies_;
  size_t ran_ = 0;
  std::deque<Mark> marks_;  // a deque keeps each marker's address
  long queries_ = 0;
};

// The host side of CudaDevice::upload, with the ring's memory on the host: each
// upload has a destination of its own, checked once every copy has run.
struct Uploads {
  LateStream stream;
  StagingRing ring{stream};
  std::vector<unsigned char> memory;
  std::vector<std::vector<unsigned char>> sent, received;

  Uploads(size_t ring_bytes, int queries_to_run) : stream(queries_to_run) { grow(ring_bytes); }

  void grow(size_t bytes) {
    stream.run_all();  // CudaDevice::reserve_uploads synchronizes first
    memory.assign(bytes, 0);
    ring.reset(bytes);
  }
  void upload(size_t bytes, std::mt19937& rng) {
    if (bytes > ring.size()) grow(std::max(bytes, 2 * ring.size()));
    std::vector<unsigned char> data(bytes);
    for (unsigned char& b : data) b = static_cast<unsigned char>(rng());
    sent.push_back(data);
    // Destinations never move: the received vectors are made up front.
    unsigned char* dst = received.at(sent.size() - 1).data();
    const size_t begin = ring.claim(bytes);
    if (stream.pending_reads(memory.data() + begin, bytes))
      stream.faults.push_back("upload " + std::to_string(sent.size() - 1) + " of " +
                              std::to_string(bytes) + " bytes at [" + std::to_string(begin) + ", " +
                              std::to_string(begin + bytes) +
                              ") overwrites a region whose copy has not run");
    std::memcpy(memory.data() + begin, data.data(), bytes);
    stream.copy(dst, memory.data() + begin, bytes);
    ring.queued();
  }
  // Runs every copy, then compares each destination with what was sent to it.
  void expect_delivered() {
    stream.run_all();
    for (size_t i = 0; i < std::min<size_t>(stream.faults.size(), 3); ++i)
      ADD_FAILURE() << stream.faults[i];
    EXPECT_EQ(stream.faults.size(), 0u) << "faults";
    int wrong = 0;
    for (size_t i = 0; i < sent.size(); ++i) {
      if (!std::equal(sent[i].begin(), sent[i].end(), received[i].begin()) && ++wrong <= 3)
        ADD_FAILURE() << "upload " << i << " (" << sent[i].size()
                      << " bytes) delivered other bytes";
    }
    EXPECT_EQ(wrong, 0) << "uploads of " << sent.size() << " delivered other bytes";
  }
};

void prepare(Uploads& u, const std::vector<size_t>& sizes) {
  for (size_t bytes : sizes) u.received.emplace_back(bytes, 0);
}

// Ring 1000: [0, 800), [800, 950), then [0, 300) (which waits for the first);
// a new 800 bytes wraps to [0, 800). The oldest region, [800, 950), lies in
// the skipped tail, yet [0, 300), newer, is still to be read.
TEST(StagingRing, AWrapWaitsForTheNewestRegionItOverlapsNotJustTheOldest) {
  const std::vector<size_t> sizes = {800, 150, 300, 800};
  Uploads u(1000, INT_MAX);  // copies run only when waited for
  prepare(u, sizes);
  std::mt19937 rng(1);
  for (size_t bytes : sizes) u.upload(bytes, rng);
  EXPECT_EQ(u.ring.size(), 1000u);
  u.expect_delivered();
}

TEST(StagingRing, LongRandomSequencesOfUnevenUploadsArriveIntact) {
  for (int queries_to_run : {1, 3, INT_MAX}) {
    for (uint32_t seed : {1u, 2u, 3u}) {
      SCOPED_TRACE("copies run after " + std::to_string(queries_to_run) + " queries, seed " +
                   std::to_string(seed));
      std::mt19937 rng(seed);
      std::vector<size_t> sizes;
      for (int i = 0; i < 3000; ++i) {
        const unsigned kind = rng() % 20;
        // Mostly small, some a good part of the ring, a few that make it grow.
        sizes.push_back(kind == 0  ? 1 + rng() % 3000
                        : kind < 5 ? 200 + rng() % 700
                                   : 1 + rng() % 96);
      }
      Uploads u(1024, queries_to_run);
      prepare(u, sizes);
      for (size_t bytes : sizes) u.upload(bytes, rng);
      EXPECT_GE(u.ring.size(), 3000u) << "the ring grows to the largest upload";
      u.expect_delivered();
    }
  }
}

// Regions whose copies have run are retired by querying from the oldest, a
// query or two per upload, so the list of staged regions stays short
// without a wrap ever forcing a wait.
TEST(StagingRing, CompletedRegionsAreRetiredCheaply) {
  const int n = 1000;
  Uploads u(size_t{1} << 20, 1);  // a copy runs when its marker is first queried
  prepare(u, std::vector<size_t>(n, 16));
  std::mt19937 rng(4);
  for (int i = 0; i < n; ++i) u.upload(16, rng);
  EXPECT_LE(u.ring.staged(), 2u);
  EXPECT_LE(u.stream.queries(), 2L * n);
  u.expect_delivered();
}

TEST(StagingRing, RefusesRegionsItCannotHold) {
  LateStream stream(1);
  StagingRing ring(stream);
  ring.reset(100);
  EXPECT_THROW(ring.claim(0), std::logic_error);
  EXPECT_THROW(ring.claim(101), std::logic_error);
  EXPECT_THROW(ring.queued(), std::logic_error);
  EXPECT_EQ(ring.claim(100), 0u);
}

}  // namespace
}  // namespace mpiformer
