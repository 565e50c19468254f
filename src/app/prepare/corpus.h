// The text of `mpiformer prepare`: the lines of --input (and --target, or
// classify's --labels) and of --valid and --test, which of them are usable,
// and how they fall into the splits: training lines first, then the
// validation lines, then the test lines, each held-out split carved from the
// end of the input unless it comes from files. Also the label vocabulary of
// classify's training lines, and rank 0's line saying what was read.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "src/app/prepare/progress.h"
#include "src/core/config.h"
#include "src/data/labels.h"
#include "src/data/tokenizer.h"

namespace mpiformer::prepare {

// A carved split is at most one line (pair) in kHoldOut of the input's.
constexpr size_t kHoldOut = 10;

// SentencePiece trains only on lines up to this many bytes (its
// max_sentence_length) and skips longer ones; they are still encoded. A
// longer limit would let one huge line stall training for minutes.
constexpr size_t kLongestTrainedLine = kTrainedLineLimit;

// One text: --input (and --target), or the files of --valid or --test.
struct Text {
  std::string input_path, target_path;     // target: seq2seq only
  std::vector<std::string> input, target;  // every line
  std::string labels_path;                 // classify only
  std::vector<std::string> labels;         // every line
  std::vector<size_t> sequences;           // line numbers (0-based) of the usable lines/pairs
  size_t blank = 0;                        // lines (pairs) skipped because a side was blank
  bool seq2seq() const { return !target_path.empty(); }
  // "kjv.txt", "a.en and a.de"
  std::string name() const { return seq2seq() ? input_path + " and " + target_path : input_path; }
  std::string units(size_t n) const {
    return std::string(seq2seq() ? "line pair" : "line") + (n == 1 ? "" : "s");
  }
};

// A split: sequences [begin, end) of a text's usable ones.
struct Span {
  const Text* text = nullptr;  // null: no such split
  size_t begin = 0, end = 0;
  size_t size() const { return end - begin; }
  // Where it comes from, for the shards' `origin` attribute and the report:
  // "kjv.txt lines 29103-30102".
  std::string origin() const {
    if (size() == 0) return text->name();
    return text->name() + " lines " + std::to_string(text->sequences[begin] + 1) + "-" +
           std::to_string(text->sequences[end - 1] + 1);
  }
};

struct Corpus {
  Text main;                   // --input (and --target)
  Text valid_file, test_file;  // --valid, --test (read on rank 0 only)
  // Carved from the end of main: the test lines last, the validation lines
  // before them.
  size_t valid_carved = 0, test_carved = 0;

  size_t train_count() const { return main.sequences.size() - valid_carved - test_carved; }
  Span train() const { return {&main, 0, train_count()}; }
  Span valid() const {
    if (!valid_file.input_path.empty()) return {&valid_file, 0, valid_file.sequences.size()};
    return {&main, train_count(), train_count() + valid_carved};
  }
  Span test() const {
    if (!test_file.input_path.empty()) return {&test_file, 0, test_file.sequences.size()};
    if (test_carved == 0) return {};
    return {&main, main.sequences.size() - test_carved, main.sequences.size()};
  }
  bool carved() const { return valid_carved + test_carved > 0; }
};

bool is_blank(const std::string& line);

// The texts cfg names, not read yet.
Corpus corpus_of(const PrepareConfig& cfg);

// Reads the main text and carves the held-out splits from it; `root` also
// reads --valid and --test.
void read_corpus(const PrepareConfig& cfg, bool root, Corpus* c);

// Usable training sequences with a side longer than kLongestTrainedLine.
size_t too_long_to_train(const Span& train);

// classify: the label vocabulary of the training lines, the same on every
// rank (each read the whole text).
LabelVocabulary training_labels(const Corpus& c);

// Rank 0's lines on what was read and how it splits.
void report_corpus(const Corpus& c, Clock::time_point start, const Say& say);

}  // namespace mpiformer::prepare
