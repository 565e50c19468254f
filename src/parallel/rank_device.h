// The backend a rank computes on: the CPU, or the GPU its local rank maps to
// (local rank % visible GPUs), reported at start.
#pragma once

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "src/core/config.h"
#include "src/parallel/communicator.h"

namespace mpiformer {

// threads: CPU threads (0 is not allowed here; resolve it first). tf32:
// fp32 GEMMs on TF32 tensor cores (cuda). With --device cuda every rank
// prints "[rank r] HOST: cuda:D (NAME) (local rank l of n, g GPU(s) visible)"
// on `report` (stdout, or stderr where stdout carries a command's output).
// Throws std::runtime_error.
std::unique_ptr<Ops> make_ops(DeviceKind device, int threads, const Communicator& comm,
                              bool tf32 = false, std::FILE* report = stdout);

// The ranks that share a GPU, in groups of two or more (ascending), from
// each rank's identity: its host and its GPU's PCI address, "" for a rank
// without a GPU (it shares with none). Under SLURM's --gpus-per-task every
// rank sees its own GPU as device 0, so counts of visible GPUs cannot tell.
std::vector<std::vector<int>> shared_gpu_groups(const std::vector<std::string>& identities);
// Collective: shared_gpu_groups of the world's ranks, each on the GPU
// make_ops gives it (none on a CPU-only build).
std::vector<std::vector<int>> ranks_sharing_gpus(const Communicator& comm);
// Collective, after every rank's make_ops: with --device cuda the lowest
// rank of each group of ranks sharing a GPU says so in one line on
// `report`, naming --gpus-per-task (allowed: the tests share one GPU).
void note_shared_gpus(DeviceKind device, const Communicator& comm, std::FILE* report = stdout);

}  // namespace mpiformer
