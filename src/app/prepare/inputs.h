// Rank 0's checks of what `mpiformer prepare` was given: the flags, the
// files and the output directory before any work, then the text once read.
// Each refusal throws a UsageError naming the flag (one line, exit 2 once
// every rank has agreed on it), so no rank starts work on inputs that
// cannot succeed.
#pragma once

#include <string>
#include <vector>

#include "src/app/prepare/corpus.h"
#include "src/core/config.h"
#include "src/data/labels.h"

namespace mpiformer::prepare {

// A pipe or device is refused before it is opened: opening a pipe blocks
// until it has a writer, and what it gives is gone once read. `why`, when
// given, says who reads the file twice.
void require_readable_file(const std::string& flag, const std::string& path,
                           const std::string& why = "");

// --out is not a file and holds no shard set. Checked again under the
// directory's lock: only a check under the lock can be trusted.
void require_fresh_output(const std::string& dir);

// The files of a text kind (--input, --target, --valid, --test), --out and
// --tokenizer; returns the --tokenizer model's bytes ("" without one).
std::string check_text_inputs(const PrepareConfig& cfg);

// The flags and files of --kind image.
void check_image_inputs(const PrepareConfig& cfg);

// The refusals of the corpus once read; returns the warnings to print once
// every check has passed.
std::vector<std::string> validate_corpus(const PrepareConfig& cfg, const Corpus& c);

// classify: the training lines have labels to learn.
void require_training_labels(const PrepareConfig& cfg, const LabelVocabulary& vocabulary);

}  // namespace mpiformer::prepare
