// The MPI transport: MPI_Iallreduce (SUM, float or int64) on host buffers. Open MPI
// progresses non-blocking collectives only inside MPI calls, so the reducer
// tests its slots between backward blocks.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <vector>

#include "src/parallel/transport.h"

namespace mpiformer {

class MpiTransport : public ReduceTransport {
 public:
  explicit MpiTransport(MPI_Comm comm = MPI_COMM_WORLD) : comm_(comm) {
    MPI_Comm_rank(comm_, &rank_);
  }
  std::string name() const override { return "mpi"; }
  void start(int slot, float* x, size_t n) override;
  void start(int slot, int64_t* x, size_t n) override;
  void start_reduce_to_owners(int slot, float* x, size_t offset, size_t n,
                              const std::vector<size_t>& bounds) override;
  void start_reduce_to_owners(int slot, int64_t* x, size_t offset, size_t n,
                              const std::vector<size_t>& bounds) override;
  void start_all_gather(int slot, float* x, const std::vector<size_t>& bounds) override;
  bool test(int slot) override;

 private:
  void start_typed(int slot, void* x, size_t n, MPI_Datatype type, size_t element_bytes);
  void reduce_to_owners(int slot, void* x, size_t offset, size_t n,
                        const std::vector<size_t>& bounds, MPI_Datatype type, size_t element_bytes);
  // The slot's request list, checked empty (each slot starts once until tested).
  std::vector<MPI_Request>& open_slot(int slot);

  MPI_Comm comm_;
  int rank_ = 0;
  // MPI_Iallgatherv's counts and displacements, which must live until it completes.
  std::vector<int> gather_counts_, gather_displs_;
  // Requests of each slot: one, or several when n exceeds an int count.
  std::vector<std::vector<MPI_Request>> requests_;
};

}  // namespace mpiformer
