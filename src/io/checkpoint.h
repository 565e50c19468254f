// HDF5 checkpoints (DESIGN.md section 7): float32 master weights and the AdamW
// moments of every tensor, with the step, world size and configuration of the
// run as root attributes. A checkpoint is written under a temporary name,
// fsync'ed and renamed, so a file named step_*.h5 is always complete.
//
// Layout:
//   /params/<name>        float32, the tensor's shape (names keep their dots)
//   /optimizer/m/<name>   float32, same shape
//   /optimizer/v/<name>   float32, same shape
//   root attributes: format = "mpiformer-checkpoint", version, step (int64),
//                    world_size, config (the INI text)
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "src/model/parameters.h"

namespace mpiformer {

constexpr int kCheckpointVersion = 1;

// A fault in a checkpoint file: what() is "FILE: what is wrong".
class CheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct CheckpointState {
  int64_t step = 0;
  int world_size = 1;
  std::string config_ini;  // the effective configuration, re-usable with --config
};

// Writes every tensor of `params` and its moments to `path`: the data goes
// to PATH.tmp, which is closed, fsync'ed and renamed to `path`, then the
// directory is fsync'ed. On a fault the temporary file is removed and
// CheckpointError is thrown. Tensors are copied to the host through
// params.ops(), one at a time.
// adam_m, adam_v: backend memory (params.count()), laid out like params.params()
void write_checkpoint(const std::string& path, const ParameterSet& params, const float* adam_m,
                      const float* adam_v, const CheckpointState& state);

// Writes RUNDIR/checkpoints/step_XXXXXXXX.h5 (the step, zero-padded to 8
// digits) with write_checkpoint, then atomically points RUNDIR/checkpoints/
// latest (one line: the file name) at it, then deletes all but the newest
// `keep_last` step_*.h5 files (keep_last <= 0 keeps all; the file just
// written is never deleted; a file that cannot be deleted is left). Creates
// the directories as needed. Returns the path written.
// adam_m, adam_v: backend memory (params.count())
std::string save_checkpoint(const std::string& rundir, const ParameterSet& params,
                            const float* adam_m, const float* adam_v, const CheckpointState& state,
                            int keep_last);

struct CheckpointTensor {
  std::string name;
  std::vector<int> shape;   // row-major
  std::vector<float> data;  // host (product of shape)
};

// Every tensor of `group` ("params", "optimizer/m" or "optimizer/v"), sorted
// by name. Throws CheckpointError "PATH: fault" for a missing file, a file
// that is not HDF5 or not a checkpoint, a missing group, or a member that is
// not a float32 dataset.
std::vector<CheckpointTensor> read_checkpoint_tensors(const std::string& path,
                                                      const std::string& group);

// The root attributes. Throws CheckpointError like read_checkpoint_tensors.
CheckpointState read_checkpoint_state(const std::string& path);

// True when `path` is an HDF5 file whose root attribute `format` says
// "mpiformer-checkpoint"; false for anything else, never throws.
bool is_checkpoint(const std::string& path);

}  // namespace mpiformer
