#include "src/parallel/nccl_transport.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "src/parallel/stream_transport.h"

#ifdef MPIFORMER_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>
#endif

namespace mpiformer {

#ifdef MPIFORMER_HAVE_NCCL
namespace {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw std::runtime_error(std::string("NCCL transport: ") + what + ": " +
                             cudaGetErrorString(status));
}

void check(ncclResult_t status, const char* what) {
  if (status != ncclSuccess)
    throw std::runtime_error(std::string("NCCL transport: ") + what + ": " +
                             ncclGetErrorString(status));
}

// The compute stream (the backend's) and a communication stream of the
// highest priority, so a bucket's all-reduce is not queued behind the
// backward kernels the GPU has in hand; events per slot, without timing.
class CudaStreamQueue final : public StreamQueue {
 public:
  explicit CudaStreamQueue(cudaStream_t compute) : compute_(compute) {
    int least = 0, greatest = 0;
    check(cudaDeviceGetStreamPriorityRange(&least, &greatest), "stream priorities");
    check(cudaStreamCreateWithPriority(&comm_, cudaStreamNonBlocking, greatest), "stream");
  }
  ~CudaStreamQueue() override {
    cudaStreamSynchronize(comm_);
    for (cudaEvent_t e : ready_) cudaEventDestroy(e);
    for (cudaEvent_t e : done_) cudaEventDestroy(e);
    cudaStreamDestroy(comm_);
  }
  cudaStream_t comm() const { return comm_; }

  void comm_waits_for_compute(int slot) override {
    check(cudaEventRecord(event(ready_, slot), compute_), "cudaEventRecord");
    check(cudaStreamWaitEvent(comm_, event(ready_, slot), 0), "cudaStreamWaitEvent");
  }
  void record_done(int slot) override {
    check(cudaEventRecord(event(done_, slot), comm_), "cudaEventRecord");
  }
  bool done(int slot) override {
    const cudaError_t status = cudaEventQuery(event(done_, slot));
    if (status == cudaErrorNotReady) return false;
    check(status, "all-reduce");
    return true;
  }
  void compute_waits_for(int slot) override {
    check(cudaStreamWaitEvent(compute_, event(done_, slot), 0), "cudaStreamWaitEvent");
  }

 private:
  cudaEvent_t event(std::vector<cudaEvent_t>& events, int slot) {
    while (static_cast<int>(events.size()) <= slot) {
      cudaEvent_t e = nullptr;
      check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
      events.push_back(e);
    }
    return events[slot];
  }

  cudaStream_t compute_;
  cudaStream_t comm_ = nullptr;
  std::vector<cudaEvent_t> ready_, done_;
};

class NcclCollective final : public StreamCollective {
 public:
  NcclCollective(const Communicator& comm, cudaStream_t stream) : stream_(stream) {
    // Rank 0's id reaches every rank over MPI; so does its failure to make
    // one ("!" and the reason), so that no rank waits for an id that never
    // comes.
    ncclUniqueId id{};
    std::string bytes;
    if (comm.is_root()) {
      const ncclResult_t status = ncclGetUniqueId(&id);
      bytes = status == ncclSuccess ? std::string(reinterpret_cast<const char*>(&id), sizeof id)
                                    : std::string("!") + ncclGetErrorString(status);
    }
    comm.broadcast(&bytes, 0);
    if (bytes.size() != sizeof id)
      throw std::runtime_error("NCCL transport: rank 0 has no ncclUniqueId: " + bytes.substr(1));
    std::copy(bytes.begin(), bytes.end(), reinterpret_cast<char*>(&id));
    check(ncclCommInitRank(&comm_, comm.size(), id, comm.rank()), "ncclCommInitRank");
  }
  ~NcclCollective() override {
    if (comm_) ncclCommDestroy(comm_);
  }
  void all_reduce(float* x, size_t n) override {
    check(ncclAllReduce(x, x, n, ncclFloat32, ncclSum, comm_, stream_), "ncclAllReduce");
  }
  void all_reduce(int64_t* x, size_t n) override {
    check(ncclAllReduce(x, x, n, ncclInt64, ncclSum, comm_, stream_), "ncclAllReduce");
  }
  void reduce(float* x, size_t n, int root) override {
    check(ncclReduce(x, x, n, ncclFloat32, ncclSum, root, comm_, stream_), "ncclReduce");
  }
  void reduce(int64_t* x, size_t n, int root) override {
    check(ncclReduce(x, x, n, ncclInt64, ncclSum, root, comm_, stream_), "ncclReduce");
  }
  void broadcast(float* x, size_t n, int root) override {
    check(ncclBroadcast(x, x, n, ncclFloat32, root, comm_, stream_), "ncclBroadcast");
  }
  void group_start() override { check(ncclGroupStart(), "ncclGroupStart"); }
  void group_end() override { check(ncclGroupEnd(), "ncclGroupEnd"); }
  std::string async_error() override {
    if (!comm_) return error_;  // aborted already
    ncclResult_t async = ncclSuccess;
    const ncclResult_t status = ncclCommGetAsyncError(comm_, &async);
    const ncclResult_t failure = status != ncclSuccess ? status : async;
    if (failure == ncclSuccess || failure == ncclInProgress) return "";
    error_ = std::string("all-reduce failed: ") + ncclGetErrorString(failure);
    if (const char* detail = ncclGetLastError(comm_); detail && *detail)
      error_ += std::string(" (") + detail + ")";
    // Its kernels would wait for the failed peer forever: aborting ends
    // them, so the streams drain while the error unwinds.
    ncclCommAbort(comm_);
    comm_ = nullptr;
    return error_;
  }

 private:
  cudaStream_t stream_;
  ncclComm_t comm_ = nullptr;  // null once aborted
  std::string error_;          // why it was aborted
};

}  // namespace

bool nccl_built() {
  return true;
}

std::string nccl_version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "";
  // 2.19 and later: major * 10000 + minor * 100 + patch
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
         std::to_string(v % 100);
}

std::unique_ptr<ReduceTransport> make_nccl_transport(const Communicator& comm, Ops& ops) {
  auto* compute = static_cast<cudaStream_t>(ops.device().native_stream());
  if (compute == nullptr)
    throw std::invalid_argument("--transport nccl needs --device cuda (the " + ops.device().name() +
                                " backend has no stream)");
  // Every rank learns whether every rank has its streams before any waits
  // in NCCL's set-up.
  std::unique_ptr<CudaStreamQueue> queue;
  std::string failure;
  try {
    queue = std::make_unique<CudaStreamQueue>(compute);
  } catch (const std::exception& e) {
    failure = e.what();
  }
  if (comm.any(!failure.empty())) {
    throw std::runtime_error(failure.empty() ? "NCCL transport: another rank has no streams"
                                             : failure);
  }
  auto collective = std::make_unique<NcclCollective>(comm, queue->comm());
  return std::make_unique<StreamTransport>("nccl", std::move(queue), std::move(collective));
}

#else

bool nccl_built() {
  return false;
}

std::string nccl_version() {
  return "";
}

std::unique_ptr<ReduceTransport> make_nccl_transport(const Communicator&, Ops&) {
  throw std::invalid_argument(
      "--transport nccl: this build has no NCCL (it was not found at configure time)");
}

#endif

}  // namespace mpiformer
