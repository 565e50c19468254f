// What a sharded AdamW (ZeRO-1) needs of the other ranks, as an interface
// the optimizer calls and src/parallel implements (the optimizer layer sees
// no MPI): the sum of the gradient norm's partials, and the all-gather of
// the updated weights.
#pragma once

#include <cstddef>
#include <vector>

namespace mpiformer {

class OptimizerShardLink {
 public:
  virtual ~OptimizerShardLink() = default;
  // The ranks' slices of the flat buffer (world + 1), src/core/shard_plan.h.
  virtual const std::vector<size_t>& bounds() const = 0;
  virtual int rank() const = 0;
  // In-place SUM over ranks of the norm partials (each rank has zeros
  // outside its blocks, so the sum is exact), then any rank's NaN is every
  // rank's.  partial: backend (n)
  virtual void sum_partials(double* partial, size_t n) = 0;
  // Starts sending this rank's slice of the master weights to every rank,
  // in place; finish_gather() waits (or orders the device's later work
  // after it).  params: backend (bounds().back())
  virtual void start_gather(float* params) = 0;
  virtual void finish_gather() = 0;
};

}  // namespace mpiformer
