#include "src/parallel/data_parallel.h"

#include <stdexcept>
#include <string>
#include <utility>

#include "kernels/backend.h"
#include "src/parallel/mpi_transport.h"
#include "src/parallel/nccl_transport.h"

namespace mpiformer {

Transport choose_transport(Transport asked, const Ops& ops, const Communicator& comm) {
  if (asked == Transport::kMpi) return Transport::kMpi;
  const bool gpu = ops.device().native_stream() != nullptr;
  if (asked == Transport::kAuto && (!gpu || !nccl_built() || comm.size() == 1))
    return Transport::kMpi;
  // NCCL refuses two ranks on one GPU: every rank must have its own.
  const bool shared_gpu = comm.any(comm.local_size() > cuda_device_count());
  if (asked == Transport::kAuto) return shared_gpu ? Transport::kMpi : Transport::kNccl;
  if (shared_gpu) {
    throw std::invalid_argument(
        "--transport nccl: a node has more ranks than GPUs, and NCCL needs a GPU per rank; use "
        "--transport mpi (or auto) when ranks share a GPU");
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

int64_t count_targets(const std::vector<Batch>& micro, int32_t pad) {
  int64_t n = 0;
  for (const Batch& b : micro) n += b.target_tokens(pad);
  return n;
}

StepGradients step_gradients(Model& model, const std::vector<Batch>& micro, uint64_t seed,
                             int64_t step, float label_smoothing, const Communicator& comm,
                             GradientReducer* reducer, float loss_scale) {
  const int W = comm.size(), K = static_cast<int>(micro.size());
  if (W > 1 && reducer == nullptr)
    throw std::logic_error("step_gradients: more than one rank needs a gradient reducer");
  StepGradients out;
  out.global_targets = comm.allreduce_sum(count_targets(micro, model.config().special.pad));
  if (out.global_targets == 0) {  // every rank sees the same N: all skip together
    out.skipped = true;
    return out;
  }
  const float grad_scale = loss_scale / static_cast<float>(out.global_targets);

  ParameterSet& params = model.parameters();
  params.zero_grads();
  if (reducer) reducer->begin_step(loss_scale);
  for (int k = 0; k < K; ++k) {
    // The exact sum takes each micro-batch's gradient on its own.
    if (k > 0 && reducer && reducer->absorb_micro_batch()) params.zero_grads();
    // Only the last backward pass finishes gradients; it reports them to the
    // reducer as it goes.
    const bool last = k == K - 1;
    const PassId pass{seed, step, comm.rank() + k * W};
    model.forward_backward(micro[k], label_smoothing, grad_scale, pass, last ? reducer : nullptr);
  }
  if (reducer) out.reduce = reducer->finish();
  return out;
}

}  // namespace mpiformer
