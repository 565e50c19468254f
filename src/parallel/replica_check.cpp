#include "src/parallel/replica_check.h"

#include <climits>
#include <cstring>

#include "kernels/dropout_mask.h"

namespace mpiformer {

std::vector<uint64_t> tensor_digests(ParameterSet& params) {
  std::vector<uint64_t> digests;
  std::vector<float> host;  // (largest tensor)
  for (const ParamInfo& t : params.info()) {
    host.resize(t.size);
    params.ops().device().copy_to_host(host.data(), params.params() + t.offset,
                                       t.size * sizeof(float));
    // Bits, not values: -0 vs +0 or two NaN payloads are a divergence too.
    uint64_t h = mix64(t.size);
    for (float x : host) {
      uint32_t bits;
      std::memcpy(&bits, &x, sizeof bits);
      h = mix64(h ^ bits);
    }
    digests.push_back(h);
  }
  return digests;
}

ReplicaMismatch check_replicas(ParameterSet& params, const Communicator& comm) {
  std::vector<uint64_t> mine = tensor_digests(params);
  std::vector<uint64_t> root = mine;
  comm.broadcast(root.data(), static_cast<int>(root.size()), 0);
  int first = INT_MAX;
  for (size_t i = 0; i < mine.size(); ++i) {
    if (mine[i] != root[i]) {
      first = static_cast<int>(i);
      break;
    }
  }
  // The lowest differing tensor, and the lowest rank that has it.
  const auto [tensor, rank] = comm.min_with_rank(first);
  ReplicaMismatch out;
  if (tensor != INT_MAX) {
    out.tensor = params.info()[tensor].name;
    out.rank = rank;
  }
  return out;
}

}  // namespace mpiformer
