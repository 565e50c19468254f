#include "src/parallel/replica_check.h"

#include <climits>
#include <cstring>

#include "kernels/dropout_mask.h"

namespace mpiformer {

std::vector<uint64_t> tensor_digests(ParameterSet& params) {
  // The fp32 masters; where each rank keeps only its slice of them, the
  // compute copy, which every rank holds whole.
  const bool sliced = params.masters_sliced();
  const Act compute = params.compute_copy();
  const size_t bytes = sliced ? dtype_bytes(compute.dtype) : sizeof(float);
  std::vector<uint64_t> digests;
  std::vector<unsigned char> host;  // (largest tensor x bytes)
  for (const ParamInfo& t : params.info()) {
    host.resize(t.size * bytes);
    const void* source = sliced ? (compute + t.offset).data : params.params() + t.offset;
    params.ops().device().copy_to_host(host.data(), source, host.size());
    // Bits, not values: -0 vs +0 or two NaN payloads are a divergence too.
    uint64_t h = mix64(t.size);
    for (size_t i = 0; i < host.size(); i += bytes) {
      uint32_t bits = 0;
      std::memcpy(&bits, host.data() + i, bytes);
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
