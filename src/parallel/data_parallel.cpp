#include "src/parallel/data_parallel.h"

#include <stdexcept>
#include <string>
#include <utility>

#include "kernels/backend.h"
#include "src/parallel/mpi_transport.h"
#include "src/parallel/nccl_transport.h"
#include "src/parallel/rank_device.h"

namespace mpiformer {

Transport choose_transport(Transport asked, const Ops& ops, const Communicator& comm) {
  if (asked == Transport::kMpi) return Transport::kMpi;
  const bool gpu = ops.device().native_stream() != nullptr;
  if (asked == Transport::kAuto && (!gpu || !nccl_built() || comm.size() == 1))
    return Transport::kMpi;
  // NCCL refuses two ranks on one GPU: every rank must have its own.
  const std::vector<std::vector<int>> sharing = ranks_sharing_gpus(comm);
  if (asked == Transport::kAuto) return sharing.empty() ? Transport::kNccl : Transport::kMpi;
  if (!sharing.empty()) {
    throw std::invalid_argument(
        "--transport nccl: ranks " + std::to_string(sharing[0].front()) + " and " +
        std::to_string(sharing[0][1]) +
        " share one GPU, and NCCL needs a GPU per rank; use --transport mpi (or auto) when "
        "ranks share a GPU");
  }
  return Transport::kNccl;
}

double bucket_mb_for(double asked, Transport transport) {
  if (asked > 0) return asked;
  return transport == Transport::kNccl ? kNcclBucketMb : kMpiBucketMb;
}

std::unique_ptr<GradientReducer> make_reducer(ParameterSet& params, double bucket_mb, bool overlap,
                                              GradSum sum, Transport transport,
                                              const Communicator& comm) {
  const bool nccl = transport == Transport::kNccl;
  if (comm.size() == 1 && sum == GradSum::kFloat && !nccl) return nullptr;
  const size_t bucket_floats =
      static_cast<size_t>(bucket_mb_for(bucket_mb, transport) * (1 << 20) / sizeof(float));
  std::unique_ptr<ReduceTransport> carrier;
  if (nccl)
    carrier = make_nccl_transport(comm, params.ops());
  else if (comm.size() == 1)
    carrier = std::make_unique<LocalTransport>();
  else
    carrier = std::make_unique<MpiTransport>();
  return std::make_unique<GradientReducer>(params, params.grads(), bucket_floats,
                                           std::move(carrier), overlap, sum);
}

}  // namespace mpiformer
