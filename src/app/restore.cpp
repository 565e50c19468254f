#include "src/app/restore.h"

#include <cstdint>
#include <cstdio>

#include "src/core/run_log.h"

namespace mpiformer {

int agree_on(const Communicator& comm, const Verdict& verdict) {
  uint64_t code = static_cast<uint64_t>(verdict.code);
  comm.broadcast(&code, 1, 0);
  if (comm.is_root() && !verdict.message.empty()) {
    say(stderr, "%s\n", verdict.message.c_str());
    std::fflush(stderr);
  }
  return static_cast<int>(code);
}

void broadcast_tensors(const Communicator& comm, const std::string& path,
                       const std::vector<CheckpointTensor>& tensors, const ParameterSet& params,
                       float* dest) {
  std::vector<float> host(params.count());  // (params.count())
  if (comm.is_root()) unpack_checkpoint_tensors(path, tensors, params, host.data());
  comm.broadcast(host.data(), host.size(), 0);
  params.ops().device().copy_to_device(dest, host.data(), host.size() * sizeof(float));
}

}  // namespace mpiformer
