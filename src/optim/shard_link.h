// What a sharded AdamW (ZeRO-1) needs of the other ranks, as an interface
// the optimizer calls and src/parallel implements (the optimizer layer sees
// no MPI): the sum of the gradient norm's partials, and the all-gather of
// the updated weights.
#pragma once

#include <cstddef>
#include <vector>

namespace mpiformer {

class ShardLink {
 public:
  virtual ~ShardLink() = default;
  // The ranks' slices of the flat buffer (world + 1), src/core/shard_plan.h.
  virtual const std::vector<size_t>& bounds() const = 0;
  virtual int rank() const = 0;
  // In-place SUM over ranks of the norm partials (each rank has zeros
  // outside its blocks, so the sum is exact), then any rank's NaN is every
  // rank's.  partial: backend (n)
  virtual void sum_partials(double* partial, size_t n) = 0;
  // Starts sending this rank's slice of the weights to every rank, in
  // place: the fp32 masters (element_bytes 4) or, when the masters are
  // sliced, the bf16/fp16 compute copy (2; padded to a whole number of
  // floats). finish_gather() waits (or orders the device's later work after
  // it).  weights: backend (bounds().back() elements of element_bytes)
  virtual void start_gather(void* weights, size_t element_bytes) = 0;
  virtual void finish_gather() = 0;
};

}  // namespace mpiformer
