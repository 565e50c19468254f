// NCCL as a stream transport (src/parallel/stream_transport.h): the
// communicator is created from an ncclUniqueId that rank 0 makes and
// broadcasts over MPI; each bucket's all-reduce (float or int64 SUM) runs on
// a communication stream of the rank's GPU that waits on an event of the
// compute stream, and the compute stream waits on it before the optimizer.
#pragma once

#include <memory>
#include <string>

#include "kernels/ops.h"
#include "src/parallel/communicator.h"
#include "src/parallel/transport.h"

namespace mpiformer {

// Whether this build has NCCL.
bool nccl_built();
// NCCL's version ("2.28.3"), empty without it.
std::string nccl_version();
// A transport over every rank of comm on ops' GPU (ops.device().native_stream()).
// Collective. Throws (the same on every rank where it can) when the build
// has no NCCL or ops has no stream.
std::unique_ptr<ReduceTransport> make_nccl_transport(const Communicator& comm, Ops& ops);

}  // namespace mpiformer
