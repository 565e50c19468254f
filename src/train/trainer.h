// `mpiformer train`: the training loop, read top to bottom in trainer.cpp;
// its start in startup.cpp, one step in step.cpp.
//
// One optimizer step on W ranks with K micro-batches each takes the global
// micro-batches [(s-1) W K, s W K); rank r takes every W-th of them, so the
// global batch does not depend on W. The loss of every micro-batch is divided
// by N, the step's global count of target tokens (all-reduced before any
// backward), and gradients are summed over ranks: the update is the gradient
// of the mean loss over every target token of the step (docs/DESIGN.md section 1).
//
// A run survives: --resume continues from a checkpoint exactly (the same
// parameters, moments, data cursor and random streams); a stop signal makes
// every rank stop at the next step boundary, write a checkpoint and exit
// kExitStopped; a step whose loss or gradient norm is not finite never
// reaches a checkpoint (src/train/divergence_guard.h); one run at a time
// writes a run directory (src/train/run_directory.h).
#pragma once

#include "src/core/config.h"
#include "src/parallel/communicator.h"
#include "src/train/fault_injection.h"
#include "src/train/startup.h"

namespace mpiformer {

// The whole run: start-up (start_run), then the steps, with progress lines,
// replica checks, evaluations, checkpoints and the agreed stop. Returns the
// exit code (0, kExitStopped, kExitDiverged, or a fault's). Collective.
int train(const TrainConfig& flags, const Communicator& comm, const ConfigText& config_text,
          const FaultInjection& faults = {});

}  // namespace mpiformer
