#include "src/parallel/optimizer_shards.h"

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <utility>

namespace mpiformer {

ShardLink::ShardLink(const Communicator& comm, Ops& ops, ShardPlan plan)
    : comm_(comm), ops_(ops), plan_(std::move(plan)) {}

void ShardLink::use_transport(ReduceTransport& transport, int slot) {
  transport_ = &transport;
  slot_ = slot;
  staged_ = !transport.takes_device_memory() && !ops_.device().host_accessible();
  if (staged_ && !host_)
    host_ = static_cast<float*>(
        ops_.device().allocate_host(std::max<size_t>(plan_.bounds.back(), 1) * sizeof(float)));
}

ShardLink::~ShardLink() {
  ops_.device().release_host(host_);
}

void ShardLink::sum_partials(double* partial, size_t n) {
  // One double per 4096 floats: small enough to cross the host every step.
  host_partials_.resize(n);  // (n); allocated by the first step only
  double* host = host_partials_.data();
  ops_.device().copy_to_host(host, partial, n * sizeof(double));
  comm_.allreduce_sum(host, static_cast<int>(n));
  ops_.device().copy_to_device(partial, host, n * sizeof(double));
}

void ShardLink::start_gather(float* params) {
  params_ = params;
  if (!staged_) {
    transport_->start_all_gather(slot_, params, plan_.bounds);
    return;
  }
  const int r = comm_.rank();
  ops_.device().copy_to_host(host_ + plan_.begin(r), params + plan_.begin(r),
                             plan_.size(r) * sizeof(float));
  transport_->start_all_gather(slot_, host_, plan_.bounds);
}

void ShardLink::finish_gather() {
  while (!transport_->test(slot_)) {
  }
  transport_->join();
  if (staged_) ops_.device().copy_to_device(params_, host_, plan_.bounds.back() * sizeof(float));
}

namespace {

// Every rank's slice to rank 0's `whole` (backend memory there).
// slice: backend (plan.size(rank)), whole: rank 0, backend (plan.bounds.back())
void gather_to_root(const Communicator& comm, const ShardPlan& plan, Ops& ops, const float* slice,
                    float* whole) {
  const int rank = comm.rank();
  std::vector<float> mine(plan.size(rank));  // (plan.size(rank))
  ops.device().copy_to_host(mine.data(), slice, mine.size() * sizeof(float));
  // Point to point in pieces of at most INT_MAX floats, rank by rank.
  constexpr size_t kChunk = static_cast<size_t>(INT_MAX);
  if (rank != 0) {
    for (size_t done = 0; done < mine.size();) {
      const int count = static_cast<int>(std::min(mine.size() - done, kChunk));
      MPI_Send(mine.data() + done, count, MPI_FLOAT, 0, 0, MPI_COMM_WORLD);
      done += static_cast<size_t>(count);
    }
    return;
  }
  std::vector<float> host(plan.bounds.back());  // (plan.bounds.back())
  std::copy(mine.begin(), mine.end(), host.begin() + static_cast<ptrdiff_t>(plan.begin(0)));
  for (int r = 1; r < plan.world(); ++r) {
    for (size_t done = plan.begin(r); done < plan.end(r);) {
      const int count = static_cast<int>(std::min(plan.end(r) - done, kChunk));
      MPI_Recv(host.data() + done, count, MPI_FLOAT, r, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      done += static_cast<size_t>(count);
    }
  }
  ops.device().copy_to_device(whole, host.data(), host.size() * sizeof(float));
}

}  // namespace

WholeMoments::WholeMoments(const Communicator& comm, const ShardPlan& plan, Ops& ops,
                           const float* m, const float* v)
    : ops_(ops) {
  const size_t bytes = std::max<size_t>(plan.bounds.back(), 1) * sizeof(float);
  if (comm.is_root()) {
    m_ = static_cast<float*>(ops.device().allocate(bytes));
    v_ = static_cast<float*>(ops.device().allocate(bytes));
  }
  gather_to_root(comm, plan, ops, m, m_);
  gather_to_root(comm, plan, ops, v, v_);
}

WholeMoments::~WholeMoments() {
  ops_.device().release(m_);
  ops_.device().release(v_);
}

}  // namespace mpiformer
