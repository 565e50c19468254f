// One optimizer step's gradient on W ranks (docs/DESIGN.md section 1):
//
//   N    = sum over ranks and micro-batches of target tokens   (MPI_Allreduce, before any backward)
//   grad = sum over ranks of grad(sum of this rank's losses / N)  (the bucketed all-reduce)
//
// so every rank ends with the gradient of the mean loss over every target
// token of the global step, however the tokens fall across ranks.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "src/data/batch.h"
#include "src/loss/cross_entropy.h"
#include "src/model/model.h"
#include "src/parallel/communicator.h"
#include "src/parallel/gradient_reducer.h"

namespace mpiformer {

struct StepGradients {
  int64_t global_targets = 0;  // N: target tokens of the step on all ranks
  bool skipped = false;        // N == 0: every rank skips the step, gradients untouched
  ReduceTiming reduce;         // empty on one rank
};

// The transport `asked` resolves to for a run on ops' backend (collective):
// nccl when asked, or for auto when the backend is a GPU, the build has
// NCCL, there are several ranks and every rank has a GPU of its own (no two
// ranks of a node share one); mpi otherwise. Throws when nccl is asked but
// a node has more ranks than GPUs.
Transport choose_transport(Transport asked, const Ops& ops, const Communicator& comm);

// Bucket caps when --bucket-mb is 0: NCCL pays a latency per bucket on
// many ranks (analysis/SCALING.md: 25 MiB or more from 64 ranks on); MPI on
// one node wants small buckets that start early.
constexpr double kNcclBucketMb = 25.0;
constexpr double kMpiBucketMb = 4.0;
// The cap a run uses: asked when positive, else the transport's.
double bucket_mb_for(double asked, Transport transport);

// The gradient reducer of a run on comm's ranks with buckets of bucket_mb
// MiB (bucket_mb_for) over `transport` (from choose_transport; mpi on one rank sums
// locally). Null on a single rank with the float sum and no NCCL (nothing
// to do); the exact sum needs it on one rank too, so that one rank sums
// like many.
std::unique_ptr<GradientReducer> make_reducer(ParameterSet& params, double bucket_mb, bool overlap,
                                              GradSum sum, Transport transport,
                                              const Communicator& comm);

// Target tokens (weight-1 positions) of this rank's micro-batches.
int64_t count_targets(const std::vector<Batch>& micro, int32_t pad);

// Leaves in params.grads() the step's global mean-loss gradient, times
// loss_scale, identical on every rank; this rank's loss sums are added to
// the model's training sums (Model::take_train_sums). micro: this rank's K
// micro-batches (any of them may be empty); micro-batch k of rank r is the
// step's global micro-batch r + k W, which picks its dropout masks.
// reducer: required when W > 1 (null: the float sum on one rank). Collective.
StepGradients step_gradients(Model& model, const std::vector<Batch>& micro, uint64_t seed,
                             int64_t step, float label_smoothing, const Communicator& comm,
                             GradientReducer* reducer, float loss_scale = 1.0f);

}  // namespace mpiformer
