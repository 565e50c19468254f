// The backend a rank computes on: the CPU, or the GPU its local rank maps to
// (local rank % visible GPUs), reported at start.
#pragma once

#include <cstdio>
#include <memory>

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

}  // namespace mpiformer
