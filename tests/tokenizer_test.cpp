// SentencePiece glue: the fixed special ids, an exact vocabulary size, the
// encode/decode round trip, reloading from bytes, and errors naming the file.
#include "src/data/tokenizer.h"

#include <gtest/gtest.h>
#include <sentencepiece_trainer.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace mpiformer {
namespace {

namespace fs = std::filesystem;

// A directory of its own per test process, removed at the end.
class TempDir {
 public:
  TempDir()
      : path_(fs::temp_directory_path() /
              ("mpiformer_tokenizer_test_" + std::to_string(::getpid()))) {
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string file(const std::string& name, const std::string& text) const {
    const fs::path p = path_ / name;
    std::ofstream(p, std::ios::binary) << text;
    return p.string();
  }
  std::string path(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

// English-ish sentences from a fixed word list: varied enough for a real
// vocabulary, deterministic, plain ASCII so decoding returns them exactly.
std::vector<std::string> generated_lines(int count) {
  static const char* kWords[] = {
      "the",      "a",       "river",   "stone",    "quietly",  "under",   "bright",  "moon",
      "walked",   "towards", "village", "children", "singing",  "morning", "bread",   "warm",
      "old",      "house",   "door",    "opened",   "slowly",   "and",     "then",    "nothing",
      "happened", "again",   "winter",  "came",     "early",    "this",    "year",    "with",
      "snow",     "falling", "over",    "fields",   "farmer",   "counted", "sheep",   "before",
      "dark",     "night",   "lantern", "burning",  "window",   "letters", "arrived", "from",
      "distant",  "cities",  "nobody",  "answered", "question", "why",     "because", "tomorrow",
      "market",   "sells",   "apples",  "honey",    "cheese",   "seven",   "twelve",  "hundred"};
  constexpr int kWordCount = sizeof(kWords) / sizeof(kWords[0]);
  std::mt19937 rng(12345);
  std::uniform_int_distribution<int> word(0, kWordCount - 1), length(4, 14);
  std::vector<std::string> lines;
  for (int i = 0; i < count; ++i) {
    std::string line;
    const int n = length(rng);
    for (int w = 0; w < n; ++w) line += (w ? " " : "") + std::string(kWords[word(rng)]);
    lines.push_back(line + (i % 3 == 0 ? "." : ""));
  }
  return lines;
}

std::string joined(const std::vector<std::string>& lines) {
  std::string text;
  for (const auto& l : lines) text += l + "\n";
  return text;
}

TokenizerTrainOptions small_options(const std::string& model_type = "unigram") {
  TokenizerTrainOptions o;
  o.vocab_size = 80;
  o.model_type = model_type;
  o.seed = 7;
  return o;
}

class TokenizerTest : public ::testing::TestWithParam<std::string> {
 protected:
  TempDir dir_;
  std::vector<std::string> lines_ = generated_lines(300);
  std::string corpus_ = dir_.file("corpus.txt", joined(lines_));
};

TEST_P(TokenizerTest, SpecialIdsAreFixedAndVocabularyIsExact) {
  const std::string bytes = Tokenizer::train({corpus_}, small_options(GetParam()));
  const auto tok = Tokenizer::from_bytes(bytes);
  EXPECT_EQ(tok->vocab_size(), 80);
  EXPECT_EQ(tok->id_to_piece(0), "<pad>");
  EXPECT_EQ(tok->id_to_piece(1), "<s>");
  EXPECT_EQ(tok->id_to_piece(2), "</s>");
  EXPECT_EQ(tok->id_to_piece(3), "<unk>");
  EXPECT_EQ(tok->id_to_piece(4), "[MASK]");
  EXPECT_EQ(tok->id_to_piece(5), "[SEP]");
  EXPECT_EQ(tok->id_to_piece(80), "");
  EXPECT_EQ(tok->special_ids_mismatch(), "");
  EXPECT_EQ(tok->decode({4}), "[MASK]");
}

TEST_P(TokenizerTest, EncodeDecodeRoundTripsWithoutBosOrEos) {
  const auto tok = Tokenizer::from_bytes(Tokenizer::train({corpus_}, small_options(GetParam())));
  for (const std::string& line : lines_) {
    const std::vector<int> ids = tok->encode(line);
    ASSERT_FALSE(ids.empty());
    for (int id : ids) {
      // Data symbols only: no pad, bos, eos, unk or reserved symbol.
      EXPECT_GE(id, 6) << line;
      EXPECT_LT(id, 80) << line;
    }
    EXPECT_EQ(tok->decode(ids), line);
  }
}

TEST_P(TokenizerTest, ReloadingTheBytesGivesIdenticalEncodings) {
  const auto tok = Tokenizer::from_bytes(Tokenizer::train({corpus_}, small_options(GetParam())));
  const auto again = Tokenizer::from_bytes(tok->model_bytes());
  const std::string model_file = dir_.path("t.model");
  std::ofstream(model_file, std::ios::binary) << tok->model_bytes();
  const auto from_file = Tokenizer::from_file(model_file);
  EXPECT_EQ(from_file->model_bytes(), tok->model_bytes());
  for (const std::string& line : lines_) {
    EXPECT_EQ(again->encode(line), tok->encode(line));
    EXPECT_EQ(from_file->encode(line), tok->encode(line));
  }
}

TEST_P(TokenizerTest, SameSeedSameModel) {
  EXPECT_EQ(Tokenizer::train({corpus_}, small_options(GetParam())),
            Tokenizer::train({corpus_}, small_options(GetParam())));
}

INSTANTIATE_TEST_SUITE_P(ModelTypes, TokenizerTest, ::testing::Values("unigram", "bpe"));

TEST(Tokenizer, TrainsOnSeveralFilesAndSkipsBlankLines) {
  TempDir dir;
  const auto lines = generated_lines(300);
  const std::vector<std::string> first(lines.begin(), lines.begin() + 150);
  const std::vector<std::string> second(lines.begin() + 150, lines.end());
  const std::string a = dir.file("a.txt", "\n  \n" + joined(first) + "\r\n\n");
  const std::string b = dir.file("b.txt", joined(second));
  const auto tok = Tokenizer::from_bytes(Tokenizer::train({a, b}, small_options()));
  EXPECT_EQ(tok->vocab_size(), 80);
  EXPECT_EQ(tok->decode(tok->encode(lines.back())), lines.back());
}

// The message of the std::runtime_error `fn` throws ("" if none).
template <class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

TEST(Tokenizer, ErrorsNameTheFile) {
  TempDir dir;
  const std::string missing = dir.path("missing.txt");
  std::string what = error_of([&] { Tokenizer::train({missing}, small_options()); });
  EXPECT_NE(what.find(missing), std::string::npos) << what;

  // More pieces than the text can supply: the vocabulary must be exact.
  const std::string tiny = dir.file("tiny.txt", "ab ba\nab ab\n");
  TokenizerTrainOptions big = small_options();
  big.vocab_size = 5000;
  what = error_of([&] { Tokenizer::train({tiny}, big); });
  EXPECT_NE(what.find(tiny), std::string::npos) << what;
  EXPECT_NE(what.find("Vocabulary size too high (5000)"), std::string::npos) << what;
  EXPECT_EQ(what.find("trainer_interface"), std::string::npos)
      << "source location leaked: " << what;

  const std::string garbage = dir.file("garbage.model", "this is not a model");
  what = error_of([&] { Tokenizer::from_file(garbage); });
  EXPECT_EQ(what.rfind(garbage + ": not a SentencePiece model", 0), 0u) << what;

  what = error_of([&] { Tokenizer::from_file(missing); });
  EXPECT_EQ(what, missing + ": cannot read");

  TokenizerTrainOptions bad_type = small_options();
  bad_type.model_type = "word-salad";
  what = error_of([&] { Tokenizer::train({tiny}, bad_type); });
  EXPECT_NE(what.find("word-salad"), std::string::npos) << what;
}

TEST(Tokenizer, DecodeRefusesIdsOutsideTheVocabulary) {
  TempDir dir;
  const std::string corpus = dir.file("c.txt", joined(generated_lines(300)));
  const auto tok = Tokenizer::from_bytes(Tokenizer::train({corpus}, small_options()));
  EXPECT_THROW(tok->decode({7, 80}), std::runtime_error);
  EXPECT_THROW(tok->decode({-1}), std::runtime_error);
}

TEST(Tokenizer, ForeignModelsAreReportedAsBreakingTheSpecialIds) {
  // SentencePiece's own defaults: unk 0, bos 1, eos 2, no pad, no [MASK].
  TempDir dir;
  const std::string corpus = dir.file("c.txt", joined(generated_lines(300)));
  std::string bytes;
  const auto status = sentencepiece::SentencePieceTrainer::Train(
      "--input=" + corpus + " --vocab_size=60 --minloglevel=2", nullptr, &bytes);
  ASSERT_TRUE(status.ok()) << status.message();
  const std::string mismatch = Tokenizer::from_bytes(bytes)->special_ids_mismatch();
  EXPECT_NE(mismatch.find("pad id is -1, expected 0"), std::string::npos) << mismatch;
  EXPECT_NE(mismatch.find("[MASK]"), std::string::npos) << mismatch;
}

}  // namespace
}  // namespace mpiformer
