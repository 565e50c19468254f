// The MPI control plane: rank, size, local rank (ranks sharing a node, from
// MPI_Comm_split_type SHARED), small reductions and the error exit. Model
// code never calls MPI; it sees this interface.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace mpiformer {

class Communicator {
 public:
  // Initialises MPI (MPI_THREAD_FUNNELED) unless already initialised.
  Communicator(int* argc, char*** argv);
  ~Communicator();  // finalises MPI if it initialised it
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  // Nodes of the world: groups of ranks that share memory.
  int nodes() const { return nodes_; }
  // "1 node", "2 nodes x 2 local ranks", "3 nodes x 1 to 2 local ranks":
  // where the ranks run, for the start lines.
  std::string describe_nodes() const;
  bool is_root() const { return rank_ == 0; }
  // The node's cores shared evenly by the ranks on it (at least 1).
  int cores_per_local_rank() const;

  int64_t allreduce_sum(int64_t x) const;
  double allreduce_sum(double x) const;
  // In place, element-wise SUM over all ranks.  x: (n)
  void allreduce_sum(double* x, int n) const;
  void allreduce_sum(float* x, size_t n) const;
  void allreduce_sum(int64_t* x, int n) const;
  // True on every rank when it is true on any rank (agreed status flags).
  bool any(bool flag) const;
  // The smallest `value` over ranks, and the lowest rank holding it (MPI_MINLOC).
  std::pair<int, int> min_with_rank(int value) const;
  // The largest `value` over ranks (agreed exit codes).
  int max(int value) const;
  // x: (n), root's values to every rank.
  void broadcast(uint64_t* x, int n, int root) const;
  // root's text to every rank.
  void broadcast(std::string* text, int root) const;
  // Every rank's short text (under 2^31 bytes in all), in rank order, to every rank.
  std::vector<std::string> allgather(const std::string& text) const;
  // x: host (n), root's values to every rank; n may pass 2^31.
  void broadcast(float* x, size_t n, int root) const;
  void barrier() const;
  // A barrier that sleeps instead of spinning: while one rank works alone
  // (rank 0 training a tokenizer), the waiting ranks leave their cores to it.
  void barrier_without_spinning() const;

  // Open MPI's mpirun started this process (it names the world's size in
  // the environment); false under srun or run on its own.
  static bool started_by_mpirun();

  // The first line of MPI_Get_library_version ("Open MPI v4.1.4, ...").
  static std::string library_version();

  // Prints "[rank r] message" to stderr and ends every rank with `code`.
  [[noreturn]] void abort(const std::string& message, int code) const;
  // Ends every rank with `code` and says nothing: for a caller that has
  // said why itself (without allocating, when memory ran out).
  [[noreturn]] void abort(int code) const;

 private:
  int rank_ = 0;
  int size_ = 1;
  int local_rank_ = 0;
  int local_size_ = 1;
  int nodes_ = 1;
  int fewest_local_ = 1;  // the fewest and most ranks on one node
  int most_local_ = 1;
  bool owns_mpi_ = false;
};

}  // namespace mpiformer
