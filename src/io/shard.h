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

// A fault in a shard file: what() is "FILE: what is wrong".
class ShardError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct ShardHeader {
  std::string kind = "lm";  // "lm" | "seq2seq"
  int version = kShardVersion;
  int vocab_size = 0;
  SpecialTokens special;  // stored as the attributes pad_id, bos_id, ... sep_id
  std::string tokenizer;  // SentencePiece model bytes
  // Where the sequences came from, for people (optional; not compared
  // across a set): "train", "valid" or "test", and e.g. "kjv.txt lines 1-900".
  std::string split, origin;
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
  TokenSequences source;  // seq2seq: /src; unused for lm
  TokenSequences target;  // lm: /tokens; seq2seq: /tgt
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
