// The check of a model against a shard set. The shards fix the kind, the
// vocabulary, the special ids, the labels and the image shape; the model is
// the start-up's, already reconciled with them (src/train/shard_config.h).
// Nothing here writes a ModelConfig: a model that disagrees with its shards
// is refused, naming the flag.
#pragma once

#include <string>

#include "src/core/config.h"
#include "src/io/shard.h"

namespace mpiformer {

// Every shard of a set must read like the first train shard: a model trained
// on one and evaluated on another would otherwise see a different language.
// Throws ShardError naming `file`.
void check_same_set(const ShardHeader& header, const std::string& file, const ShardHeader& first,
                    const std::string& first_file);

// The kind `model` reads ("lm", "seq2seq", "classify" or "image") against
// the shards' kind: UsageError naming --model (or --patch, which image
// shards need), e.g. "--model: seq2seq reads seq2seq shards; the shards in
// DIR are lm".
void check_shard_kind(const ShardHeader& header, const std::string& dir, const ModelConfig& model);

// The whole model against the shards in `dir`: the kind, then each field the
// shards fix, then what the two make together (softmax's two labels, the
// patch dividing the image, --max-len holding an image's rows). Throws
// UsageError naming the flag, e.g. "--vocab: the shards in DIR have
// vocabulary 8000; got 500".
void check_model_against_shards(const ShardHeader& header, const std::string& dir,
                                const ModelConfig& model);

}  // namespace mpiformer
