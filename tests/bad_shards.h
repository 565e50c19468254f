// Test shards, valid and broken on purpose: shared by shard_test and the
// make_bad_shard program that the end-to-end tests call. Faults are made by
// writing a valid shard and then editing it with the HDF5 C API, so each file
// carries exactly one fault.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "src/io/shard.h"

namespace mpiformer::test_shards {

enum class Fault {
  kValid,
  kMissingFormat,       // no 'format' attribute
  kBadVersion,          // version 7
  kTruncated,           // first half of a valid file's bytes
  kNotHdf5,             // a text file
  kOffsetsNotMonotone,  // offsets[3] raised above offsets[4]
  kOffsetsMismatch,     // offsets end 4 past the token count
  kTokenOutOfRange,     // one token id == vocab_size
  kEmpty,               // 0 sequences
  kOtherVocab,          // valid, vocab_size differs from the default
  kOtherTokenizer,      // valid, different tokenizer bytes
  kBadKind,             // kind 'xyz'
  kBadChecksum,         // a flipped byte inside the /tokens chunk
  kCountMismatch,       // seq2seq: /tgt holds one sequence fewer than /src
  kSumBlindChange,  // three ids of /tokens' chunk changed by +1, -2, +1: Fletcher32 is blind to it
};

// Every fault's command-line name ("valid", "missing-format", ...).
struct FaultName {
  Fault fault;
  const char* name;
};
const std::vector<FaultName>& fault_names();
// Throws std::invalid_argument for an unknown name.
Fault parse_fault(const std::string& name);

constexpr int kVocab = 64;
constexpr int kOtherVocab = 80;
constexpr const char* kTokenizer = "tokenizer-A";
constexpr const char* kOtherTokenizer = "tokenizer-B";

// A valid shard: `count` sequences of lengths 1..24 cycling, ids in
// [6, vocab_size) from a fixed pattern. seq2seq targets are the reversed
// sources.
Shard sample_shard(const std::string& kind, int vocab_size = kVocab, int count = 40,
                   const std::string& tokenizer = kTokenizer);

// Writes a shard of `kind` ("lm" | "seq2seq") to `path` with `fault`.
// kCountMismatch needs kind seq2seq. Throws std::runtime_error.
void write_bad_shard(const std::string& path, const std::string& kind, Fault fault);

// Direct HDF5 edits of an existing file (root attributes, 1-D datasets).
void set_int_attr(const std::string& path, const std::string& name, int value);
void set_string_attr(const std::string& path, const std::string& name, const std::string& value);
void delete_attr(const std::string& path, const std::string& name);
// Overwrites element `index` of a 1-D integer dataset (checksums stay valid).
void set_element(const std::string& path, const std::string& dataset, uint64_t index,
                 int64_t value);
// Replaces a dataset by a plain (contiguous, unfiltered) uint64 one.
void replace_u64_dataset(const std::string& path, const std::string& dataset,
                         const std::vector<uint64_t>& values);
// Keeps the first `keep` bytes of a file.
void truncate_file(const std::string& path, uint64_t keep);
// Flips one byte inside the first stored chunk of `dataset`.
void corrupt_first_chunk(const std::string& path, const std::string& dataset);

}  // namespace mpiformer::test_shards
