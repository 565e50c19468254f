#include "src/parallel/checkpoint_broadcast.h"

#include <algorithm>

namespace mpiformer {

void broadcast_tensors(const Communicator& comm, const std::string& path,
                       const std::vector<CheckpointTensor>& tensors, const ParameterSet& params,
                       float* dest, size_t begin, size_t end) {
  std::vector<float> host(params.count());  // (params.count())
  if (comm.is_root()) unpack_checkpoint_tensors(path, tensors, params, host.data());
  comm.broadcast(host.data(), host.size(), 0);
  end = std::min(end, host.size());
  if (begin < end)
    params.ops().device().copy_to_device(dest, host.data() + begin, (end - begin) * sizeof(float));
}

}  // namespace mpiformer
