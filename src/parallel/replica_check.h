// Replicas must stay bitwise identical: each applies the same update to the
// same parameters. This compares a digest of every tensor across ranks, so a
// divergence (a non-deterministic reduction, a bad node) stops the run with
// the tensor's name instead of silently training W different models.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "src/model/parameters.h"
#include "src/parallel/communicator.h"

namespace mpiformer {

// A 64-bit digest of each tensor's bytes, in tensor order.
std::vector<uint64_t> tensor_digests(ParameterSet& params);

struct ReplicaMismatch {
  std::string tensor;  // first tensor (in buffer order) that differs; empty: none
  int rank = -1;       // lowest rank whose copy differs from rank 0's
  bool found() const { return !tensor.empty(); }
};

// Collective: the same answer on every rank.
ReplicaMismatch check_replicas(ParameterSet& params, const Communicator& comm);

}  // namespace mpiformer
