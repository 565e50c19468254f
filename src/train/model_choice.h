// Choosing a model by its validation metric (the nll, or seq2seq's BLEU
// under --valid-bleu): --keep-best N keeps the checkpoints of the N best
// evaluations, --early-stop N stops a run whose metric has not improved in
// N evaluations. Rank 0 keeps the record in the run directory:
//   checkpoints/validation.tsv   every evaluation: "step<TAB>metric<TAB>value",
//                                the history --early-stop counts from
//   checkpoints/best/step_X.h5   the N best evaluations' checkpoints (hard
//                                links, so pruning by --keep-checkpoints
//                                leaves them; a copy where links fail)
//   checkpoints/best.h5          the best of them (eval, generate and
//                                export_hf read it like any checkpoint)
// A resumed run keeps the rows up to the step it resumes from; later ones
// belonged to a branch that was given up, and so do their kept files.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace mpiformer {

struct ValidationScore {
  int64_t step = 0;
  double value = 0;
};

class ModelChoice {
 public:
  // metric: "nll" (lower is better) or "bleu" (higher is better).
  // Throws std::runtime_error when the record cannot be read or repaired.
  ModelChoice(const std::string& rundir, const std::string& metric, int keep_best,
              int64_t resumed_step);

  const std::string& metric() const { return metric_; }
  // True when `value` would be among the kept best (its step then needs a
  // checkpoint before record()).
  bool would_keep(double value) const;
  // Records an evaluation. checkpoint: its step's file ("" when it has
  // none), linked into best/ when the evaluation is among the kept best.
  // Throws std::runtime_error when the record or a link cannot be written.
  void record(int64_t step, double value, const std::string& checkpoint);
  // Evaluations after the best one (0: the last one is the best).
  int evaluations_since_best() const;
  // The best evaluation (step 0: none yet).
  ValidationScore best() const;
  // "nll 2.1345 at step 400" (value printed as the eval lines print it).
  std::string describe(const ValidationScore& score) const;

 private:
  bool better(double a, double b) const;  // a is better than b
  // The kept best, best first (ties: the earlier step).
  std::vector<ValidationScore> ranked() const;
  void write_history() const;
  std::filesystem::path kept_path(int64_t step) const;  // best/step_X.h5
  void refresh_links() const;

  std::string dir_;  // RUNDIR/checkpoints
  std::string metric_;
  int keep_best_ = 0;
  std::vector<ValidationScore> history_;  // in step order
};

}  // namespace mpiformer
