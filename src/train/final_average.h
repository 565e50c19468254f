// `train --average-checkpoints K`: once the run has finished, rank 0 writes
// RUNDIR/checkpoints/average_last_K.h5, the mean of the weights of the
// newest K checkpoints the run directory keeps (src/io/checkpoint_average.h).
// The name is not step_*.h5, so pruning and --resume auto leave it alone; a
// later finished run replaces it.
#pragma once

#include "src/core/config.h"
#include "src/parallel/communicator.h"
#include "src/train/startup.h"

namespace mpiformer {

// Averages the newest cfg.average_checkpoints checkpoints of cfg.out_dir
// (fewer when fewer are kept: the line says so) and prints the line that
// names the file. Returns 0, or kExitFailure on every rank when rank 0
// could not write it (one line). Collective.
int write_final_average(const TrainConfig& cfg, const Communicator& comm,
                        const ConfigText& config_text);

}  // namespace mpiformer
