// Rank 0's refusals of prepare's inputs (inputs.h): readable regular files,
// a fresh output directory, a --tokenizer that keeps mpiformer's ids, and
// the faults of the text once read (empty files, sides or labels of
// different lengths, too few lines to hold any out, more shards than
// training lines), with the warnings for a held-out split that was capped.
#include "src/app/prepare/inputs.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <utility>

#include "src/app/prepare/output.h"
#include "src/core/error.h"
#include "src/data/tokenizer.h"
#include "src/io/shard.h"

namespace mpiformer::prepare {
namespace {

namespace fs = std::filesystem;

// Every rank reads the text, and SentencePiece reads it again.
void require_text_file(const std::string& flag, const std::string& path) {
  require_readable_file(flag, path, "SentencePiece reads it more than once");
}

// The --tokenizer model's bytes, after checking it keeps mpiformer's ids.
std::string load_given_tokenizer(const PrepareConfig& cfg) {
  require_readable_file("--tokenizer", cfg.tokenizer);
  std::unique_ptr<Tokenizer> tokenizer;
  try {
    tokenizer = Tokenizer::from_file(cfg.tokenizer);
  } catch (const std::runtime_error& e) {
    usage_error("--tokenizer", e.what());
  }
  const std::string mismatch = tokenizer->special_ids_mismatch();
  if (!mismatch.empty()) {
    usage_error("--tokenizer", cfg.tokenizer + ": its special ids differ from mpiformer's (" +
                                   mismatch + "); train one with `mpiformer prepare`");
  }
  if (cfg.vocab_size != 0 && cfg.vocab_size != tokenizer->vocab_size()) {
    usage_error("--vocab-size", std::to_string(cfg.vocab_size) + ", but --tokenizer " +
                                    cfg.tokenizer + " has " +
                                    std::to_string(tokenizer->vocab_size()) + " pieces");
  }
  return tokenizer->model_bytes();
}

// The faults of one text. `flag` names the text (--input, --valid, --test).
void validate_text(const std::string& flag, const Text& t) {
  const auto all_blank = [](const std::vector<std::string>& lines) {
    return std::all_of(lines.begin(), lines.end(), is_blank);
  };
  if (all_blank(t.input))
    throw std::runtime_error(t.input_path + ": empty input (no non-blank lines)");
  if (!t.labels_path.empty()) {
    if (t.labels.size() != t.input.size()) {
      usage_error(flag == "--input" ? "--labels" : flag,
                  t.labels_path + " has " + std::to_string(t.labels.size()) + " lines but " +
                      t.input_path + " has " + std::to_string(t.input.size()));
    }
    for (size_t line = 0; line < t.labels.size(); ++line) {
      try {
        parse_label_line(t.labels[line]);
      } catch (const std::invalid_argument& e) {
        usage_error(flag == "--input" ? "--labels" : flag,
                    t.labels_path + ":" + std::to_string(line + 1) + ": " + e.what());
      }
    }
  }
  if (!t.seq2seq()) return;
  if (all_blank(t.target)) {
    throw std::runtime_error(t.target_path + ": empty input (no non-blank lines)");
  }
  if (t.target.size() != t.input.size()) {
    const std::string input_flag = flag == "--input" ? "--input " : "";
    usage_error(flag == "--input" ? "--target" : flag,
                t.target_path + " has " + std::to_string(t.target.size()) + " lines but " +
                    input_flag + t.input_path + " has " + std::to_string(t.input.size()));
  }
  if (t.sequences.empty()) {
    throw std::runtime_error(t.input_path + " and " + t.target_path +
                             ": no line pair has both sides non-blank");
  }
}

}  // namespace

void require_readable_file(const std::string& flag, const std::string& path,
                           const std::string& why) {
  std::error_code ec;
  if (!fs::exists(path, ec)) usage_error(flag, path + ": no such file");
  if (fs::is_directory(path, ec)) usage_error(flag, path + ": is a directory, not a file");
  if (!fs::is_regular_file(path, ec)) {
    usage_error(flag, path + " is not a regular file" + (why.empty() ? "" : " (" + why + ")"));
  }
  if (!std::ifstream(path, std::ios::binary)) usage_error(flag, path + ": cannot read");
}

void require_fresh_output(const std::string& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) return;
  if (!fs::is_directory(dir, ec)) usage_error("--out", dir + ": exists and is not a directory");
  if (!list_shards(dir, kTrainPrefix).empty() || !list_shards(dir, kValidPrefix).empty() ||
      !list_shards(dir, kTestPrefix).empty() || fs::exists(fs::path(dir) / kTokenizerFile, ec)) {
    usage_error("--out", dir + " already holds shards; choose another directory");
  }
}

std::string check_text_inputs(const PrepareConfig& cfg) {
  const bool seq2seq = cfg.kind == "seq2seq";
  require_text_file("--input", cfg.input);
  if (seq2seq) require_text_file("--target", cfg.target);
  if (cfg.kind == "classify") require_readable_file("--labels", cfg.labels);
  for (const auto& [flag, files] : {std::pair{"--valid", cfg.valid}, {"--test", cfg.test}}) {
    if (!files.given()) continue;
    require_readable_file(flag, files.input);
    // seq2seq's targets, classify's labels
    if (!files.target.empty()) require_readable_file(flag, files.target);
  }
  require_fresh_output(cfg.out_dir);
  return cfg.tokenizer.empty() ? "" : load_given_tokenizer(cfg);
}

void check_image_inputs(const PrepareConfig& cfg) {
  if (cfg.valid.given() || cfg.test.given()) {
    usage_error(cfg.valid.given() ? "--valid" : "--test",
                "--kind image holds out the last images: use --valid-lines and "
                "--test-lines");
  }
  require_readable_file("--input", cfg.input);
  require_fresh_output(cfg.out_dir);
}

std::vector<std::string> validate_corpus(const PrepareConfig& cfg, const Corpus& c) {
  const Text& t = c.main;
  validate_text("--input", t);
  if (cfg.valid.given()) validate_text("--valid", c.valid_file);
  if (cfg.test.given()) validate_text("--test", c.test_file);
  const size_t n = t.sequences.size();
  const std::string usable = std::string(t.seq2seq() ? "have " : "has ") + std::to_string(n) +
                             " usable " + t.units(n) + "; at least " + std::to_string(kHoldOut) +
                             " are needed to hold one out for ";
  // train --data refuses a set without a validation shard, so one is needed.
  if (!cfg.valid.given() && c.valid_carved == 0) {
    usage_error("--input", t.name() + " " + usable + "validation");
  }
  if (!cfg.test.given() && cfg.test_lines > 0 && c.test_carved == 0) {
    usage_error("--test-lines", t.name() + " " + usable + "a test split");
  }
  if (cfg.tokenizer.empty() && too_long_to_train(c.train()) == c.train_count()) {
    const bool all = too_long_to_train({&t, 0, n}) == n;
    usage_error("--input", t.name() + ": every " + (all ? "" : "training ") +
                               "line is longer than the " + std::to_string(kLongestTrainedLine) +
                               " bytes a tokenizer trains on; put one sentence (or paragraph) "
                               "per line");
  }
  if (static_cast<size_t>(cfg.shards) > c.train_count()) {
    usage_error("--shards", std::to_string(cfg.shards) + " shards but only " +
                                std::to_string(c.train_count()) +
                                " training sequences; each shard needs at least one");
  }
  // The default --valid-lines is capped on every small corpus: only a
  // number the user chose is worth a word.
  std::vector<std::string> warnings;
  const auto capped = [&](const char* flag, int wanted, size_t got) {
    warnings.push_back("warning: " + std::string(flag) + " " + std::to_string(wanted) +
                       ": holding out " + std::to_string(got) + " " + t.units(got) +
                       ", a tenth of the " + std::to_string(n) + " usable " + t.units(n) + " of " +
                       t.name());
  };
  if (cfg.valid_lines_given && c.valid_carved < static_cast<size_t>(cfg.valid_lines)) {
    capped("--valid-lines", cfg.valid_lines, c.valid_carved);
  }
  if (c.test_carved > 0 && c.test_carved < static_cast<size_t>(cfg.test_lines)) {
    capped("--test-lines", cfg.test_lines, c.test_carved);
  }
  return warnings;
}

void require_training_labels(const PrepareConfig& cfg, const LabelVocabulary& vocabulary) {
  if (vocabulary.names().empty())
    usage_error("--labels", cfg.labels + ": the training lines have no label at all");
}

}  // namespace mpiformer::prepare
