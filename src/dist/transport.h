// How the gradient reducer moves bytes: an in-place, non-blocking SUM over
// every rank. MPI (host buffers, MPI_Iallreduce) is one transport; NCCL (GPU
// buffers, its own stream) goes beside it with the same calls.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace mpiformer {

class ReduceTransport {
 public:
  virtual ~ReduceTransport() = default;
  virtual std::string name() const = 0;

  // Starts the in-place SUM over all ranks of x[0, n) in `slot` (one slot
  // per gradient bucket, reused every step). Every rank starts the same
  // slots with the same n in the same order.  x: backend (n)
  virtual void start(int slot, float* x, size_t n) = 0;
  // The same for 64-bit integers (exact, order-independent sums).  x: backend (n)
  virtual void start(int slot, int64_t* x, size_t n) = 0;
  // True when the reduction in `slot` has completed; also drives progress of
  // every reduction in flight. Waiting is polling this, so each bucket's
  // completion time is seen.
  virtual bool test(int slot) = 0;
};

// One rank: the sum over ranks is the identity.
class LocalTransport : public ReduceTransport {
 public:
  std::string name() const override { return "local"; }
  void start(int, float*, size_t) override {}
  void start(int, int64_t*, size_t) override {}
  bool test(int) override { return true; }
};

}  // namespace mpiformer
