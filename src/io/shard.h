// HDF5 token shards (data/FORMAT.md is the specification). A shard set is
// self-contained: every shard carries the vocabulary's special ids and the
// SentencePiece model bytes. Readers validate everything before training and
// report faults as one line naming the file.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "src/core/config.h"

namespace mpiformer {

constexpr int kShardVersion = 1;
// The root attribute `format` of a shard.
constexpr const char* kShardFormat = "mpiformer-shard";

// A fault in a shard file: what() is "FILE: what is wrong".
class ShardError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct ShardHeader {
  std::string kind = "lm";  // "lm" | "seq2seq" | "classify" | "image"
  int version = kShardVersion;
  int vocab_size = 0;
  SpecialTokens special;  // stored as the attributes pad_id, bos_id, ... sep_id
  std::string tokenizer;  // SentencePiece model bytes
  // Where the sequences came from, for people (optional; not compared
  // across a set): "train", "valid" or "test", and e.g. "kjv.txt lines 1-900".
  std::string split, origin;
  // classify and image: the label vocabulary (label i is label_names[i]).
  std::vector<std::string> label_names;
  // image: every image is height x width x channels uint8 values.
  int image_height = 0, image_width = 0, image_channels = 0;

  bool has_labels() const { return kind == "classify" || kind == "image"; }
  size_t image_bytes() const {
    return static_cast<size_t>(image_height) * image_width * image_channels;
  }
};

// The labels of each example (classify, image): example i has labels
// ids[offsets[i], offsets[i+1]), each with a target weight in [0, 1] (1: a
// hard label; less: a soft one).
struct ShardLabels {
  std::vector<int32_t> ids;
  std::vector<float> weights;
  std::vector<uint64_t> offsets{0};  // (n+1)
  size_t count() const { return offsets.size() - 1; }
  void append(const int32_t* label_ids, const float* label_weights, size_t n);
};

// Sequences of one side: sequence i is tokens[offsets[i], offsets[i+1]).
struct TokenSequences {
  std::vector<int32_t> tokens;
  std::vector<uint64_t> offsets{0};  // (n+1)
  size_t count() const { return offsets.size() - 1; }
  size_t length(size_t i) const { return offsets[i + 1] - offsets[i]; }
  void append(const int32_t* ids, size_t n);
};

struct Shard {
  ShardHeader header;
  TokenSequences source;        // seq2seq: /src; unused for lm
  TokenSequences target;        // lm, classify: /tokens; seq2seq: /tgt; unused for image
  ShardLabels labels;           // classify, image
  std::vector<uint8_t> images;  // image: (n, height, width, channels)

  // Examples held: sequences, pairs or images.
  size_t count() const { return header.kind == "image" ? labels.count() : target.count(); }
};

// Writes `shard` to `path` exactly (callers choose temporary names and
// rename). Tokens are stored as uint16 when vocab_size <= 65536, else int32;
// datasets chunked and Fletcher32-checksummed. Throws ShardError.
void write_shard(const std::string& path, const Shard& shard);

// Reads and validates a whole shard: format attribute, version, kind, offsets
// monotone and matching the token count, token ids below vocab_size,
// non-empty, checksums. Throws ShardError naming the file and the fault.
Shard read_shard(const std::string& path);

// Reads only the header (attributes and tokenizer); cheap. Throws ShardError.
ShardHeader read_shard_header(const std::string& path);

// Shard files of a directory set: DIR/<prefix>-NNNNN.h5 sorted by name.
std::vector<std::string> list_shards(const std::string& dir, const std::string& prefix);

}  // namespace mpiformer
