// Training prepare's SentencePiece model, on rank 0: on the training lines
// alone, so the held-out splits stay unseen (one vocabulary for both sides
// of a pair), with a copy of those lines beside the shards when held-out
// lines were carved from the input, and a heartbeat line while it trains.
#pragma once

#include <filesystem>
#include <string>

#include "src/app/prepare/corpus.h"
#include "src/app/prepare/progress.h"
#include "src/core/config.h"

namespace mpiformer::prepare {

// Rank 0: trains the tokenizer cfg asks for on the training lines of
// `corpus` and puts its bytes in *model_bytes. Returns "" or the failure's
// message, naming the user's files (the other ranks wait for the verdict).
std::string train_tokenizer(const PrepareConfig& cfg, const Corpus& corpus,
                            const std::filesystem::path& out_dir, const Say& say,
                            std::string* model_bytes);

// More pieces than the text can fill, or fewer than its characters, is a
// bad --vocab-size (exit 2); SentencePiece's message says which.
bool is_bad_vocab_size(const std::string& failure);

}  // namespace mpiformer::prepare
