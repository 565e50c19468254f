#include "src/data/tokenizer.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <charconv>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "src/core/config.h"

namespace mpiformer {
namespace {

bool is_blank(const std::string& line) {
  return line.find_first_not_of(" \t\r\v\f") == std::string::npos;
}

// Feeds the trainer the non-blank lines of several files in turn, so no
// file list has to survive SentencePiece's comma-separated --input flag.
class FileLines : public sentencepiece::SentenceIterator {
 public:
  // Counts the lines longer than `max_length` bytes, which SentencePiece skips.
  FileLines(const std::vector<std::string>& paths, size_t max_length)
      : paths_(paths), max_length_(max_length) {
    advance();
  }

  bool done() const override { return done_; }
  void Next() override { advance(); }
  const std::string& value() const override { return line_; }
  sentencepiece::util::Status status() const override { return status_; }
  size_t lines() const { return lines_; }
  size_t too_long() const { return too_long_; }

 private:
  void advance() {
    while (!done_) {
      if (!in_.is_open()) {
        if (next_path_ == paths_.size()) {
          done_ = true;
          return;
        }
        const std::string& path = paths_[next_path_++];
        in_.open(path, std::ios::binary);
        if (!in_) {
          status_ = sentencepiece::util::Status(sentencepiece::util::StatusCode::kNotFound,
                                                path + ": cannot read");
          done_ = true;
          return;
        }
      }
      if (std::getline(in_, line_)) {
        if (!line_.empty() && line_.back() == '\r') line_.pop_back();
        if (!is_blank(line_)) {
          ++lines_;
          if (line_.size() > max_length_) ++too_long_;
          return;
        }
      } else {
        if (in_.bad()) {
          status_ = sentencepiece::util::Status(sentencepiece::util::StatusCode::kDataLoss,
                                                paths_[next_path_ - 1] + ": read error");
          done_ = true;
          return;
        }
        in_.close();
        in_.clear();
      }
    }
  }

  std::vector<std::string> paths_;
  size_t max_length_;
  size_t lines_ = 0, too_long_ = 0;
  size_t next_path_ = 0;
  std::ifstream in_;
  std::string line_;
  bool done_ = false;
  sentencepiece::util::Status status_;
};

// SentencePiece's messages start with the failed check ("./src/x.cc(660)
// [(a) == (b)] Vocabulary size too high..."); users need only what follows.
std::string readable(const sentencepiece::util::Status& status) {
  const std::string message = status.message();
  if (message.rfind("./", 0) != 0 && message.rfind("src/", 0) != 0) return message;
  const size_t end_of_check = message.find("] ");
  return end_of_check == std::string::npos ? message : message.substr(end_of_check + 2);
}

std::string number_text(double x) {
  char buf[64];
  const auto result = std::to_chars(buf, buf + sizeof(buf), x);
  return std::string(buf, result.ptr);
}

std::string join(const std::vector<std::string>& names, const char* separator) {
  std::string s;
  for (const std::string& n : names) s += (s.empty() ? "" : separator) + n;
  return s;
}

}  // namespace

struct Tokenizer::Impl {
  sentencepiece::SentencePieceProcessor processor;
};

Tokenizer::~Tokenizer() = default;

std::string Tokenizer::train(const std::vector<std::string>& inputs,
                             const TokenizerTrainOptions& options) {
  if (inputs.empty()) throw std::runtime_error("tokenizer training needs at least one input file");
  const std::string where = join(inputs, ", ");
  if (options.model_type != "unigram" && options.model_type != "bpe") {
    throw std::runtime_error(where + ": unknown tokenizer model type '" + options.model_type +
                             "' (expected unigram or bpe)");
  }
  const SpecialTokens special;
  // The special ids are a contract of the shard format (SpecialTokens); the
  // vocabulary is exactly vocab_size (hard_vocab_limit stays on) so the
  // model's embedding table and the shards agree. No model_prefix: the model
  // comes back in memory and nothing is written to disk. (The map form, unlike
  // the flag string, does not log the command line before it reads
  // minloglevel.)
  const std::unordered_map<std::string, std::string> flags = {
      {"model_type", options.model_type},
      {"vocab_size", std::to_string(options.vocab_size)},
      {"hard_vocab_limit", "true"},
      {"character_coverage", number_text(options.character_coverage)},
      {"input_sentence_size", std::to_string(options.max_sentences)},
      {"max_sentence_length", std::to_string(options.max_sentence_length)},
      {"shuffle_input_sentence", "true"},
      {"pad_id", std::to_string(special.pad)},
      {"bos_id", std::to_string(special.bos)},
      {"eos_id", std::to_string(special.eos)},
      {"unk_id", std::to_string(special.unk)},
      {"user_defined_symbols", "[MASK],[SEP]"},
      {"minloglevel", "2"},
  };
  // 2^32-1 is SentencePiece's "seed from std::random_device"; fold it away.
  sentencepiece::SetRandomGeneratorSeed(
      static_cast<unsigned>(options.seed % std::numeric_limits<unsigned>::max()));

  FileLines lines(inputs, static_cast<size_t>(options.max_sentence_length));
  std::string model_bytes;
  const auto status = sentencepiece::SentencePieceTrainer::Train(flags, &lines, &model_bytes);
  if (!lines.status().ok()) throw std::runtime_error(lines.status().message());
  if (!status.ok()) {
    // SentencePiece skips the longer lines unsaid, then fails without a
    // reason when nothing is left.
    std::string reason = readable(status);
    if (lines.lines() > 0 && lines.too_long() == lines.lines()) {
      reason = "every line is longer than the " + std::to_string(options.max_sentence_length) +
               " bytes it reads (max_sentence_length)";
    } else if (reason.empty()) {
      reason = "SentencePiece gave no reason";
    }
    throw std::runtime_error(where + ": cannot train a tokenizer: " + reason);
  }
  return model_bytes;
}

std::unique_ptr<Tokenizer> Tokenizer::from_bytes(const std::string& model_bytes) {
  std::unique_ptr<Tokenizer> t(new Tokenizer());
  t->impl_ = std::make_unique<Impl>();
  const auto status = t->impl_->processor.LoadFromSerializedProto(model_bytes);
  if (!status.ok()) {
    const std::string reason = readable(status);
    throw std::runtime_error("not a SentencePiece model" +
                             (reason.empty() ? "" : " (" + reason + ")"));
  }
  t->bytes_ = model_bytes;
  return t;
}

std::unique_ptr<Tokenizer> Tokenizer::from_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot read");
  std::ostringstream bytes;
  bytes << in.rdbuf();
  if (in.bad()) throw std::runtime_error(path + ": read error");
  try {
    return from_bytes(bytes.str());
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(path + ": " + e.what());
  }
}

std::vector<int> Tokenizer::encode(const std::string& text) const {
  std::vector<int> ids;
  const auto status = impl_->processor.Encode(text, &ids);
  if (!status.ok()) throw std::runtime_error("cannot encode: " + readable(status));
  return ids;
}

std::string Tokenizer::decode(const std::vector<int>& ids) const {
  const int n = vocab_size();
  for (int id : ids) {
    // SentencePiece would abort the process on an id outside the vocabulary.
    if (id < 0 || id >= n) {
      throw std::runtime_error("cannot decode id " + std::to_string(id) + ": vocabulary has " +
                               std::to_string(n) + " ids");
    }
  }
  std::string text;
  const auto status = impl_->processor.Decode(ids, &text);
  if (!status.ok()) throw std::runtime_error("cannot decode: " + readable(status));
  return text;
}

int Tokenizer::vocab_size() const {
  return impl_->processor.GetPieceSize();
}

std::string Tokenizer::id_to_piece(int id) const {
  if (id < 0 || id >= vocab_size()) return "";
  return impl_->processor.IdToPiece(id);
}

std::string Tokenizer::special_ids_mismatch() const {
  const SpecialTokens special;
  const auto& p = impl_->processor;
  std::string faults;
  const auto expect = [&](const char* name, int actual, int wanted) {
    if (actual == wanted) return;
    faults += std::string(faults.empty() ? "" : ", ") + name + " is " + std::to_string(actual) +
              ", expected " + std::to_string(wanted);
  };
  expect("pad id", p.pad_id(), special.pad);
  expect("bos id", p.bos_id(), special.bos);
  expect("eos id", p.eos_id(), special.eos);
  expect("unk id", p.unk_id(), special.unk);
  expect("id of [MASK]", p.PieceToId("[MASK]"), special.mask);
  expect("id of [SEP]", p.PieceToId("[SEP]"), special.sep);
  return faults;
}

}  // namespace mpiformer
