// The run directory RUNDIR (docs/DESIGN.md section 7), as rank 0 keeps it:
//
//   RUNDIR/.lock                 one run at a time (src/io/dir_lock.h)
//   RUNDIR/config.ini, metrics.h5
//   RUNDIR/checkpoints/step_*.h5, latest
//   RUNDIR/abandoned/<UTC time>/ checkpoints of a branch given up, with its metrics.h5
//
// A run resumes from `latest` (--resume auto) or from a checkpoint named on
// the command line. Resuming from an older checkpoint starts a new branch:
// the checkpoints of later steps move to abandoned/ (never deleted), and
// `latest` and metrics.h5 follow the new branch.
//
// Each run has an id, made when its directory first holds it and recorded
// in config.ini ("# run-id = ..."), metrics.h5 and every checkpoint, so a
// file of another run copied in is refused instead of merged. A directory
// of a version without ids is adopted: it gets one on its next start.
#pragma once

#include <string>
#include <vector>

#include "src/io/checkpoint.h"
#include "src/io/dir_lock.h"
#include "src/parallel/agreement.h"

namespace mpiformer {

// Where a run starts: fresh, or the state of a checkpoint (rank 0 also holds
// its tensors' names and shapes; the ranks read the data collectively).
struct StartPoint {
  bool resumed = false;
  CheckpointState state;        // every rank (scalars only)
  LoadedCheckpoint checkpoint;  // rank 0: path, state, tensors without data
};

class RunDirectory {
 public:
  explicit RunDirectory(std::string path) : path_(std::move(path)) {}

  // Creates the directory as needed and locks it for this process for as
  // long as this object lives. A directory in use by another job, or one
  // that cannot be created, is a verdict of exit 2, and nothing is changed.
  Verdict open();

  // A start that ends before the run takes the directory (a refusal, or
  // nothing to do) leaves no trace: the lock is dropped, and the
  // directories open() created are removed again while they are empty.
  void withdraw();

  // --resume none | auto | PATH. none refuses a directory that holds a run;
  // auto takes `latest` (or, without one, the newest checkpoint), and the one
  // before it when it is damaged; PATH takes that file or fails. A bad
  // `latest`, or a checkpoint or metrics.h5 of another run, is refused;
  // PATH of another run into a directory that holds a run only with
  // `other_run` (--resume-other-run). Learns the run's id.
  Verdict choose_start(const std::string& resume, bool other_run, StartPoint* start);

  // Once every check has passed: the resumed checkpoint becomes the head of
  // the run. Checkpoints of later steps move to abandoned/<UTC time>/ with a
  // copy of metrics.h5 and config.ini, and `latest` names the resumed
  // checkpoint. A run without an id gets one. Returns a line for the log
  // ("" when nothing moved). Throws std::runtime_error.
  std::string make_head(const StartPoint& start);

  // The run's id (known after make_head) for config.ini, metrics.h5 and
  // checkpoints, and, for a run started from a checkpoint of another run,
  // "PATH (run ID, step S)" (else "").
  const std::string& run_id() const { return run_id_; }
  const std::string& origin() const { return origin_; }

  // A checkpoint whose data turned out damaged when the ranks read it
  // (src/parallel/collective_checkpoint.h): the next choose_start under
  // --resume auto passes over it, to the one before.
  void skip_damaged(const std::string& path) { damaged_.push_back(path); }

  // Removes the temporary files of writes that never finished (a killed
  // job), of checkpoints and of the run's own files: nobody else writes
  // here while the lock is held. Returns how many were removed.
  int remove_unfinished_writes();

  const std::string& path() const { return path_; }
  // RUNDIR/checkpoints/latest's file, or "" (none yet).
  std::string latest() const { return latest_checkpoint(path_); }

 private:
  // What choose_start has learnt so far, for its steps and their messages.
  struct StartSearch {
    std::string flag;  // "--resume auto" or "--resume"
    // Where run_id_ came from: config.ini, metrics.h5 or the checkpoint resumed.
    std::string recorded_in;
    std::vector<std::string> found;  // RUNDIR/checkpoints/step_*.h5
    bool has_metrics = false;        // RUNDIR/metrics.h5 exists
  };
  // Refuses `file` of run `id` in a directory that holds run run_id_.
  Verdict refuse_foreign(const StartSearch& search, const std::string& file,
                         const std::string& what, const std::string& id,
                         const std::string& remedy) const;
  // metrics.h5's run id: learnt when config.ini gave none, else it must agree.
  Verdict learn_metrics_run(const std::string& metrics, StartSearch* search);
  // --resume auto from `path`: it and the checkpoints after it are this run's.
  Verdict check_branch(const std::string& path, const CheckpointState& state, StartSearch* search);
  // --resume PATH: a checkpoint of another run, allowed or refused.
  Verdict check_named_start(const std::string& path, const CheckpointState& state, bool other_run,
                            const StartSearch& search);

  std::string path_;
  std::string created_;  // the outermost directory open() created; "" when none
  DirLock lock_;
  std::string run_id_, origin_;
  std::vector<std::string> damaged_;  // passed over by --resume auto
};

}  // namespace mpiformer
