// HDF5 shards: round trips, the on-disk layout of data/FORMAT.md, directory
// listing, and one ShardError per fault, each naming the file first.
#include "src/io/shard.h"

#include <gtest/gtest.h>
#include <hdf5.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/bad_shards.h"

namespace mpiformer {
namespace {

namespace fs = std::filesystem;
namespace ts = test_shards;

// A fresh directory per test, removed afterwards.
class ShardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = std::string(info->test_suite_name()) + "_" + info->name();
    for (char& c : name) {
      if (c == '/') c = '_';
    }
    // The pid keeps concurrent runs (several build trees, ctest -j) apart.
    dir_ = fs::temp_directory_path() /
           ("mpiformer_shard_test_" + std::to_string(::getpid()) + "_" + name);
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string file(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

void expect_same(const TokenSequences& a, const TokenSequences& b) {
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.offsets, b.offsets);
}

// Size in bytes of the stored element type of `dataset`.
size_t stored_size(const std::string& path, const std::string& dataset) {
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t d = H5Dopen2(f, dataset.c_str(), H5P_DEFAULT);
  hid_t t = H5Dget_type(d);
  const size_t size = H5Tget_size(t);
  H5Tclose(t);
  H5Dclose(d);
  H5Fclose(f);
  return size;
}

// True when `dataset` is chunked and carries the Fletcher32 filter.
bool chunked_with_fletcher32(const std::string& path, const std::string& dataset) {
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t d = H5Dopen2(f, dataset.c_str(), H5P_DEFAULT);
  hid_t plist = H5Dget_create_plist(d);
  bool fletcher = false;
  const int n = H5Pget_nfilters(plist);
  for (int i = 0; i < n; ++i) {
    unsigned flags = 0;
    size_t nelmts = 0;
    unsigned config = 0;
    if (H5Pget_filter2(plist, i, &flags, &nelmts, nullptr, 0, nullptr, &config) ==
        H5Z_FILTER_FLETCHER32) {
      fletcher = true;
    }
  }
  const bool chunked = H5Pget_layout(plist) == H5D_CHUNKED;
  H5Pclose(plist);
  H5Dclose(d);
  H5Fclose(f);
  return chunked && fletcher;
}

// ---------------------------------------------------------------- round trips

struct RoundTripCase {
  const char* kind;
  int vocab;
  size_t token_bytes;  // uint16 up to 65536 ids, int32 beyond
};

void PrintTo(const RoundTripCase& c, std::ostream* os) {
  *os << c.kind << " vocab " << c.vocab;
}

class ShardRoundTrip : public ShardTest, public ::testing::WithParamInterface<RoundTripCase> {};

TEST_P(ShardRoundTrip, ReadsBackWhatWasWritten) {
  const RoundTripCase c = GetParam();
  Shard shard = ts::sample_shard(c.kind, c.vocab, 50);
  // The largest id must survive the narrow or wide encoding.
  shard.target.tokens.back() = c.vocab - 1;
  shard.header.special.sep = 5;
  shard.header.special.mask = 4;
  const std::string path = file("a.h5");
  write_shard(path, shard);

  const Shard back = read_shard(path);
  EXPECT_EQ(back.header.kind, c.kind);
  EXPECT_EQ(back.header.version, kShardVersion);
  EXPECT_EQ(back.header.vocab_size, c.vocab);
  EXPECT_EQ(back.header.tokenizer, ts::kTokenizer);
  EXPECT_EQ(back.header.special.pad, 0);
  EXPECT_EQ(back.header.special.bos, 1);
  EXPECT_EQ(back.header.special.eos, 2);
  EXPECT_EQ(back.header.special.unk, 3);
  EXPECT_EQ(back.header.special.mask, 4);
  EXPECT_EQ(back.header.special.sep, 5);
  expect_same(back.target, shard.target);
  expect_same(back.source, shard.source);
  EXPECT_EQ(back.target.count(), 50u);

  const bool seq2seq = std::string(c.kind) == "seq2seq";
  const std::vector<std::string> datasets =
      seq2seq ? std::vector<std::string>{"/tokenizer", "/src/tokens", "/src/offsets", "/tgt/tokens",
                                         "/tgt/offsets"}
              : std::vector<std::string>{"/tokenizer", "/tokens", "/offsets"};
  for (const std::string& d : datasets) {
    EXPECT_TRUE(chunked_with_fletcher32(path, d)) << d;
  }
  EXPECT_EQ(stored_size(path, seq2seq ? "/tgt/tokens" : "/tokens"), c.token_bytes);
  EXPECT_EQ(stored_size(path, seq2seq ? "/src/offsets" : "/offsets"), 8u);
}

INSTANTIATE_TEST_SUITE_P(
    Kinds, ShardRoundTrip,
    ::testing::Values(RoundTripCase{"lm", 64, 2}, RoundTripCase{"lm", 65536, 2},
                      RoundTripCase{"lm", 70000, 4}, RoundTripCase{"seq2seq", 64, 2},
                      RoundTripCase{"seq2seq", 100000, 4}),
    [](const auto& info) {
      return std::string(info.param.kind) + "_vocab" + std::to_string(info.param.vocab);
    });

TEST_F(ShardTest, ManyChunksAndEmptySequences) {
  // Past one 64K-element chunk, with zero-length sequences in between.
  Shard shard;
  shard.header.vocab_size = 30000;
  shard.header.tokenizer = std::string("\0binary\xff", 8);  // any bytes, NULs included
  std::vector<int32_t> seq;
  for (int i = 0; i < 3000; ++i) {
    seq.assign(i % 97, 0);
    for (size_t j = 0; j < seq.size(); ++j)
      seq[j] = 6 + static_cast<int32_t>((i * 131 + j) % 29990);
    shard.target.append(seq.data(), seq.size());
  }
  ASSERT_GT(shard.target.tokens.size(), 2u * 65536u);
  const std::string path = file("big.h5");
  write_shard(path, shard);
  const Shard back = read_shard(path);
  expect_same(back.target, shard.target);
  EXPECT_EQ(back.header.tokenizer, shard.header.tokenizer);
  EXPECT_EQ(back.target.length(0), 0u);
  EXPECT_EQ(back.target.length(96), 96u);
}

TEST_F(ShardTest, AppendExtendsOffsets) {
  TokenSequences s;
  EXPECT_EQ(s.count(), 0u);
  const int32_t a[] = {7, 8, 9};
  s.append(a, 3);
  s.append(a, 0);
  s.append(a + 1, 2);
  EXPECT_EQ(s.count(), 3u);
  EXPECT_EQ(s.offsets, (std::vector<uint64_t>{0, 3, 3, 5}));
  EXPECT_EQ(s.tokens, (std::vector<int32_t>{7, 8, 9, 8, 9}));
  EXPECT_EQ(s.length(1), 0u);
}

TEST_F(ShardTest, HeaderOnlyReadSkipsTheTokens) {
  const std::string path = file("h.h5");
  ts::write_bad_shard(path, "seq2seq", ts::Fault::kTokenOutOfRange);
  const ShardHeader h = read_shard_header(path);  // tokens are not looked at
  EXPECT_EQ(h.kind, "seq2seq");
  EXPECT_EQ(h.vocab_size, ts::kVocab);
  EXPECT_EQ(h.tokenizer, ts::kTokenizer);
  EXPECT_EQ(h.version, kShardVersion);
  EXPECT_THROW(read_shard(path), ShardError);
  // ... but the header's own faults are.
  ts::write_bad_shard(path, "lm", ts::Fault::kBadVersion);
  EXPECT_THROW(read_shard_header(path), ShardError);
}

TEST_F(ShardTest, SplitAndOriginAreOptionalAttributes) {
  Shard shard = ts::sample_shard("seq2seq");
  const std::string bare = file("bare.h5");
  write_shard(bare, shard);  // as before they existed: neither attribute
  EXPECT_TRUE(read_shard(bare).header.split.empty());
  EXPECT_TRUE(read_shard_header(bare).origin.empty());
  hid_t f = H5Fopen(bare.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  EXPECT_EQ(H5Aexists(f, "split"), 0);
  EXPECT_EQ(H5Aexists(f, "origin"), 0);
  H5Fclose(f);

  shard.header.split = "test";
  shard.header.origin = "news.en and news.de lines 1-3000";
  const std::string marked = file("marked.h5");
  write_shard(marked, shard);
  const ShardHeader h = read_shard_header(marked);
  EXPECT_EQ(h.split, "test");
  EXPECT_EQ(h.origin, "news.en and news.de lines 1-3000");
  expect_same(read_shard(marked).source, shard.source);
}

TEST_F(ShardTest, EmptyShardIsValidHdf5ButRejected) {
  const std::string path = file("e.h5");
  ts::write_bad_shard(path, "lm", ts::Fault::kEmpty);
  EXPECT_GT(H5Fis_hdf5(path.c_str()), 0);
  EXPECT_EQ(read_shard_header(path).kind, "lm");
  EXPECT_TRUE(chunked_with_fletcher32(path, "/tokens"));
  EXPECT_THROW(read_shard(path), ShardError);
}

TEST_F(ShardTest, WriteRejectsBadShardsAndLeavesNoFile) {
  const std::string path = file("w.h5");
  auto expect_refused = [&](const Shard& s, const std::string& words) {
    try {
      write_shard(path, s);
      ADD_FAILURE() << "write_shard accepted a bad shard (" << words << ")";
    } catch (const ShardError& e) {
      EXPECT_EQ(std::string(e.what()).rfind(path + ": ", 0), 0u) << e.what();
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
    EXPECT_FALSE(fs::exists(path));
  };
  Shard s = ts::sample_shard("lm");
  s.target.tokens[3] = ts::kVocab;
  expect_refused(s, "token id 64");
  s = ts::sample_shard("lm");
  s.target.offsets[2] = s.target.offsets[3] + 1;
  expect_refused(s, "not non-decreasing at sequence 2");
  s = ts::sample_shard("lm");
  s.target.tokens.pop_back();
  expect_refused(s, "offsets end at");
  s = ts::sample_shard("seq2seq");
  s.source.append(s.source.tokens.data(), 1);
  expect_refused(s, "source but");
  s = ts::sample_shard("lm");
  s.header.kind = "mlm";
  expect_refused(s, "kind 'mlm'");
  // A directory that does not exist: HDF5 cannot create the file.
  try {
    write_shard(file("missing/dir/x.h5"), ts::sample_shard("lm"));
    ADD_FAILURE() << "wrote into a missing directory";
  } catch (const ShardError& e) {
    EXPECT_NE(std::string(e.what()).find("missing/dir/x.h5: cannot write"), std::string::npos)
        << e.what();
  }
}

// ---------------------------------------------------------------- listing

TEST_F(ShardTest, ListShardsSortsByNumberAndIgnoresOthers) {
  const Shard s = ts::sample_shard("lm");
  for (const char* name : {"train-00002.h5", "train-00000.h5", "train-100000.h5", "train-00001.h5",
                           "valid-00000.h5"}) {
    write_shard(file(name), s);
  }
  for (const char* name : {"train-00003.h5.tmp", "train-x.h5", "train-.h5", "notes.txt",
                           "tokenizer.model", "trainer-00004.h5"}) {
    std::ofstream(file(name)) << "x";
  }
  fs::create_directories(dir_ / "train-00009.h5.d");
  const std::vector<std::string> train = list_shards(dir_.string(), "train");
  EXPECT_EQ(train, (std::vector<std::string>{file("train-00000.h5"), file("train-00001.h5"),
                                             file("train-00002.h5"), file("train-100000.h5")}));
  EXPECT_EQ(list_shards(dir_.string(), "valid"), std::vector<std::string>{file("valid-00000.h5")});
  EXPECT_TRUE(list_shards(dir_.string(), "test").empty());
  write_shard(file("test-00000.h5"), s);
  EXPECT_EQ(list_shards(dir_.string(), "test"), std::vector<std::string>{file("test-00000.h5")});
  try {
    list_shards(file("nope"), "train");
    ADD_FAILURE() << "listed a missing directory";
  } catch (const ShardError& e) {
    EXPECT_EQ(std::string(e.what()), file("nope") + ": no such directory");
  }
}

// ---------------------------------------------------------------- faults

struct FaultCase {
  const char* kind;
  ts::Fault fault;
  std::vector<std::string> words;  // every one must appear in the message
};

void PrintTo(const FaultCase& c, std::ostream* os) {
  *os << c.kind << " fault " << static_cast<int>(c.fault);
}

std::string fault_case_name(const ::testing::TestParamInfo<FaultCase>& info) {
  std::string name = info.param.kind;
  for (const ts::FaultName& f : ts::fault_names()) {
    if (f.fault == info.param.fault) name += std::string("_") + f.name;
  }
  for (char& c : name) {
    if (c == '-') c = '_';
  }
  return name;
}

class ShardFault : public ShardTest, public ::testing::WithParamInterface<FaultCase> {};

TEST_P(ShardFault, ReadNamesTheFileAndTheFault) {
  const FaultCase& c = GetParam();
  const std::string path = file("bad.h5");
  ts::write_bad_shard(path, c.kind, c.fault);
  std::string message;
  try {
    read_shard(path);
  } catch (const ShardError& e) {
    message = e.what();
  }
  ASSERT_FALSE(message.empty()) << "read_shard accepted the faulty shard";
  EXPECT_EQ(message.rfind(path + ": ", 0), 0u) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  for (const std::string& w : c.words) {
    EXPECT_NE(message.find(w), std::string::npos) << "'" << w << "' not in: " << message;
  }
}

std::vector<FaultCase> fault_cases() {
  std::vector<FaultCase> cases;
  for (const char* kind : {"lm", "seq2seq"}) {
    const std::string side = std::string(kind) == "lm" ? "/" : "/tgt/";
    cases.push_back(
        {kind, ts::Fault::kMissingFormat, {"not an mpiformer shard (no 'format' attribute)"}});
    cases.push_back({kind,
                     ts::Fault::kBadVersion,
                     {"unsupported shard version 7 (this build reads version 1)"}});
    cases.push_back(
        {kind, ts::Fault::kTruncated, {"truncated or corrupt (the file holds", "bytes but"}});
    cases.push_back({kind, ts::Fault::kNotHdf5, {"not an HDF5 file"}});
    cases.push_back({kind,
                     ts::Fault::kOffsetsNotMonotone,
                     {side + "offsets are not non-decreasing at sequence 3"}});
    // 40 sequences of lengths 1..24 cycling: 24*25/2 + 16*17/2 = 436 tokens.
    cases.push_back({kind,
                     ts::Fault::kOffsetsMismatch,
                     {side + "offsets end at 440 but " + side + "tokens holds 436"}});
    cases.push_back(
        {kind,
         ts::Fault::kTokenOutOfRange,
         {"token id 64 at position 5 of " + side + "tokens is not below vocab_size 64"}});
    cases.push_back({kind, ts::Fault::kEmpty, {"empty shard (0 sequences)"}});
    cases.push_back(
        {kind, ts::Fault::kBadKind, {"kind 'xyz' is not lm, seq2seq, classify or image"}});
    cases.push_back(
        {kind,
         ts::Fault::kBadChecksum,
         {"truncated or corrupt (HDF5 could not read " + side + "tokens", "Fletcher32 checksum"}});
    cases.push_back(
        {kind,
         ts::Fault::kSumBlindChange,
         {side + "tokens is damaged: its CRC-32C checksum is 0x", "but its values sum"}});
  }
  cases.push_back(
      {"seq2seq", ts::Fault::kCountMismatch, {"/src holds 40 sequences but /tgt holds 39"}});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Faults, ShardFault, ::testing::ValuesIn(fault_cases()), fault_case_name);

TEST_F(ShardTest, MissingFileAndDirectory) {
  const std::string path = file("absent.h5");
  try {
    read_shard(path);
    ADD_FAILURE() << "read a missing file";
  } catch (const ShardError& e) {
    EXPECT_EQ(std::string(e.what()), path + ": no such file");
  }
  EXPECT_THROW(read_shard_header(path), ShardError);
  try {
    read_shard(dir_.string());
    ADD_FAILURE() << "read a directory";
  } catch (const ShardError& e) {
    EXPECT_EQ(std::string(e.what()).rfind(dir_.string() + ": ", 0), 0u);
  }
}

TEST_F(ShardTest, OtherFileKindsAreNotShards) {
  // An HDF5 file of another kind (a future checkpoint) is named as such.
  const std::string path = file("ckpt.h5");
  ts::write_bad_shard(path, "lm", ts::Fault::kValid);
  ts::set_string_attr(path, "format", "mpiformer-checkpoint");
  try {
    read_shard_header(path);
    ADD_FAILURE() << "accepted a checkpoint";
  } catch (const ShardError& e) {
    EXPECT_EQ(std::string(e.what()),
              path + ": not an mpiformer shard (format is 'mpiformer-checkpoint')");
  }
}

TEST_F(ShardTest, ValidFaultFreeFilesRead) {
  // The make_bad_shard variants that are valid on their own.
  for (ts::Fault f : {ts::Fault::kValid, ts::Fault::kOtherVocab, ts::Fault::kOtherTokenizer}) {
    for (const char* kind : {"lm", "seq2seq"}) {
      const std::string path = file("ok.h5");
      ts::write_bad_shard(path, kind, f);
      const Shard s = read_shard(path);
      EXPECT_EQ(s.header.vocab_size, f == ts::Fault::kOtherVocab ? ts::kOtherVocab : ts::kVocab);
      EXPECT_EQ(s.header.tokenizer,
                f == ts::Fault::kOtherTokenizer ? ts::kOtherTokenizer : ts::kTokenizer);
      EXPECT_EQ(s.target.count(), 40u);
    }
  }
}

TEST_F(ShardTest, MissingAttributeAndWrongTypes) {
  const std::string path = file("m.h5");
  ts::write_bad_shard(path, "lm", ts::Fault::kValid);
  ts::delete_attr(path, "vocab_size");
  try {
    read_shard(path);
    ADD_FAILURE();
  } catch (const ShardError& e) {
    EXPECT_EQ(std::string(e.what()), path + ": missing attribute 'vocab_size'");
  }
  ts::write_bad_shard(path, "lm", ts::Fault::kValid);
  ts::set_string_attr(path, "version", "1");
  try {
    read_shard(path);
    ADD_FAILURE();
  } catch (const ShardError& e) {
    EXPECT_EQ(std::string(e.what()), path + ": attribute 'version' is string, expected an integer");
  }
  ts::write_bad_shard(path, "lm", ts::Fault::kValid);
  ts::set_int_attr(path, "sep_id", 64);
  EXPECT_THROW(read_shard_header(path), ShardError);
  ts::write_bad_shard(path, "lm", ts::Fault::kValid);
  ts::set_int_attr(path, "sequences", 41);
  try {
    read_shard(path);
    ADD_FAILURE();
  } catch (const ShardError& e) {
    EXPECT_NE(std::string(e.what()).find("attribute 'sequences' says 41"), std::string::npos);
  }
}

}  // namespace
}  // namespace mpiformer
