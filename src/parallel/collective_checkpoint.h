// Checkpoints written and read by every rank at once through MPI-IO
// (parallel HDF5): the file data/CHECKPOINT.md describes, each rank writing
// the range of the flat parameter buffer it holds, so no rank gathers the
// whole state and one write takes the ranks' combined bandwidth. The same
// functions serve replicated runs (each rank writes an even share) and a
// sharded optimizer (each rank writes the slice it owns).
//
// Every metadata call (the file, attributes, groups, datasets) is made by
// every rank in the same order, as parallel HDF5 requires. A rank that fails
// in the middle of the data keeps making the remaining collective calls
// with an empty selection and reports its fault only after them, so no
// rank waits in a collective for one that gave up; the ranks then agree.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "src/core/parameters.h"
#include "src/io/checkpoint.h"
#include "src/parallel/communicator.h"

namespace mpiformer {

// What one rank writes: [begin, end) of the flat buffer (params.count()
// elements, laid out like params.params()) and that range of the fp32
// master weights and both AdamW moments.
struct CheckpointSlice {
  size_t begin = 0, end = 0;
  const float* params = nullptr;  // backend (end - begin)
  const float* m = nullptr;       // backend (end - begin)
  const float* v = nullptr;       // backend (end - begin)
};

// [begin, end) of rank `rank`'s share of n elements split evenly over `world` ranks.
std::pair<size_t, size_t> even_share(size_t n, int rank, int world);

// The end-to-end tests' faults in a checkpoint write, met through one hook
// once /params is written: rank `fail_rank` fails in the write of step
// `fail_step`'s checkpoint (and goes on with nothing to write), or rank 0
// kills itself (SIGKILL) in the write of step `kill_step`'s, half a file on
// disk as a crash leaves it. src/app/train.cpp reads them from the
// environment.
struct CheckpointWriteFault {
  int64_t fail_step = -1;  // -1: none
  int fail_rank = -1;
  int64_t kill_step = -1;  // -1: none
};

// What a collective save left.
struct SavedCheckpoint {
  int code = 0;          // 0, or kExitFailure on every rank (one line printed by one rank)
  std::string path;      // RUNDIR/checkpoints/step_XXXXXXXX.h5
  double seconds = 0.0;  // from the start of the write to `latest` pointing at it
  uint64_t bytes = 0;    // the file's size (rank 0)
};

// Writes RUNDIR/checkpoints/step_XXXXXXXX.h5 with every rank: the data goes
// to temporary_name(PATH), which every rank closes; rank 0 then fsyncs it, renames it,
// points `latest` at it and keeps the newest `keep_last` (as
// save_checkpoint). A fault on any rank is agreed: the temporary file is
// removed, the previous checkpoints and `latest` are left as they were, the
// lowest rank that failed prints "[rank r] PATH: what" and every rank
// returns kExitFailure. `state` counts on rank 0; its strings (config,
// run id, tokenizer, label names) are sent from there to every rank.
// The slices of the ranks together must cover [0, params.count()) once.
SavedCheckpoint save_checkpoint_collectively(const Communicator& comm, const std::string& rundir,
                                             const ParameterSet& params,
                                             const CheckpointSlice& slice, CheckpointState state,
                                             int keep_last, const CheckpointWriteFault& injected);

// Writes every tensor of `params` and its moments to `path` with this
// process alone, through the writer above (a world of one rank: MPI starts
// on first use): the data goes to temporary_name(path), which is closed,
// fsync'ed and renamed to `path`, then the directory is fsync'ed. On a
// fault the temporary file is removed and CheckpointError is thrown. For
// tools and tests; training saves with save_checkpoint_collectively.
// adam_m, adam_v: backend memory (params.count()), laid out like params.params()
void write_checkpoint(const std::string& path, const ParameterSet& params, const float* adam_m,
                      const float* adam_v, const CheckpointState& state);

// As write_checkpoint, to RUNDIR/checkpoints/step_XXXXXXXX.h5 (the step,
// zero-padded to 8 digits), then RUNDIR/checkpoints/latest (one line: the
// file name) is pointed at it and all but the newest `keep_last` step_*.h5
// files are deleted (keep_last <= 0 keeps all; the file just written never).
// Creates the directories as needed. Returns the path written.
// adam_m, adam_v: backend memory (params.count())
std::string save_checkpoint(const std::string& rundir, const ParameterSet& params,
                            const float* adam_m, const float* adam_v, const CheckpointState& state,
                            int keep_last);

// Reads checkpoint `path` with every rank: [params_begin, params_end) of
// /params into params_dest (the whole model, or a sharded run's slice of
// sliced masters), and [begin, end) of the flat buffer of /optimizer/m and
// /optimizer/v into m and v. The names and shapes must
// have been checked against `params` (check_checkpoint_tensors on rank 0's
// read_checkpoint_layout). Returns "" or this rank's fault, "PATH: what"
// (a damaged chunk, a NaN or an infinity in what it read, a file that will
// not open); every rank has made every collective call either way, so the
// caller agrees on the faults next.
// params_dest: backend (params_end - params_begin); m, v: backend (end - begin)
std::string read_checkpoint_collectively(const Communicator& comm, const std::string& path,
                                         const ParameterSet& params, float* params_dest,
                                         size_t params_begin, size_t params_end, size_t begin,
                                         size_t end, float* m, float* v);

}  // namespace mpiformer
