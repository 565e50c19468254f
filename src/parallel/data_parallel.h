// The ranks of a data-parallel run: which transport carries the gradient
// all-reduce, and the reducer over it. The step that uses them (N, the
// global count of target tokens, all-reduced before any backward; the
// micro-batches' backward passes; the reducer's finish) is
// src/train/step.h.
#pragma once

#include <memory>

#include "kernels/ops.h"
#include "src/parallel/communicator.h"
#include "src/parallel/gradient_reducer.h"

namespace mpiformer {

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

}  // namespace mpiformer
