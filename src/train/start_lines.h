// The start lines of a training run, printed by rank 0 once start-up has
// built the run and checked everything (src/train/startup.cpp): what runs
// on what, the model's shape, memory and arithmetic, the optimization, the
// data, and where the run starts.
#pragma once

#include <cstdint>

#include "src/parallel/communicator.h"
#include "src/train/memory_budget.h"
#include "src/train/startup.h"

namespace mpiformer {

// What the start lines tell beyond the run's parts: figures of the phases.
struct StartNotes {
  uint64_t flag_seed = 0;  // --seed as given (a resumed run goes on with the checkpoint's)
  int threads = 1;
  Transport transport = Transport::kMpi;  // what --transport resolved to
  MemoryEstimate memory;
  double lr_factor = 1.0;          // --lr-scaling's factor
  int64_t step_budget = 0;         // tokens per step, for --lr-scaling
  float lr = 0.0f;                 // the scaled peak learning rate
  AttentionPreparation attention;  // the attention graphs built before step 1
};

// Rank 0's start lines (the other ranks print nothing).
void print_start(const TrainingRun& run, const Communicator& comm, const ConfigText& config_text,
                 const StartNotes& notes);

}  // namespace mpiformer
