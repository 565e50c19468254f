// Checkpoint averaging (`mpiformer average`, `train --average-checkpoints`):
// the element-wise mean of the parameters of several checkpoints of one
// model, as fairseq's scripts/average_checkpoints.py and Marian's average
// compute it, written as a checkpoint of data/CHECKPOINT.md that eval,
// generate, classify and analysis/export_hf.py read like any other.
//
// What the average holds:
//   /params        the mean of the inputs' /params, each element summed in
//                  float64 in the order the inputs are given and rounded once
//                  to float32
//   /optimizer     the newest input's moments, copied (resuming from an
//                  average continues the newest input's optimizer from the
//                  averaged weights, as fairseq's average does)
//   attributes     the newest input's (step, config, vocabulary, tokenizer,
//                  label names, data cursor, seed, run_id), and
//                  `averaged_from`: the inputs' paths, one a line, as given
// The newest input is the one of the highest step; the first given among
// equals.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "src/io/checkpoint.h"

namespace mpiformer {

// A fault of an input of averaging, the user's to fix: a file that is
// missing, not a checkpoint, damaged or holding a non-finite value, or one
// of another model than the newest input. what(): "PATH: fault".
class AverageInputError : public CheckpointError {
 public:
  using CheckpointError::CheckpointError;
};

// How two checkpoints' config attributes (INI text) differ as models: ""
// when they are the same model, else the first flag that differs, "--heads
// 4 (not 8)" (this input's value, then the newest's). The flag table that
// reads the text lives above this layer, so the caller supplies it; the
// paths name a file whose config it refuses.
using ModelDifference =
    std::function<std::string(const std::string& this_path, const std::string& this_ini,
                              const std::string& newest_path, const std::string& newest_ini)>;

// What average_checkpoints wrote.
struct CheckpointAverage {
  std::string path;            // the output
  std::string newest;          // the input whose moments and attributes it took
  int64_t step = 0;            // the newest input's
  std::vector<int64_t> steps;  // each input's, in the order given
  size_t parameters = 0;       // elements averaged
};

// Averages `inputs` (at least one, each a checkpoint path) into `out`:
// first every input's attributes, names and shapes are read and checked
// against the newest (tensors, vocabulary size, special ids, tokenizer,
// label names, and what `model_difference` says; a null function skips
// that check), then the tensors are read one name at a time from every
// input and the mean is written, so memory holds one tensor of each input,
// not whole models. The output is written to OUT.tmp, fsync'ed and renamed
// onto `out` (src/io/atomic_file.h); a stop signal under an ExitOnStop
// removes OUT.tmp.
// Throws AverageInputError naming the first input at fault, with the first
// difference from the newest input for another model; CheckpointError
// "OUT: fault" when the output cannot be written. Either way OUT.tmp is
// removed and a file already at `out` is left as it was.
CheckpointAverage average_checkpoints(const std::vector<std::string>& inputs,
                                      const std::string& out,
                                      const ModelDifference& model_difference);

// One line for the user: "the mean of 3 checkpoint(s) (steps 10, 8, 6;
// 28800 parameters): OUT; its moments and attributes are step 10's".
std::string describe_average(const CheckpointAverage& average);

}  // namespace mpiformer
