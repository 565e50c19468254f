// How the gradient reducer moves bytes: an in-place, non-blocking SUM over
// every rank. MPI (host buffers, MPI_Iallreduce) is one transport; NCCL
// (device buffers, its own stream; src/parallel/stream_transport.h) goes beside
// it with the same calls. Which memory a transport reads is its own
// property: the reducer stages through the host only for one that wants
// host memory while the backend's is a GPU's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace mpiformer {

class ReduceTransport {
 public:
  virtual ~ReduceTransport() = default;
  virtual std::string name() const = 0;
  // Whether start() takes the backend's memory (a GPU's with NCCL); false:
  // host memory.
  virtual bool takes_device_memory() const { return false; }
  // Whether this rank is the only one: the sum over ranks is the identity.
  virtual bool one_rank() const { return false; }

  // Starts the in-place SUM over all ranks of x[0, n) in `slot` (one slot
  // per gradient bucket, reused every step). Every rank starts the same
  // slots with the same n in the same order.
  // x: (n), backend memory if takes_device_memory(), else host
  virtual void start(int slot, float* x, size_t n) = 0;
  // The same for 64-bit integers (exact, order-independent sums).  x: (n)
  virtual void start(int slot, int64_t* x, size_t n) = 0;

  // A sharded optimizer (ZeRO-1; src/core/shard_plan.h) needs each summed
  // element only on the rank that owns it. x holds elements [offset,
  // offset + n) of the flat buffer; bounds (world + 1) are the slices. Starts
  // the in-place SUM over all ranks of x delivered to the owners only: rank
  // r receives the sum of the part of x within [bounds[r], bounds[r + 1]);
  // the rest of x is undefined afterwards. Slots and order as start().
  // x: (n), memory as start()
  virtual void start_reduce_to_owners(int slot, float* x, size_t offset, size_t n,
                                      const std::vector<size_t>& bounds) {
    (void)slot, (void)x, (void)offset, (void)n, (void)bounds;
    throw std::logic_error(name() + " transport: no reduce to owners");
  }
  virtual void start_reduce_to_owners(int slot, int64_t* x, size_t offset, size_t n,
                                      const std::vector<size_t>& bounds) {
    (void)slot, (void)x, (void)offset, (void)n, (void)bounds;
    throw std::logic_error(name() + " transport: no reduce to owners");
  }
  // The sharded update's way back: each rank r's slice x[bounds[r],
  // bounds[r + 1]) to every rank, in place. test() and join() as above.
  // x: (bounds.back()), memory as start()
  virtual void start_all_gather(int slot, float* x, const std::vector<size_t>& bounds) {
    (void)slot, (void)x, (void)bounds;
    throw std::logic_error(name() + " transport: no all-gather");
  }
  // True when the reduction in `slot` has completed; also drives progress of
  // every reduction in flight. Waiting is polling this, so each bucket's
  // completion time is seen. Throws std::runtime_error when the reduction
  // can no longer complete (a peer died).
  virtual bool test(int slot) = 0;
  // After every slot tested complete: orders the backend's later work (the
  // optimizer) after the sums. A host transport has nothing to do; a
  // stream transport makes the compute stream wait on its stream.
  virtual void join() {}
};

// One rank: the sum over ranks is the identity.
class LocalTransport : public ReduceTransport {
 public:
  std::string name() const override { return "local"; }
  bool takes_device_memory() const override { return true; }  // touches nothing
  bool one_rank() const override { return true; }
  void start(int, float*, size_t) override {}
  void start(int, int64_t*, size_t) override {}
  void start_reduce_to_owners(int, float*, size_t, size_t, const std::vector<size_t>&) override {}
  void start_reduce_to_owners(int, int64_t*, size_t, size_t, const std::vector<size_t>&) override {}
  void start_all_gather(int, float*, const std::vector<size_t>&) override {}
  bool test(int) override { return true; }
};

}  // namespace mpiformer
