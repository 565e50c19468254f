#include "src/parallel/communicator.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <thread>

#include "src/core/run_log.h"

namespace mpiformer {

Communicator::Communicator(int* argc, char*** argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) throw std::runtime_error("MPI was already finalized");
    // Open MPI's MPI-IO: ROMIO, which reports a failed write (a full disk)
    // as an error code for the checkpoint's one line, where OMPIO also
    // prints lines of its own. A choice in the environment stands.
    setenv("OMPI_MCA_io", "romio321", /*overwrite=*/0);
    // FUNNELED: only the main thread calls MPI; OpenMP workers never do.
    int provided = 0;
    MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
    owns_mpi_ = true;
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);

  // Ranks that share memory share a node: their index among themselves picks
  // the GPU and their count divides the cores.
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &local_rank_);
  MPI_Comm_size(node, &local_size_);
  MPI_Comm_free(&node);
  // Each node counted once, by its local rank 0.
  int first_of_node = local_rank_ == 0 ? 1 : 0;
  MPI_Allreduce(&first_of_node, &nodes_, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Allreduce(&local_size_, &fewest_local_, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&local_size_, &most_local_, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
}

std::string Communicator::describe_nodes() const {
  if (nodes_ == 1) return "1 node";
  const std::string local = fewest_local_ == most_local_ ? std::to_string(most_local_)
                                                         : std::to_string(fewest_local_) + " to " +
                                                               std::to_string(most_local_);
  return std::to_string(nodes_) + " nodes x " + local +
         (most_local_ == 1 ? " local rank" : " local ranks");
}

Communicator::~Communicator() {
  if (!owns_mpi_) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

int Communicator::cores_per_local_rank() const {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / local_size_);
}

int64_t Communicator::allreduce_sum(int64_t x) const {
  int64_t sum = 0;
  MPI_Allreduce(&x, &sum, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  return sum;
}

double Communicator::allreduce_sum(double x) const {
  double sum = 0.0;
  MPI_Allreduce(&x, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  return sum;
}

void Communicator::allreduce_sum(double* x, int n) const {
  MPI_Allreduce(MPI_IN_PLACE, x, n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
}

void Communicator::allreduce_sum(int64_t* x, int n) const {
  MPI_Allreduce(MPI_IN_PLACE, x, n, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
}

void Communicator::allreduce_sum(float* x, size_t n) const {
  // MPI counts are int: a buffer past 2^31 floats goes in pieces. Every rank
  // passes the same n, so every rank makes the same calls.
  constexpr size_t kChunk = static_cast<size_t>(INT_MAX);
  size_t done = 0;
  do {
    const int count = static_cast<int>(std::min(n - done, kChunk));
    MPI_Allreduce(MPI_IN_PLACE, x + done, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    done += static_cast<size_t>(count);
  } while (done < n);
}

bool Communicator::any(bool flag) const {
  int local = flag ? 1 : 0;
  int global = 0;
  MPI_Allreduce(&local, &global, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD);
  return global != 0;
}

std::pair<int, int> Communicator::min_with_rank(int value) const {
  struct {
    int value;
    int rank;
  } local{value, rank_}, global{};
  MPI_Allreduce(&local, &global, 1, MPI_2INT, MPI_MINLOC, MPI_COMM_WORLD);
  return {global.value, global.rank};
}

void Communicator::broadcast(uint64_t* x, int n, int root) const {
  MPI_Bcast(x, n, MPI_UINT64_T, root, MPI_COMM_WORLD);
}

std::string Communicator::library_version() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int length = 0;
  MPI_Get_library_version(text, &length);
  std::string v(text, static_cast<size_t>(std::max(length, 0)));
  const size_t end = v.find_first_of("\r\n,");
  return v.substr(0, end);
}

int Communicator::max(int value) const {
  int global = value;
  MPI_Allreduce(&value, &global, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return global;
}

void Communicator::broadcast(std::string* text, int root) const {
  uint64_t size = text->size();
  broadcast(&size, 1, root);
  text->resize(size);
  constexpr uint64_t kPiece = uint64_t{1} << 30;  // MPI counts are int
  for (uint64_t done = 0; done < size; done += kPiece) {
    MPI_Bcast(text->data() + done, static_cast<int>(std::min(kPiece, size - done)), MPI_CHAR, root,
              MPI_COMM_WORLD);
  }
}

std::vector<std::string> Communicator::allgather(const std::string& text) const {
  const int length = static_cast<int>(text.size());
  std::vector<int> lengths(static_cast<size_t>(size_)), offsets(static_cast<size_t>(size_) + 1);
  MPI_Allgather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, MPI_COMM_WORLD);
  for (int r = 0; r < size_; ++r) offsets[r + 1] = offsets[r] + lengths[r];
  std::string all(static_cast<size_t>(offsets[size_]), '\0');
  MPI_Allgatherv(text.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(),
                 MPI_CHAR, MPI_COMM_WORLD);
  std::vector<std::string> texts;
  for (int r = 0; r < size_; ++r) texts.push_back(all.substr(offsets[r], lengths[r]));
  return texts;
}

void Communicator::broadcast(float* x, size_t n, int root) const {
  constexpr size_t kPiece = size_t{1} << 30;  // MPI counts are int
  for (size_t done = 0; done < n; done += kPiece) {
    MPI_Bcast(x + done, static_cast<int>(std::min(kPiece, n - done)), MPI_FLOAT, root,
              MPI_COMM_WORLD);
  }
}

void Communicator::barrier() const {
  MPI_Barrier(MPI_COMM_WORLD);
}

bool Communicator::started_by_mpirun() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr;
}

void Communicator::barrier_without_spinning() const {
  MPI_Request request;
  MPI_Ibarrier(MPI_COMM_WORLD, &request);
  int done = 0;
  for (MPI_Test(&request, &done, MPI_STATUS_IGNORE); !done;
       MPI_Test(&request, &done, MPI_STATUS_IGNORE)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

void Communicator::abort(const std::string& message, int code) const {
  say(stderr, "[rank %d] %s\n", rank_, message.c_str());
  abort(code);
}

void Communicator::abort(int code) const {
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);  // MPI_Abort should not return; never fall through if it does
}

}  // namespace mpiformer
