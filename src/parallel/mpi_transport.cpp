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

void MpiTransport::start_typed(int slot, void* x, size_t n, MPI_Datatype type,
                               size_t element_bytes) {
  if (slot < 0) throw std::invalid_argument("MpiTransport: negative slot");
  if (static_cast<size_t>(slot) >= requests_.size()) requests_.resize(slot + 1);
  std::vector<MPI_Request>& pending = requests_[slot];
  if (!pending.empty())
    throw std::logic_error("MpiTransport: slot " + std::to_string(slot) + " started twice");
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
