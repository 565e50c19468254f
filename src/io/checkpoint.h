// HDF5 checkpoints (docs/DESIGN.md section 7): float32 master weights, the AdamW
// moments of every tensor, and everything a resumed run needs to continue
// exactly where this one stopped. A checkpoint is written under a temporary
// name, fsync'ed and renamed, so a file named step_*.h5 is always complete.
//
// Layout:
//   /params/<name>        float32, the tensor's shape (names keep their dots)
//   /optimizer/m/<name>   float32, same shape
//   /optimizer/v/<name>   float32, same shape
//   /tokenizer            uint8, SentencePiece model bytes (runs on shards only)
//   /label_names          uint8, a classifier's label names, one a line (classify only)
//   root attributes:
//     format = "mpiformer-checkpoint", version, step (int64), world_size,
//     config (the INI text),
//     optimizer_steps         AdamW updates taken (its bias correction)
//     data_next_batch         first micro-batch index of the next step
//     data_epoch              the epoch that index falls in (0: no epochs)
//     data_batches_per_step   micro-batches one step read (W x K; K per rank
//                             under --sharding file)
//     data_sharding           "data" (global indices) or "file" (per rank)
//     rng_seed, rng_streams   the key of every random stream, and how each
//                             is positioned (see CheckpointState)
//     loss_scale, loss_scale_good_steps
//     vocab_size, pad_id, bos_id, eos_id, unk_id, mask_id, sep_id
//     run_id                  the run that wrote it (absent in files of
//                             earlier versions)
//     averaged_from           the checkpoints an average was made of, one
//                             path a line (absent in others; checkpoint_average.h)
#pragma once

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "src/core/config.h"
#include "src/core/parameters.h"

namespace mpiformer {

constexpr int kCheckpointVersion = 2;
// The root attribute `format` of a checkpoint.
constexpr const char* kCheckpointFormat = "mpiformer-checkpoint";

// A fault in a checkpoint file: what() is "FILE: what is wrong".
class CheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A checkpoint's flags do not fit the model these flags build: one line
// naming the first tensor that differs.
class CheckpointMismatch : public CheckpointError {
 public:
  using CheckpointError::CheckpointError;
};

struct CheckpointState {
  int64_t step = 0;             // training steps done
  int world_size = 1;           // ranks of the run that wrote it
  std::string config_ini;       // the effective configuration, re-usable with --config
  int64_t optimizer_steps = 0;  // AdamW updates (a step without targets takes none)

  // Data cursor. Training reads one sequence of micro-batches (global, or
  // per rank under --sharding file); the next step starts at next_batch.
  uint64_t next_batch = 0;
  uint64_t epoch = 0;            // of next_batch; 0 for synthetic tasks
  int64_t batches_per_step = 1;  // W x K (per rank: K)
  std::string sharding = "data";

  // Every random stream is counter-based, a pure function of the seed and a
  // position the run already records, so the seed is their whole state:
  // init (seed), dropout (seed, step, micro-batch of the step), data order
  // (seed, epoch), masking and synthetic data (seed, batch index).
  uint64_t seed = 0;

  // Dynamic loss scaling (fp16): the scale and the overflow-free steps since
  // it last changed; 1 and 0 where no scaler runs (fp32, bf16).
  double loss_scale = 1.0;
  int64_t loss_scale_good_steps = 0;

  // The vocabulary the model was trained on.
  int vocab_size = 0;
  SpecialTokens special;
  std::string tokenizer;                 // SentencePiece model bytes; empty for synthetic tasks
  std::vector<std::string> label_names;  // classify: the shards' label vocabulary

  // The run that wrote it (RUNDIR/config.ini's run id); "" for a file of a
  // version that had no run ids, and not written when "".
  std::string run_id;

  // The progress line's figures of the steps since the last line, every
  // rank's (ProgressWindow::save in src/train/progress.h), so that the
  // first line after a resume covers the same steps as without the stop;
  // "" in files of earlier versions, and not written when "".
  std::string progress_window;

  // A checkpoint written by averaging others (src/io/checkpoint_average.h):
  // their paths, one a line; "" (not written) for any other.
  std::string averaged_from;
};

// RUNDIR/checkpoints/step_XXXXXXXX.h5 for `step`, the directory created as
// needed. Throws CheckpointError.
std::string checkpoint_path_for(const std::string& rundir, int64_t step);

// Deletes all but the newest `keep_last` step_*.h5 files of RUNDIR (as
// save_checkpoint does; `kept` is never deleted).
void prune_checkpoints(const std::string& rundir, const std::string& kept, int keep_last);

struct CheckpointTensor {
  std::string name;
  std::vector<int> shape;   // row-major
  std::vector<float> data;  // host (product of shape)
};

// Every tensor of `group` ("params", "optimizer/m" or "optimizer/v"), sorted
// by name. Throws CheckpointError "PATH: fault" for a missing file, a file
// that is not HDF5 or not a checkpoint, a missing group, or a member that is
// not a float32 dataset.
// Without `with_data`, names and shapes only (the data is left empty).
std::vector<CheckpointTensor> read_checkpoint_tensors(const std::string& path,
                                                      const std::string& group,
                                                      bool with_data = true);

// The root attributes and /tokenizer. Throws CheckpointError like
// read_checkpoint_tensors.
CheckpointState read_checkpoint_state(const std::string& path);

// A whole checkpoint in host memory; reading it verifies every checksum.
struct LoadedCheckpoint {
  std::string path;
  CheckpointState state;
  std::vector<CheckpointTensor> params, m, v;  // each sorted by name
};
LoadedCheckpoint read_checkpoint(const std::string& path);

// The state and every tensor's name and shape, no data: what rank 0 checks
// before the ranks read the tensors collectively (src/parallel/
// collective_checkpoint.h). Faults as read_checkpoint, but a damaged chunk
// or a non-finite value is found only by reading the data.
LoadedCheckpoint read_checkpoint_layout(const std::string& path);

// Throws CheckpointMismatch "PATH: ..." naming the first tensor whose name or
// shape differs from params.info().
void check_checkpoint_tensors(const std::string& path, const std::vector<CheckpointTensor>& tensors,
                              const ParameterSet& params);

// Copies `tensors` (one group of a LoadedCheckpoint) into `dest`, laid out
// like params.params(). Throws CheckpointMismatch "PATH: ..." when the names
// or shapes differ from params.info().
// dest: host (params.count())
void unpack_checkpoint_tensors(const std::string& path,
                               const std::vector<CheckpointTensor>& tensors,
                               const ParameterSet& params, float* dest);

// Throws CheckpointError "PATH: GROUP tensor 'NAME' holds non-finite values
// ..." for the first tensor with a NaN or an infinity: the run that wrote it
// had diverged, and nothing can start from it.
void require_finite(const std::string& path, const std::vector<CheckpointTensor>& tensors,
                    const std::string& group);

// The reason require_finite gives for tensor `name` of `group` holding `bad`.
std::string non_finite_fault(const std::string& group, const std::string& name, float bad);

// The model a command scores or decodes with (eval, generate, classify):
// the checkpoint's state and its finite parameters.
struct ModelCheckpoint {
  CheckpointState state;
  std::vector<CheckpointTensor> params;
};

// Checks a checkpoint's config attribute (INI text) before its tensors are
// read; throws UsageError "PATH: what". The flag table that reads the text
// lives above this layer, so the caller supplies it.
using ConfigCheck = std::function<void(const std::string& config_ini)>;

// Reads the model of `path`, given as `flag`: the state, `check_config` of
// its config, then the parameters. The file is what the user gave, so any
// fault of it (not HDF5, damaged, not a checkpoint, a config its flags would
// refuse, non-finite parameters) is a UsageError "FLAG: PATH: what", exit
// code 2.
ModelCheckpoint read_model_checkpoint(const std::string& path, const std::string& flag,
                                      const ConfigCheck& check_config);

// RUNDIR/checkpoints/step_*.h5, newest (highest step) first. Temporary
// files of a write that never finished are not listed.
std::vector<std::string> list_checkpoints(const std::string& rundir);

// The step of a file named step_NNNNNNNN.h5 (any directory); -1 for any other name.
int64_t checkpoint_step(const std::string& path);

// The checkpoint RUNDIR/checkpoints/latest names, when that file exists;
// "" when there is no `latest` or it names no step_*.h5 file there.
std::string latest_checkpoint(const std::string& rundir);

// The checkpoint RUNDIR/checkpoints/latest names; "" when there is no
// `latest`. Throws CheckpointError "RUNDIR/checkpoints/latest: ..." when it
// is empty, names no step_*.h5 file, names one outside that directory or one
// that does not exist: the head of the run is then unknown, and taking
// another checkpoint silently could start from the wrong one.
std::string read_latest(const std::string& rundir);

// Points RUNDIR/checkpoints/latest at `path` (a file in that directory),
// atomically and durably. Throws CheckpointError.
void point_latest_at(const std::string& rundir, const std::string& path);

// True when `path` is an HDF5 file whose root attribute `format` says
// "mpiformer-checkpoint"; false for anything else, never throws.
bool is_checkpoint(const std::string& path);

}  // namespace mpiformer
