// metrics.h5 (docs/DESIGN.md section 7): the run's figures for notebooks, written
// by rank 0 in HDF5's single-writer/multiple-reader (SWMR) mode, so a reader
// can follow a run while it trains (read_metrics here, read_metrics of
// analysis/mpiformer_metrics.py): as an SWMR reader with bounded retries
// while HDF5 marks the file as open for writing, as a plain one otherwise
// (hdf5::open_read_only).
//
// Layout (1-D datasets, one row per log interval or evaluation, growing):
//   /train/step (int64), loss, tokens (int64), accuracy, lr, grad_norm,
//          tokens_per_s, step_ms, padding_efficiency, loss_scale, nll,
//          elapsed_s, epoch, comm_wait_ms, hidden_share, then a multi-label
//          classifier's micro_precision, micro_recall, micro_f1,
//          macro_precision, macro_recall, macro_f1 (float64; only in the
//          files of multi-label classifiers)
//   /eval/step (int64), loss, perplexity, accuracy (float64), tokens (int64),
//          nll, elapsed_s, the six label figures (float64, likewise), then
//          bleu (float64; only in the files of seq2seq runs with --valid-bleu)
// (version 1 files lack the columns after loss_scale and tokens, version 2
// files the label figures; carried into a version 3 file on resume, those
// read as NaN. Version 3 files of other models than multi-label classifiers
// written before the label figures became theirs alone hold them as NaN.)
//   root attributes: format = "mpiformer-metrics", version, config, model,
//          world_size, devices, versions, git_commit, resumed_at_steps,
//          run_id (the run's id, as in config.ini; absent in earlier files)
// Columns grow one at a time: a reader that catches a row half-written sees
// columns of different lengths and should use the shortest.
//
// metrics.jsonl beside it holds the same rows for tools that read lines:
// {"group": "train"|"eval", "step": 10, "loss": ..., ...}, NaN as null.
// Either file rebuilds the other on resume when one is missing.
#pragma once

#include <hdf5.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "src/io/label_figures.h"

namespace mpiformer {

constexpr int kMetricsVersion = 3;
// The root attribute `format` of a metrics file.
constexpr const char* kMetricsFormat = "mpiformer-metrics";

// A fault of the metrics file: what() is "PATH: what is wrong".
class MetricsError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct TrainRow {
  int64_t step = 0;
  double loss = 0, accuracy = 0;  // global token-weighted, over the log interval
  int64_t tokens = 0;             // target tokens of the interval, all ranks
  double lr = 0, grad_norm = 0;   // at `step`
  double tokens_per_s = 0, step_ms = 0, padding_efficiency = 1, loss_scale = 1;
  double nll = 0;           // true negative log-likelihood per target token
  double elapsed_s = 0;     // wall time since the run began, over every resume
  double epoch = 0;         // epochs of training data consumed (NaN: synthetic)
  double comm_wait_ms = 0;  // mean wait per step for the gradient all-reduce
  double hidden_share = 0;  // share of all-reduce time hidden by backward (NaN: one rank)
  LabelFigures labels;      // classify --loss zlpr
};

struct EvalRow {
  int64_t step = 0;
  double loss = 0, perplexity = 0, accuracy = 0;
  int64_t tokens = 0;
  double nll = 0, elapsed_s = 0;
  LabelFigures labels;
  double bleu = std::nan("");  // seq2seq --valid-bleu: of greedy translations, 0..100
};

// What a reader needs to know about the run (root attributes).
struct RunAttributes {
  std::string config;  // the INI text
  std::string model;   // lm | seq2seq | mlm | classify
  int world_size = 1;
  std::string devices, versions, git_commit;
  std::string run_id;  // "" in a file of a version without run ids
  // Whether the six label figures are columns: a multi-label classifier's
  // (a reader sees them as NaN in other files).
  bool label_figures = false;
  // Whether /eval/bleu is a column: a seq2seq run's with --valid-bleu.
  bool valid_bleu = false;
};

struct MetricsTable;

class MetricsLog {
 public:
  // Creates `path` (keep_through_step < 0). Resuming (keep_through_step >=
  // 0, the step the run resumes from), the rows of an existing file up to
  // that step are carried into a new one that replaces it, with the step
  // appended to resumed_at_steps. A missing metrics.h5 is rebuilt from the
  // rows of metrics.jsonl, a missing metrics.jsonl from metrics.h5's (see
  // note()). Then SWMR writing starts. Throws MetricsError for a path that
  // is not a writable metrics file, leaving a file that is not ours
  // untouched.
  MetricsLog(const std::string& path, const RunAttributes& attrs, int64_t keep_through_step);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  // Append one row and flush it to disk, where readers see it.
  void append(const TrainRow& row);
  void append(const EvalRow& row);

  const std::string& path() const { return path_; }
  // elapsed_s of the last row carried over on resume (0 for a new run).
  double elapsed_before() const { return elapsed_before_; }
  // On resume, one line when a file was missing and rebuilt from the other
  // (or both were missing); "" otherwise.
  const std::string& note() const { return note_; }

 private:
  struct Column {
    std::string name;
    hid_t id = H5I_INVALID_HID;
    bool integer = false;
    size_t source = 0;  // its value's place in a row of every column
  };
  // A multi-label classifier's figures and bleu only where attrs say so.
  void open_columns(const char* group, const std::vector<std::pair<const char*, bool>>& names,
                    const RunAttributes& attrs, std::vector<Column>* columns);
  // values: one per column, in column order (integers exact up to 2^53).
  // append_row flushes; write_row does not and needs the caller's session.
  void append_row(std::vector<Column>& columns, hsize_t* rows, const std::vector<double>& values);
  void write_row(std::vector<Column>& columns, hsize_t* rows, const std::vector<double>& values);
  void close_all() noexcept;
  // The constructor's last steps: the rows of `old` (carried on resume) up
  // to keep_through_step go to the new metrics.h5 (write_kept_rows, in the
  // caller's session) and to metrics.jsonl, written anew as json_target and
  // renamed over it (rewrite_json, which opens json_ with open_json).
  void write_kept_rows(const MetricsTable& old, int64_t keep_through_step);
  void rewrite_json(const std::string& json_target, const MetricsTable& old,
                    int64_t keep_through_step);
  void open_json(const std::string& json_target);
  // One JSON line to metrics.jsonl (no flush to disk: a line tool reads it).
  void append_json(const char* group, const std::vector<Column>& columns,
                   const std::vector<double>& values);

  std::string path_;
  hid_t file_ = H5I_INVALID_HID;
  std::vector<Column> train_, eval_;
  hsize_t train_rows_ = 0, eval_rows_ = 0;
  std::FILE* json_ = nullptr;  // metrics.jsonl
  double elapsed_before_ = 0;
  std::string note_;
};

// A metrics file as read back (also while a run writes it, or after one was
// killed writing it: then an SWMR read, its checksum retries bounded).
struct MetricsTable {
  RunAttributes attrs;
  std::vector<int64_t> resumed_at_steps;
  // Column names in file order, and rows (the shortest column's length).
  std::vector<std::string> train_columns, eval_columns;
  std::vector<std::vector<double>> train_rows, eval_rows;
};

// Throws MetricsError "PATH: fault".
MetricsTable read_metrics(const std::string& path);

// The rows of a metrics.jsonl, in the columns of this version (a key the
// line lacks reads as NaN; attrs stay empty). An unfinished last line (a
// writer killed mid-line) is left out. Throws MetricsError "PATH line N:
// fault" for a line that is not a row.
MetricsTable read_metrics_jsonl(const std::string& path);

// True when `path` is an HDF5 file whose root attribute `format` says
// "mpiformer-metrics"; never throws.
bool is_metrics_file(const std::string& path);

}  // namespace mpiformer
