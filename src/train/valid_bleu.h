// --valid-bleu: a seq2seq run's evaluations also translate the validation
// split greedily with the current weights and score the translations with
// BLEU as sacreBLEU computes it (src/scoring/bleu.h). Rank r of W translates
// the sentences i with i % W == r; the n-gram counts are integers summed
// over ranks, so the score does not depend on W. A sentence decodes to the
// same tokens alone or among others (src/model/decoding.h), so the score is
// that of `mpiformer generate --split valid` on a checkpoint of the step.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "src/core/config.h"
#include "src/data/tokenizer.h"
#include "src/model/decoding.h"
#include "src/model/model.h"
#include "src/parallel/communicator.h"
#include "src/scoring/bleu.h"

namespace mpiformer {

class ValidationBleu {
 public:
  // Every rank: reads its share of --data's validation split. tokenizer:
  // the shards' SentencePiece model bytes. Throws std::runtime_error.
  ValidationBleu(const TrainConfig& cfg, const std::string& tokenizer, const Communicator& comm);
  ~ValidationBleu();

  // This rank's n-gram counts of greedy translations by `trained`'s
  // weights (no collective: a fault here is agreed before score()). The
  // first call builds the decoding model beside it (the same dimensions,
  // fp32, its own key/value cache); later calls copy the weights into it.
  BleuCounts translate(Model& trained, Ops& ops);
  // Collective: the BLEU (0..100) of every rank's counts.
  static double score(const BleuCounts& local, const Communicator& comm);
  size_t sentences() const { return total_; }  // of the split, all ranks

 private:
  TrainConfig cfg_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::vector<std::vector<int32_t>> sources_;  // this rank's, each cut to fit --max-len
  std::vector<std::string> references_;        // their detokenised targets
  size_t total_ = 0;
  DecodePlan plan_;
  std::unique_ptr<Model> decoder_;
  std::vector<float> staging_;  // (parameters) host copy of the weights
};

}  // namespace mpiformer
