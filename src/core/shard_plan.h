// Which slice of the flat parameter buffer each rank owns when the
// optimizer is sharded (train --shard-optimizer true, ZeRO-1): rank r holds
// the moments of, updates, and receives the summed gradient of
// [begin(r), end(r)); the slices cover the buffer in rank order. Slices
// start on kNormBlockFloats boundaries, so each rank's partial sums of the
// gradient norm are the unsharded run's (Ops::sum_squares_blocks) and the
// norm keeps its bits. A small model has fewer blocks than ranks: some
// slices are then empty.
#pragma once

#include <cstddef>
#include <vector>

#include "kernels/ops.h"

namespace mpiformer {

struct ShardPlan {
  std::vector<size_t> bounds;  // (world + 1): rank r owns [bounds[r], bounds[r + 1])
  int world() const { return static_cast<int>(bounds.size()) - 1; }
  size_t begin(int r) const { return bounds[r]; }
  size_t end(int r) const { return bounds[r + 1]; }
  size_t size(int r) const { return bounds[r + 1] - bounds[r]; }
  size_t largest() const {
    size_t most = 0;
    for (int r = 0; r < world(); ++r) most = size(r) > most ? size(r) : most;
    return most;
  }
};

// count floats over `world` ranks: whole norm blocks, as even as they go
// (rank r gets blocks [r B / W, (r + 1) B / W) of the B blocks).
inline ShardPlan plan_shards(size_t count, int world) {
  ShardPlan plan;
  const size_t blocks = norm_blocks(count), w = static_cast<size_t>(world < 1 ? 1 : world);
  plan.bounds.resize(w + 1);
  for (size_t r = 0; r <= w; ++r) {
    const size_t end = r * blocks / w * kNormBlockFloats;
    plan.bounds[r] = end < count ? end : count;
  }
  return plan;
}

}  // namespace mpiformer
