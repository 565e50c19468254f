#include "src/parallel/mpi_transport.h"

#include <algorithm>
#include <climits>
#include <stdexcept>
#include <string>

namespace mpiformer {

void MpiTransport::start(int slot, float* x, size_t n) {
  start_typed(slot, x, n, MPI_FLOAT, sizeof(float));
}

void MpiTransport::start(int slot, int64_t* x, size_t n) {
  start_typed(slot, x, n, MPI_INT64_T, sizeof(int64_t));
}

std::vector<MPI_Request>& MpiTransport::open_slot(int slot) {
  if (slot < 0) throw std::invalid_argument("MpiTransport: negative slot");
  if (static_cast<size_t>(slot) >= requests_.size()) requests_.resize(slot + 1);
  std::vector<MPI_Request>& pending = requests_[slot];
  if (!pending.empty())
    throw std::logic_error("MpiTransport: slot " + std::to_string(slot) + " started twice");
  return pending;
}

void MpiTransport::start_typed(int slot, void* x, size_t n, MPI_Datatype type,
                               size_t element_bytes) {
  std::vector<MPI_Request>& pending = open_slot(slot);
  // MPI counts are int: a range past 2^31 elements goes in pieces, the same
  // on every rank because every rank passes the same n.
  constexpr size_t kChunk = static_cast<size_t>(INT_MAX);
  char* bytes = static_cast<char*>(x);
  size_t done = 0;
  do {
    const int count = static_cast<int>(std::min(n - done, kChunk));
    MPI_Request request;
    MPI_Iallreduce(MPI_IN_PLACE, bytes + done * element_bytes, count, type, MPI_SUM, comm_,
                   &request);
    pending.push_back(request);
    done += static_cast<size_t>(count);
  } while (done < n);
}

void MpiTransport::start_reduce_to_owners(int slot, float* x, size_t offset, size_t n,
                                          const std::vector<size_t>& bounds) {
  reduce_to_owners(slot, x, offset, n, bounds, MPI_FLOAT, sizeof(float));
}

void MpiTransport::start_reduce_to_owners(int slot, int64_t* x, size_t offset, size_t n,
                                          const std::vector<size_t>& bounds) {
  reduce_to_owners(slot, x, offset, n, bounds, MPI_INT64_T, sizeof(int64_t));
}

void MpiTransport::reduce_to_owners(int slot, void* x, size_t offset, size_t n,
                                    const std::vector<size_t>& bounds, MPI_Datatype type,
                                    size_t element_bytes) {
  std::vector<MPI_Request>& pending = open_slot(slot);
  constexpr size_t kChunk = static_cast<size_t>(INT_MAX);
  char* bytes = static_cast<char*>(x);
  // One in-place reduce per owner whose slice meets [offset, offset + n),
  // in rank order on every rank.
  for (size_t r = 0; r + 1 < bounds.size(); ++r) {
    const size_t lo = std::max(offset, bounds[r]), hi = std::min(offset + n, bounds[r + 1]);
    for (size_t done = lo; done < hi;) {
      const int count = static_cast<int>(std::min(hi - done, kChunk));
      char* at = bytes + (done - offset) * element_bytes;
      MPI_Request request;
      MPI_Ireduce(static_cast<int>(r) == rank_ ? MPI_IN_PLACE : at, at, count, type, MPI_SUM,
                  static_cast<int>(r), comm_, &request);
      pending.push_back(request);
      done += static_cast<size_t>(count);
    }
  }
  if (pending.empty()) {  // no slice meets it: complete at once
    pending.push_back(MPI_REQUEST_NULL);
  }
}

void MpiTransport::start_all_gather(int slot, float* x, const std::vector<size_t>& bounds) {
  std::vector<MPI_Request>& pending = open_slot(slot);
  if (bounds.empty() || bounds.back() <= static_cast<size_t>(INT_MAX)) {
    const size_t world = bounds.size() - 1;
    gather_counts_.resize(world);
    gather_displs_.resize(world);
    for (size_t r = 0; r < world; ++r) {
      gather_counts_[r] = static_cast<int>(bounds[r + 1] - bounds[r]);
      gather_displs_[r] = static_cast<int>(bounds[r]);
    }
    MPI_Request request;
    MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, x, gather_counts_.data(),
                    gather_displs_.data(), MPI_FLOAT, comm_, &request);
    pending.push_back(request);
    return;
  }
  // Past int counts: each slice broadcast from its owner, in pieces.
  constexpr size_t kChunk = static_cast<size_t>(INT_MAX);
  for (size_t r = 0; r + 1 < bounds.size(); ++r) {
    for (size_t done = bounds[r]; done < bounds[r + 1];) {
      const int count = static_cast<int>(std::min(bounds[r + 1] - done, kChunk));
      MPI_Request request;
      MPI_Ibcast(x + done, count, MPI_FLOAT, static_cast<int>(r), comm_, &request);
      pending.push_back(request);
      done += static_cast<size_t>(count);
    }
  }
}

bool MpiTransport::test(int slot) {
  if (static_cast<size_t>(slot) >= requests_.size()) return true;
  std::vector<MPI_Request>& pending = requests_[slot];
  if (pending.empty()) return true;
  int complete = 0;
  MPI_Testall(static_cast<int>(pending.size()), pending.data(), &complete, MPI_STATUSES_IGNORE);
  if (complete) pending.clear();
  return complete != 0;
}

}  // namespace mpiformer
