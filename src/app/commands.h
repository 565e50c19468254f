// The sub-commands. Each returns the process exit code.
#pragma once

#include "src/core/config.h"
#include "src/dist/communicator.h"

namespace mpiformer {

int run_train(const TrainConfig& cfg, Communicator& comm);
int run_bench(const BenchConfig& cfg, Communicator& comm);

}  // namespace mpiformer
