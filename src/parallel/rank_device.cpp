#include "src/parallel/rank_device.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>

#include "kernels/backend.h"
#include "kernels/cpu/blas_kernels.h"
#include "src/core/run_log.h"

namespace mpiformer {

namespace {

// The GPU a rank computes on among the `count` it sees.
int gpu_of(const Communicator& comm, int count) {
  return comm.local_rank() % count;
}

std::string host_name() {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  return host;
}

// MPIFORMER_CUDA_CHECK=1: a first run on a new GPU names the op that failed.
std::unique_ptr<Ops> checked_if_asked(std::unique_ptr<Ops> ops, const Communicator& comm) {
  bool checking = false;
  ops = checked_if_asked(std::move(ops), &checking);
  if (checking && comm.is_root()) {
    say(stderr, "MPIFORMER_CUDA_CHECK=1: the device is checked after every op (slow)\n");
    std::fflush(stderr);
  }
  return ops;
}

// Ranks on nodes of other CPU models may run other OpenBLAS kernel
// families: their gradients then round differently (the replicas stay
// identical, as every rank applies one all-reduced sum), and a rerun on
// other nodes differs in its last bits. Each such rank says so.
void note_blas_kernels_across_ranks(const Communicator& comm) {
  std::string root_core = blas_core();
  comm.broadcast(&root_core, 0);
  if (blas_core() == root_core) return;
  say(stderr,
      "[rank %d] %s: BLAS %s kernels, rank 0 runs %s: this run's gradients round as on these "
      "nodes, and a rerun on other nodes differs in its last bits\n",
      comm.rank(), host_name().c_str(), blas_core().c_str(), root_core.c_str());
  std::fflush(stderr);
}

}  // namespace

std::unique_ptr<Ops> make_ops(DeviceKind device, int threads, const Communicator& comm, bool tf32,
                              std::FILE* report) {
  if (device == DeviceKind::kAuto)
    throw std::logic_error("make_ops: --device auto was not resolved (settle_device)");
  if (device == DeviceKind::kCpu) {
    if (comm.size() > 1) note_blas_kernels_across_ranks(comm);
    return checked_if_asked(make_cpu_ops(threads), comm);
  }
  const int count = cuda_device_count();
  if (count == 0) throw std::runtime_error("--device cuda: no GPU is visible to this rank");
  const int gpu = gpu_of(comm, count);
  std::unique_ptr<Ops> ops = make_cuda_ops(gpu, tf32);
  say(report, "[rank %d] %s: %s (local rank %d of %d, %d GPU(s) visible)\n", comm.rank(),
      host_name().c_str(), ops->device().name().c_str(), comm.local_rank(), comm.local_size(),
      count);
  std::fflush(report);
  return checked_if_asked(std::move(ops), comm);
}

std::vector<std::vector<int>> shared_gpu_groups(const std::vector<std::string>& identities) {
  std::map<std::string, std::vector<int>> by_gpu;
  for (size_t r = 0; r < identities.size(); ++r)
    if (!identities[r].empty()) by_gpu[identities[r]].push_back(static_cast<int>(r));
  std::vector<std::vector<int>> groups;
  for (auto& [gpu, ranks] : by_gpu)
    if (ranks.size() > 1) groups.push_back(std::move(ranks));
  std::sort(groups.begin(), groups.end());
  return groups;
}

std::vector<std::vector<int>> ranks_sharing_gpus(const Communicator& comm) {
  const int count = cuda_device_count();
  std::string identity;
  if (count > 0) {
    const std::string address = cuda_pci_address(gpu_of(comm, count));
    if (!address.empty()) identity = host_name() + " " + address;
  }
  return shared_gpu_groups(comm.allgather(identity));
}

void note_shared_gpus(DeviceKind device, const Communicator& comm, std::FILE* report) {
  if (device != DeviceKind::kCuda || comm.size() == 1) return;
  for (const std::vector<int>& ranks : ranks_sharing_gpus(comm)) {
    if (ranks.front() != comm.rank()) continue;
    std::string names;
    for (int r : ranks) names += (names.empty() ? "" : ", ") + std::to_string(r);
    say(report,
        "[rank %d] %s: ranks %s share one GPU; for a GPU each, ask SLURM for "
        "--gpus-per-task=1 or start as many ranks per node as it has GPUs\n",
        comm.rank(), host_name().c_str(), names.c_str());
    std::fflush(report);
  }
}

}  // namespace mpiformer
