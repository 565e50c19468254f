#include "src/app/device.h"

#include <unistd.h>

#include <cstdio>
#include <stdexcept>
#include <string>
#include <utility>

#include "kernels/backend.h"
#include "src/core/run_log.h"

namespace mpiformer {

namespace {

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

}  // namespace

std::unique_ptr<Ops> make_ops(DeviceKind device, int threads, const Communicator& comm, bool tf32) {
  if (device == DeviceKind::kCpu) return checked_if_asked(make_cpu_ops(threads), comm);
  const int count = cuda_device_count();
  if (count == 0) throw std::runtime_error("--device cuda: no GPU is visible to this rank");
  const int gpu = comm.local_rank() % count;
  std::unique_ptr<Ops> ops = make_cuda_ops(gpu, tf32);
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  say(stdout, "[rank %d] %s: %s (local rank %d of %d, %d GPU(s) visible)\n", comm.rank(), host,
      ops->name().c_str(), comm.local_rank(), comm.local_size(), count);
  std::fflush(stdout);
  return checked_if_asked(std::move(ops), comm);
}

}  // namespace mpiformer
