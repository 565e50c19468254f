// The sub-commands. Each returns the process exit code.
#pragma once

#include "src/core/config.h"
#include "src/parallel/communicator.h"

namespace mpiformer {

int run_train(const TrainConfig& cfg, Communicator& comm);
int run_bench(const BenchConfig& cfg, Communicator& comm);
int run_eval(const EvalConfig& cfg, Communicator& comm);
int run_generate(const GenerateConfig& cfg, Communicator& comm);
int run_classify(const ClassifyConfig& cfg, Communicator& comm);
// The mean of checkpoints' weights into cfg.out (src/io/checkpoint_average.h),
// on rank 0. An input at fault (missing, damaged, of another model): one
// line, exit 2; a write fault: exit 1, and cfg.out is left as it was.
int run_average(const AverageConfig& cfg, Communicator& comm);
// Text to HDF5 shards in cfg.out_dir (train-NNNNN.h5, valid-00000.h5,
// test-00000.h5 with --test or --test-lines,
// tokenizer.model). Faults of the inputs found before any work: one line,
// exit 2; faults while working: exit 1, and nothing is left in the directory.
int run_prepare(const PrepareConfig& cfg, Communicator& comm);

}  // namespace mpiformer
