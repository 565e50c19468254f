// The MPI transport: MPI_Iallreduce (SUM, float or int64) on host buffers. Open MPI
// progresses non-blocking collectives only inside MPI calls, so the reducer
// tests its slots between backward blocks.
#pragma once

#include <mpi.h>

#include <vector>

#include "src/parallel/transport.h"

namespace mpiformer {

class MpiTransport : public ReduceTransport {
 public:
  explicit MpiTransport(MPI_Comm comm = MPI_COMM_WORLD) : comm_(comm) {}
  std::string name() const override { return "mpi"; }
  void start(int slot, float* x, size_t n) override;
  void start(int slot, int64_t* x, size_t n) override;
  bool test(int slot) override;

 private:
  void start_typed(int slot, void* x, size_t n, MPI_Datatype type, size_t element_bytes);

  MPI_Comm comm_;
  // Requests of each slot: one, or several when n exceeds an int count.
  std::vector<std::vector<MPI_Request>> requests_;
};

}  // namespace mpiformer
