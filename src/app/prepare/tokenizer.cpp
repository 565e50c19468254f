// prepare's tokenizer training on rank 0 (tokenizer.h): the training lines
// written out for SentencePiece when held-out lines were cut from the input
// (it reads files), the training itself under a heartbeat, and its faults
// told in the user's file names.
#include "src/app/prepare/tokenizer.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <vector>

#include "src/app/prepare/output.h"
#include "src/data/tokenizer.h"
#include "src/io/atomic_file.h"
#include "src/io/stop_cleanup.h"

namespace mpiformer::prepare {
namespace {

namespace fs = std::filesystem;

// The training lines alone, for SentencePiece, when held-out lines were cut
// from the input (it reads files): written beside the shards under
// temporary names and removed once the tokenizer is trained or has failed.
class TrainingText {
 public:
  // Writing the copy failed: the message names the copy, not the input.
  struct WriteError : std::runtime_error {
    using std::runtime_error::runtime_error;
  };

  TrainingText(const fs::path& dir, const Span& train) {
    const Text& t = *train.text;
    try {
      add(dir / kTokenizerInputFile, t.input_path, t.input, train);
      if (t.seq2seq()) add(dir / kTokenizerTargetFile, t.target_path, t.target, train);
    } catch (...) {
      remove_all();
      throw;
    }
  }
  ~TrainingText() { remove_all(); }
  TrainingText(const TrainingText&) = delete;
  TrainingText& operator=(const TrainingText&) = delete;

  std::vector<std::string> paths() const {
    std::vector<std::string> paths;
    for (const File& f : files_) paths.push_back(f.temporary);
    return paths;
  }

  // A message about the temporary files, naming the user's instead.
  std::string as_given(std::string message) const {
    for (const File& f : files_) {
      for (size_t at; (at = message.find(f.temporary)) != std::string::npos;) {
        message.replace(at, f.temporary.size(), f.given);
      }
    }
    return message;
  }

 private:
  struct File {
    std::string temporary, given;
    RemovedOnStop on_stop;  // a stop signal during the training removes it too
  };

  void add(fs::path path, const std::string& given, const std::vector<std::string>& lines,
           const Span& train) {
    path = temporary_name(path.string());
    files_.push_back({path.string(), given, RemovedOnStop(path.string())});
    errno = 0;
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    for (size_t s = train.begin; s < train.end && out; ++s) {
      out << lines[train.text->sequences[s]] << '\n';
    }
    out.close();
    if (!out) {
      throw WriteError(path.string() + ": cannot write" +
                       (errno != 0 ? " (" + std::string(std::strerror(errno)) + ")" : ""));
    }
  }

  void remove_all() {
    for (const File& f : files_) {
      std::error_code ec;
      fs::remove(f.temporary, ec);
    }
  }

  std::vector<File> files_;
};

}  // namespace

std::string train_tokenizer(const PrepareConfig& cfg, const Corpus& corpus, const fs::path& out_dir,
                            const Say& say, std::string* model_bytes) {
  const Span train = corpus.train();
  say("training a " + cfg.model_type + " tokenizer of " + std::to_string(cfg.vocab_size) +
      " pieces on the " + grouped(static_cast<int64_t>(train.size())) + " training " +
      corpus.main.units(train.size()) + " of " + corpus.main.name() + " ...");
  if (const size_t too_long = too_long_to_train(train); too_long > 0) {
    say("  " + std::to_string(too_long) + " line(s) longer than " +
        std::to_string(kLongestTrainedLine) +
        " bytes are left out of the tokenizer's training (they are still encoded)");
  }
  TokenizerTrainOptions options;
  options.vocab_size = cfg.vocab_size;
  options.model_type = cfg.model_type;
  options.seed = cfg.seed;
  std::unique_ptr<TrainingText> text;
  try {
    std::vector<std::string> files{cfg.input};
    if (cfg.kind == "seq2seq") files.push_back(cfg.target);
    if (corpus.carved()) {
      text = std::make_unique<TrainingText>(out_dir, train);
      files = text->paths();
    }
    const Heartbeat heartbeat(
        [&](double seconds) { say("  training the tokenizer (" + format_seconds(seconds) + ")"); });
    *model_bytes = Tokenizer::train(files, options);
  } catch (const TrainingText::WriteError& e) {
    return e.what();
  } catch (const std::exception& e) {
    return text ? text->as_given(e.what()) : e.what();
  }
  return "";
}

bool is_bad_vocab_size(const std::string& failure) {
  return failure.find("Vocabulary size") != std::string::npos;
}

}  // namespace mpiformer::prepare
