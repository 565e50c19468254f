// SentencePiece glue. Special ids are fixed for every model kind (see
// SpecialTokens): pad 0, bos 1, eos 2, unk 3, [MASK] 4, [SEP] 5.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace mpiformer {

// The longest line, in bytes, SentencePiece trains on by default; longer
// ones are skipped by training (and still encoded).
constexpr int kTrainedLineLimit = 4192;

struct TokenizerTrainOptions {
  int vocab_size = 8000;
  std::string model_type = "unigram";  // unigram | bpe
  // Share of characters that get pieces of their own; the rest become unk.
  // 1.0 suits alphabetic scripts (SentencePiece advises 0.9995 only for
  // large character sets such as CJK).
  double character_coverage = 1.0;
  int max_sentences = 2000000;  // input sentences sampled for training
  // Longest line, in bytes, that training reads; longer ones are skipped.
  int max_sentence_length = kTrainedLineLimit;
  uint64_t seed = 1;
};

class Tokenizer {
 public:
  ~Tokenizer();
  // Trains on the lines of `inputs` (all files together); returns the model bytes.
  static std::string train(const std::vector<std::string>& inputs,
                           const TokenizerTrainOptions& options);
  // Loads model bytes (a .model file's contents). Throws std::runtime_error.
  static std::unique_ptr<Tokenizer> from_bytes(const std::string& model_bytes);
  static std::unique_ptr<Tokenizer> from_file(const std::string& path);

  std::vector<int> encode(const std::string& text) const;
  std::string decode(const std::vector<int>& ids) const;
  int vocab_size() const;
  // The piece of `id` ("[MASK]", "\u2581the"); "" outside the vocabulary.
  std::string id_to_piece(int id) const;
  // Why this model breaks the fixed special ids ("pad id is -1, expected 0");
  // "" when it keeps them. Models from train() always keep them.
  std::string special_ids_mismatch() const;
  const std::string& model_bytes() const { return bytes_; }

 private:
  Tokenizer() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string bytes_;
};

}  // namespace mpiformer
