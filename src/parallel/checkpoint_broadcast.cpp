#include "src/parallel/checkpoint_broadcast.h"

namespace mpiformer {

void broadcast_tensors(const Communicator& comm, const std::string& path,
                       const std::vector<CheckpointTensor>& tensors, const ParameterSet& params,
                       float* dest) {
  std::vector<float> host(params.count());  // (params.count())
  if (comm.is_root()) unpack_checkpoint_tensors(path, tensors, params, host.data());
  comm.broadcast(host.data(), host.size(), 0);
  params.ops().device().copy_to_device(dest, host.data(), host.size() * sizeof(float));
}

}  // namespace mpiformer
