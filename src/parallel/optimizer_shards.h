// The ranks' side of a sharded optimizer (train --shard-optimizer true,
// ZeRO-1; src/optim/adamw.h): the norm partials summed over ranks, the
// updated slices all-gathered over the gradient reducer's transport.
#pragma once

#include <memory>
#include <vector>

#include "kernels/ops.h"
#include "src/core/shard_plan.h"
#include "src/optim/shard_link.h"
#include "src/parallel/communicator.h"
#include "src/parallel/transport.h"

namespace mpiformer {

class CollectiveShardLink final : public ShardLink {
 public:
  // The gather goes over a local transport (one rank) until use_transport().
  CollectiveShardLink(const Communicator& comm, Ops& ops, ShardPlan plan);
  ~CollectiveShardLink() override;
  CollectiveShardLink(const CollectiveShardLink&) = delete;
  CollectiveShardLink& operator=(const CollectiveShardLink&) = delete;

  const std::vector<size_t>& bounds() const override { return plan_.bounds; }
  int rank() const override { return comm_.rank(); }
  const ShardPlan& plan() const { return plan_; }
  // The gradient reducer's transport, once it exists, and a slot it does not use.
  void use_transport(ReduceTransport& transport, int slot);
  void sum_partials(double* partial, size_t n) override;
  void start_gather(void* weights, size_t element_bytes) override;
  void finish_gather() override;

 private:
  const Communicator& comm_;
  Ops& ops_;
  ShardPlan plan_;
  std::vector<double> host_partials_;  // the norm partials' trip through the host, kept
  LocalTransport local_;
  ReduceTransport* transport_ = &local_;
  int slot_ = 0;
  // A GPU's weights under a host transport go through this pinned copy.
  bool staged_ = false;
  float* host_ = nullptr;             // (plan_.bounds.back())
  float* weights_ = nullptr;          // the backend buffer being gathered, as floats
  std::vector<size_t> float_bounds_;  // the slices' bounds in floats of it
};

}  // namespace mpiformer
