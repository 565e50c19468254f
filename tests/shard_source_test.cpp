// The shard loader end to end on shard sets written to a temporary directory:
// layouts, --too-long, budgets, the global epoch batch list and its world-size
// invariance, --sharding file, prefetch, and the validation of a whole set.
#include "src/data/shard_source.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cuda/attention_plan.h"
#include "src/core/error.h"
#include "src/data/make_source.h"
#include "src/io/shard.h"
#include "src/model/model.h"
#include "src/train/shard_config.h"

// Counts heap allocations, to show that building batches in steady state
// allocates nothing. Not under AddressSanitizer, which brings its own
// operator new. (GCC cannot tell that these replace the global ones.)
std::atomic<int64_t> g_allocations{0};
#if defined(__SANITIZE_ADDRESS__)
#define MPIFORMER_COUNTS_ALLOCATIONS 0
#else
#define MPIFORMER_COUNTS_ALLOCATIONS 1
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

void* operator new(std::size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) {
  return operator new(n);
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete[](void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::size_t) noexcept {
  std::free(p);
}
#endif

namespace mpiformer {
namespace {

namespace fs = std::filesystem;
using Tokens = std::vector<int32_t>;
using Multiset = std::map<Tokens, int>;

constexpr SpecialTokens kSp;

// A fresh directory, removed with everything in it when the test ends.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() /
            ("mpiformer-loader-" + std::string(info->name()) + "-" + std::to_string(::getpid()));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string str() const { return path_.string(); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

// How the lengths of generated sequences are drawn.
struct Lengths {
  int lo = 1, hi = 30;
  bool log_normal = false;  // median ~25, long right tail, clipped to [lo, hi]
};

int draw_length(const Lengths& l, std::mt19937_64& rng) {
  if (l.log_normal) {
    std::normal_distribution<double> normal(std::log(25.0), 0.6);
    return std::clamp(static_cast<int>(std::lround(std::exp(normal(rng)))), l.lo, l.hi);
  }
  return std::uniform_int_distribution<int>(l.lo, l.hi)(rng);
}

Tokens draw_tokens(int n, int vocab, std::mt19937_64& rng) {
  std::uniform_int_distribution<int> id(SpecialTokens::kCount, vocab - 1);
  Tokens t(n);
  for (int32_t& x : t) x = id(rng);
  return t;
}

struct SetSpec {
  std::string kind = "lm";
  int vocab = 800;
  std::string tokenizer = "sentencepiece-model-bytes-A";
  int train_shards = 3;
  int per_shard = 120;
  int valid_sequences = 60;
  Lengths lengths;
  uint64_t seed = 1;
};

Shard make_shard(const SetSpec& spec, int n, std::mt19937_64& rng) {
  Shard shard;
  shard.header.kind = spec.kind;
  shard.header.vocab_size = spec.vocab;
  shard.header.tokenizer = spec.tokenizer;
  for (int i = 0; i < n; ++i) {
    const int len = draw_length(spec.lengths, rng);
    const Tokens tgt = draw_tokens(len, spec.vocab, rng);
    shard.target.append(tgt.data(), tgt.size());
    if (spec.kind == "seq2seq") {
      // Source and target lengths correlate, as in translation.
      const int src_len =
          std::clamp(static_cast<int>(
                         std::lround(len * std::uniform_real_distribution<double>(0.8, 1.25)(rng))),
                     spec.lengths.lo, spec.lengths.hi);
      const Tokens src = draw_tokens(src_len, spec.vocab, rng);
      shard.source.append(src.data(), src.size());
    }
  }
  return shard;
}

std::string shard_name(const std::string& prefix, int i) {
  char name[32];
  std::snprintf(name, sizeof name, "%s-%05d.h5", prefix.c_str(), i);
  return name;
}

// Writes DIR/train-NNNNN.h5 and DIR/valid-00000.h5; returns the train shards.
std::vector<Shard> write_set(const TempDir& dir, const SetSpec& spec, Shard* valid = nullptr) {
  std::mt19937_64 rng(spec.seed);
  std::vector<Shard> train;
  for (int s = 0; s < spec.train_shards; ++s) {
    train.push_back(make_shard(spec, spec.per_shard, rng));
    write_shard(dir.file(shard_name("train", s)), train.back());
  }
  if (spec.valid_sequences > 0) {
    const Shard v = make_shard(spec, spec.valid_sequences, rng);
    write_shard(dir.file(shard_name("valid", 0)), v);
    if (valid) *valid = v;
  }
  return train;
}

TrainConfig config_for(const TempDir& dir, ModelKind kind, int max_len = 32, int max_tokens = 256) {
  TrainConfig cfg;
  cfg.data_dir = dir.str();
  cfg.model.kind = kind;
  cfg.model.vocab = 0;
  cfg.model.max_len = max_len;
  cfg.max_tokens = max_tokens;
  cfg.prefetch = 0;
  cfg.seed = 11;
  // The start-up reconciles the model with the shards before a source is
  // built; a set it refuses is left as it is, for the test of the refusal.
  try {
    resolve_data_config(&cfg);
  } catch (const std::exception&) {
  }
  return cfg;
}

Tokens slice(const std::vector<int32_t>& v, int begin, int end) {
  return Tokens(v.begin() + begin, v.begin() + end);
}
Tokens sequence(const PackedSequences& p, int b) {
  return slice(p.tokens, p.offsets[b], p.offsets[b + 1]);
}
Tokens targets_of(const Batch& batch, int b) {
  return slice(batch.targets, batch.decoder.offsets[b], batch.decoder.offsets[b + 1]);
}

bool same_batch(const Batch& a, const Batch& b) {
  return a.encoder.offsets == b.encoder.offsets && a.encoder.tokens == b.encoder.tokens &&
         a.encoder.positions == b.encoder.positions && a.decoder.offsets == b.decoder.offsets &&
         a.decoder.tokens == b.decoder.tokens && a.decoder.positions == b.decoder.positions &&
         a.targets == b.targets;
}

// What a sequence of a batch was in the shards (as far as the layout kept
// it): lm the target side, seq2seq source -1 target, mlm the unmasked tokens.
// Also checks the layout itself.
Tokens recover(const Batch& batch, int b, ModelKind kind, int max_len) {
  const Tokens dec = sequence(batch.decoder, b), tgt = targets_of(batch, b);
  EXPECT_EQ(dec.size(), tgt.size());
  EXPECT_LE(static_cast<int>(dec.size()), max_len);
  for (size_t i = 0; i < dec.size(); ++i) {
    EXPECT_EQ(batch.decoder.positions[batch.decoder.offsets[b] + i], static_cast<int32_t>(i));
  }
  if (kind == ModelKind::kMlm) {
    Tokens original(dec.size());
    for (size_t i = 0; i < dec.size(); ++i) original[i] = tgt[i] != kSp.pad ? tgt[i] : dec[i];
    return original;
  }
  // lm and seq2seq decoder: BOS t[0, n-1); targets t[0, n) and EOS when whole.
  EXPECT_EQ(dec.front(), kSp.bos);
  EXPECT_EQ(slice(dec, 1, static_cast<int>(dec.size())),
            slice(tgt, 0, static_cast<int>(tgt.size()) - 1));
  Tokens key = tgt;
  if (key.back() == kSp.eos) key.pop_back();
  if (kind == ModelKind::kSeq2seq) {
    Tokens src = sequence(batch.encoder, b);
    EXPECT_LE(static_cast<int>(src.size()), max_len);
    if (src.back() == kSp.eos) src.pop_back();
    src.push_back(-1);
    key.insert(key.begin(), src.begin(), src.end());
  }
  return key;
}

// The same key for a sequence as it sits in a shard; false when the layout
// would not keep it (too long and skipped, or empty for mlm).
bool expected_key(const Shard& shard, size_t i, ModelKind kind, int max_len, bool truncate,
                  Tokens* key) {
  const auto side = [&](const TokenSequences& s, int marker, bool* too_long) {
    const int n = static_cast<int>(s.length(i));
    *too_long = n + marker > max_len;
    const int kept = *too_long ? max_len : n;
    return slice(s.tokens, s.offsets[i], s.offsets[i] + kept);
  };
  bool long_tgt = false, long_src = false;
  *key = side(shard.target, kind == ModelKind::kMlm ? 0 : 1, &long_tgt);
  if (kind == ModelKind::kMlm && key->empty()) return false;
  if (kind == ModelKind::kSeq2seq) {
    Tokens src = side(shard.source, 1, &long_src);
    src.push_back(-1);
    key->insert(key->begin(), src.begin(), src.end());
  }
  return truncate || !(long_tgt || long_src);
}

Multiset expected_multiset(const std::vector<Shard>& shards, ModelKind kind, int max_len,
                           bool truncate) {
  Multiset m;
  Tokens key;
  for (const Shard& s : shards) {
    for (size_t i = 0; i < s.target.count(); ++i) {
      if (expected_key(s, i, kind, max_len, truncate, &key)) ++m[key];
    }
  }
  return m;
}

// Sequences of train batches [first, first + count).
Multiset train_multiset(ShardSource& src, uint64_t first, uint64_t count, ModelKind kind,
                        int max_len) {
  Multiset m;
  Batch batch;
  for (uint64_t g = first; g < first + count; ++g) {
    src.make_batch(BatchSource::kTrain, g, &batch);
    for (int b = 0; b < batch.decoder.batch(); ++b) ++m[recover(batch, b, kind, max_len)];
  }
  return m;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

const ModelKind kKinds[] = {ModelKind::kLm, ModelKind::kMlm, ModelKind::kSeq2seq};
const char* shard_kind(ModelKind k) {
  return k == ModelKind::kSeq2seq ? "seq2seq" : "lm";
}

// ---- layouts, epochs, budgets ---------------------------------------------

TEST(ShardSource, EveryKindUsesEverySequenceOncePerEpochInItsLayout) {
  for (ModelKind kind : kKinds) {
    TempDir dir;
    SetSpec spec;
    spec.kind = shard_kind(kind);
    spec.lengths = {0, 30};  // empty sequences too; all fit --max-len 32
    const std::vector<Shard> shards = write_set(dir, spec);
    TrainConfig cfg = config_for(dir, kind);
    ShardSource src(cfg, 0, 1);
    EXPECT_EQ(src.model().vocab, 800);
    const uint64_t M = src.batches_per_epoch();
    const Multiset expected = expected_multiset(shards, kind, 32, false);
    EXPECT_EQ(train_multiset(src, 0, M, kind, 32), expected) << to_string(kind);
    EXPECT_EQ(train_multiset(src, M, M, kind, 32), expected) << "epoch 1, " << to_string(kind);
    EXPECT_EQ(src.train_stats().skipped, 0);
    EXPECT_EQ(src.train_stats().truncated, 0);
    int64_t sequences = 0;
    for (const auto& [key, n] : expected) sequences += n;
    EXPECT_EQ(src.train_stats().sequences, sequences);
    if (kind == ModelKind::kMlm) {
      EXPECT_GT(src.train_stats().empty, 0) << "empty sequences have nothing to predict";
    }
  }
}

TEST(ShardSource, Seq2seqSourceEndsWithEosAndLmTargetsEndWithEos) {
  TempDir dir;
  SetSpec spec;
  spec.kind = "seq2seq";
  write_set(dir, spec);
  ShardSource src(config_for(dir, ModelKind::kSeq2seq), 0, 1);
  Batch batch;
  src.make_batch(BatchSource::kTrain, 0, &batch);
  ASSERT_GT(batch.decoder.batch(), 0);
  ASSERT_EQ(batch.encoder.batch(), batch.decoder.batch());
  for (int b = 0; b < batch.decoder.batch(); ++b) {
    EXPECT_EQ(sequence(batch.encoder, b).back(), kSp.eos);
    EXPECT_EQ(sequence(batch.decoder, b).front(), kSp.bos);
    EXPECT_EQ(targets_of(batch, b).back(), kSp.eos);
  }
  EXPECT_EQ(batch.target_tokens(kSp.pad), batch.decoder.total());
}

TEST(ShardSource, TooLongIsTruncatedOrSkippedAndCounted) {
  TempDir dir;
  SetSpec spec;
  spec.lengths = {1, 40};
  const std::vector<Shard> shards = write_set(dir, spec);
  int64_t longer = 0, total = 0;  // lm needs |s| + 1 <= 16
  for (const Shard& s : shards) {
    for (size_t i = 0; i < s.target.count(); ++i) longer += s.target.length(i) + 1 > 16;
    total += s.target.count();
  }
  ASSERT_GT(longer, 0);

  TrainConfig cfg = config_for(dir, ModelKind::kLm, 16);
  {
    ShardSource src(cfg, 0, 1);  // auto: truncate for lm
    EXPECT_EQ(src.train_stats().truncated, longer);
    EXPECT_EQ(src.train_stats().skipped, 0);
    EXPECT_EQ(src.train_stats().sequences, total);
    EXPECT_EQ(train_multiset(src, 0, src.batches_per_epoch(), ModelKind::kLm, 16),
              expected_multiset(shards, ModelKind::kLm, 16, true));
    // A truncated sequence: decoder BOS s[0, 15), targets s[0, 16), no EOS.
    Batch batch;
    bool seen = false;
    for (uint64_t g = 0; g < src.batches_per_epoch() && !seen; ++g) {
      src.make_batch(BatchSource::kTrain, g, &batch);
      for (int b = 0; b < batch.decoder.batch(); ++b) {
        if (batch.decoder.length(b) == 16 && targets_of(batch, b).back() != kSp.eos) seen = true;
      }
    }
    EXPECT_TRUE(seen);
    EXPECT_NE(src.describe().find(std::to_string(longer) + " truncated"), std::string::npos)
        << src.describe();
  }
  cfg.too_long = TooLong::kSkip;
  {
    ShardSource src(cfg, 0, 1);
    EXPECT_EQ(src.train_stats().skipped, longer);
    EXPECT_EQ(src.train_stats().truncated, 0);
    EXPECT_EQ(src.train_stats().sequences, total - longer);
    EXPECT_EQ(train_multiset(src, 0, src.batches_per_epoch(), ModelKind::kLm, 16),
              expected_multiset(shards, ModelKind::kLm, 16, false));
  }
}

TEST(ShardSource, Seq2seqSkipsTooLongPairsByDefault) {
  TempDir dir;
  SetSpec spec;
  spec.kind = "seq2seq";
  spec.lengths = {1, 40};
  const std::vector<Shard> shards = write_set(dir, spec);
  TrainConfig cfg = config_for(dir, ModelKind::kSeq2seq, 24, 256);
  ShardSource skip(cfg, 0, 1);
  EXPECT_GT(skip.train_stats().skipped, 0);
  EXPECT_EQ(skip.train_stats().truncated, 0);
  EXPECT_EQ(train_multiset(skip, 0, skip.batches_per_epoch(), ModelKind::kSeq2seq, 24),
            expected_multiset(shards, ModelKind::kSeq2seq, 24, false));
  cfg.too_long = TooLong::kTruncate;
  ShardSource truncate(cfg, 0, 1);
  EXPECT_EQ(truncate.train_stats().truncated, skip.train_stats().skipped);
  EXPECT_EQ(train_multiset(truncate, 0, truncate.batches_per_epoch(), ModelKind::kSeq2seq, 24),
            expected_multiset(shards, ModelKind::kSeq2seq, 24, true));
}

TEST(ShardSource, BatchesStayWithinBudgetsAndOneBucket) {
  for (ModelKind kind : kKinds) {
    TempDir dir;
    SetSpec spec;
    spec.kind = shard_kind(kind);
    spec.lengths = {1, 63};
    write_set(dir, spec);
    for (int max_tokens : {128, 300, 1000}) {
      for (int max_sentences : {0, 3}) {
        TrainConfig cfg = config_for(dir, kind, 64, max_tokens);
        cfg.max_sentences = max_sentences;
        ShardSource src(cfg, 0, 1);
        const std::vector<int>& bounds = src.boundaries();
        Batch batch;
        for (uint64_t g = 0; g < src.batches_per_epoch(); ++g) {
          src.make_batch(BatchSource::kTrain, g, &batch);
          ASSERT_GE(batch.decoder.batch(), 1);
          EXPECT_LE(batch.padded_tokens(), max_tokens);
          if (max_sentences > 0) {
            EXPECT_LE(batch.decoder.batch(), max_sentences);
          }
          EXPECT_EQ(static_cast<int>(batch.targets.size()), batch.decoder.total());
          // One bucket per batch: every decoder length under the same boundary.
          int bucket = -2;
          for (int b = 0; b < batch.decoder.batch(); ++b) {
            const int here = bucket_index(bounds, batch.decoder.length(b));
            if (bucket == -2) bucket = here;
            EXPECT_EQ(here, bucket);
          }
        }
      }
    }
  }
}

// The graph classes a GPU run prepares from the source's bucket bounds
// (Model::attention_cases, kernels/cuda/attention_plan.h) hold every batch
// of both streams, and every batch of one bucket takes the same class: no
// step waits for a graph, and a bucket's ragged batches share one.
TEST(ShardSource, BucketBoundsHoldEveryBatchAndABucketTakesOneClass) {
  for (ModelKind kind : kKinds) {
    TempDir dir;
    SetSpec spec;
    spec.kind = shard_kind(kind);
    spec.lengths = {1, 63};
    write_set(dir, spec);
    ShardSource src(config_for(dir, kind, 64, 300), 0, 1);
    const std::vector<AttentionCase> cases =
        Model::attention_cases(src.model(), src.bucket_bounds());
    ASSERT_FALSE(cases.empty()) << to_string(kind);
    // One layout per attention kind of the model; q's side and k's side.
    struct Kind {
      cuda::GraphLayout layout;
      bool q_encoder, k_encoder;
    };
    std::vector<Kind> kinds;
    cuda::PlannedShapes planned;
    for (const AttentionCase& c : cases) {
      const cuda::GraphLayout layout{c.cfg.heads, c.cfg.head_dim, c.q_stride, c.kv_stride,
                                     c.cfg.causal};
      planned.add(layout, c.q, c.k);
      const bool cross = c.q_stride != c.kv_stride;
      const bool encoder = kind == ModelKind::kSeq2seq && !c.cfg.causal && !cross;
      if (std::none_of(kinds.begin(), kinds.end(),
                       [&](const Kind& k) { return k.layout == layout; }))
        kinds.push_back({layout, encoder, encoder || cross});
    }
    EXPECT_EQ(kinds.size(), kind == ModelKind::kSeq2seq ? 3u : 1u);
    const std::vector<int>& bounds = src.boundaries();
    std::map<std::pair<int, int>, const cuda::PlannedShapes::Entry*> class_of;  // (bucket, kind)
    Batch batch;
    const auto check = [&](const Batch& b) {
      const int bucket =
          bucket_index(bounds, b.decoder.max_len()) * 1000 +
          (kind == ModelKind::kSeq2seq ? bucket_index(bounds, b.encoder.max_len()) : 0);
      for (size_t k = 0; k < kinds.size(); ++k) {
        const PackedSequences& q = kinds[k].q_encoder ? b.encoder : b.decoder;
        const PackedSequences& keys = kinds[k].k_encoder ? b.encoder : b.decoder;
        const Ragged qs{q.offsets.data(), nullptr, q.batch(), q.total(), q.max_len(), 0};
        const Ragged ks{keys.offsets.data(), nullptr,        keys.batch(),
                        keys.total(),        keys.max_len(), 0};
        const cuda::PlannedShapes::Entry* entry = planned.covering(kinds[k].layout, qs, ks);
        ASSERT_NE(entry, nullptr) << to_string(kind) << ": a batch no prepared class holds";
        const auto [it, first] =
            class_of.emplace(std::make_pair(bucket, static_cast<int>(k)), entry);
        EXPECT_EQ(it->second, entry) << to_string(kind) << ": a bucket's batches took two classes";
      }
    };
    for (uint64_t g = 0; g < 2 * src.batches_per_epoch(); ++g) {
      src.make_batch(BatchSource::kTrain, g, &batch);
      check(batch);
    }
    for (uint64_t g = 0; g < src.eval_batch_count(); ++g) {
      src.make_batch(BatchSource::kEval, g, &batch);
      check(batch);
    }
    // Lengths up to 64 round to at most 4 classes per layout.
    EXPECT_LE(planned.entries().size(), 4 * kinds.size() * (kind == ModelKind::kSeq2seq ? 4 : 1));
  }
}

// A bucket whose sequences all have one length (an image classifier's
// patches, or data of one length) is a uniform class (SideBound::one_length):
// its bound says that length, and its full batches are exactly that shape,
// so that the graph attention=dense makes for it serves them (a batch of
// another count takes the bucket's ragged class). A bucket of several
// lengths is not (the default boundaries give the short lengths a bucket
// each, so those are classes of one length, wherever they are).
TEST(ShardSource, ABucketOfOneLengthIsAUniformClass) {
  for (ModelKind kind : kKinds) {
    for (const bool equal : {true, false}) {
      SCOPED_TRACE(std::string(to_string(kind)) + (equal ? ", one length" : ", lengths 34..44"));
      TempDir dir;
      SetSpec spec;
      spec.kind = shard_kind(kind);
      spec.lengths = equal ? Lengths{17, 17} : Lengths{34, 44};
      write_set(dir, spec);
      ShardSource src(config_for(dir, kind, 64, 300), 0, 1);
      const std::vector<BatchSource::BucketBound> bounds = src.bucket_bounds();
      ASSERT_FALSE(bounds.empty());
      const auto one_length = [&](const BatchSource::BucketBound& bound) {
        return bound.decoder.one_length > 0 &&
               (kind != ModelKind::kSeq2seq || bound.encoder.one_length > 0);
      };
      if (!equal) {
        EXPECT_FALSE(std::all_of(bounds.begin(), bounds.end(), one_length));
        continue;
      }
      EXPECT_TRUE(std::all_of(bounds.begin(), bounds.end(), one_length));
      const SideBound& train = bounds.front().decoder;  // the train stream's one bucket
      int full = 0;
      Batch batch;
      for (uint64_t g = 0; g < src.batches_per_epoch(); ++g) {
        src.make_batch(BatchSource::kTrain, g, &batch);
        for (int b = 0; b < batch.decoder.batch(); ++b)
          EXPECT_EQ(batch.decoder.length(b), train.one_length);
        EXPECT_LE(batch.decoder.batch(), train.sequences);
        if (batch.decoder.batch() != train.sequences) continue;
        ++full;
        EXPECT_EQ(batch.decoder.total(), int64_t{train.sequences} * train.one_length);
      }
      EXPECT_GT(full, 0) << "no batch has the uniform class's shape";
    }
  }
}

TEST(ShardSource, CustomBucketsAreUsed) {
  TempDir dir;
  SetSpec spec;
  spec.lengths = {1, 60};
  write_set(dir, spec);
  TrainConfig cfg = config_for(dir, ModelKind::kLm, 64, 512);
  cfg.buckets = {16, 32};
  ShardSource src(cfg, 0, 1);
  EXPECT_EQ(src.boundaries(), std::vector<int>({16, 32, 64}));
  Batch batch;
  for (uint64_t g = 0; g < src.batches_per_epoch(); ++g) {
    src.make_batch(BatchSource::kTrain, g, &batch);
    const int longest = batch.decoder.max_len(), shortest = [&] {
      int m = 1 << 30;
      for (int b = 0; b < batch.decoder.batch(); ++b) m = std::min(m, batch.decoder.length(b));
      return m;
    }();
    EXPECT_EQ(bucket_index(src.boundaries(), longest), bucket_index(src.boundaries(), shortest));
  }
}

// ---- the global batch list -------------------------------------------------

TEST(ShardSource, GlobalBatchSequenceDoesNotDependOnWorldSize) {
  TempDir dir;
  SetSpec spec;
  spec.lengths = {1, 60};
  write_set(dir, spec);
  for (ModelKind kind : {ModelKind::kLm, ModelKind::kMlm}) {
    TrainConfig cfg = config_for(dir, kind, 64, 1024);
    cfg.prefetch = 3;
    const int K = 2, steps = 20;
    ShardSource single(cfg, 0, 1);
    const uint64_t M = single.batches_per_epoch();
    ASSERT_LT(M, static_cast<uint64_t>(steps * K)) << "the test should cross an epoch boundary";
    std::vector<Batch> reference(4 * K * steps);
    for (uint64_t g = 0; g < reference.size(); ++g) {
      single.make_batch(BatchSource::kTrain, g, &reference[g]);
    }
    for (int W = 1; W <= 4; ++W) {
      std::vector<std::unique_ptr<ShardSource>> ranks;
      for (int r = 0; r < W; ++r) {
        ranks.push_back(std::make_unique<ShardSource>(cfg, r, W));
        ASSERT_TRUE(ranks.back()->global_indices());
        EXPECT_EQ(ranks.back()->batches_per_epoch(), M);
        ranks.back()->prefetch(r, W);
      }
      // What the training loop asks, in its order; the step's batches in
      // global order are those of the single source.
      Batch batch;
      for (int s = 1; s <= steps; ++s) {
        for (int k = 0; k < K; ++k) {
          for (int r = 0; r < W; ++r) {
            const uint64_t index = r + W * static_cast<uint64_t>((s - 1) * K + k);
            if (index >= reference.size()) continue;
            ranks[r]->make_batch(BatchSource::kTrain, index, &batch);
            EXPECT_TRUE(same_batch(batch, reference[index]))
                << to_string(kind) << " W=" << W << " rank " << r << " index " << index;
          }
        }
      }
    }
  }
}

TEST(ShardSource, OrderIsDeterministicInSeedAndDiffersBetweenEpochs) {
  TempDir dir;
  SetSpec spec;
  spec.lengths = {1, 60};
  write_set(dir, spec);
  TrainConfig cfg = config_for(dir, ModelKind::kLm, 64, 256);
  ShardSource a(cfg, 0, 1), again(cfg, 0, 1);
  cfg.seed = 12;
  ShardSource other(cfg, 0, 1);
  const uint64_t M = a.batches_per_epoch();
  EXPECT_EQ(other.batches_per_epoch(), M);
  Batch x, y;
  int differ_epoch = 0, differ_seed = 0;
  for (uint64_t g = 0; g < M; ++g) {
    a.make_batch(BatchSource::kTrain, g, &x);
    again.make_batch(BatchSource::kTrain, g, &y);
    EXPECT_TRUE(same_batch(x, y));
    a.make_batch(BatchSource::kTrain, g + M, &y);
    differ_epoch += !same_batch(x, y);
    other.make_batch(BatchSource::kTrain, g, &y);
    differ_seed += !same_batch(x, y);
  }
  EXPECT_GT(differ_epoch, static_cast<int>(M) / 2);
  EXPECT_GT(differ_seed, static_cast<int>(M) / 2);
  // Far epochs keep the same batch count and use every sequence once.
  EXPECT_EQ(train_multiset(a, 57 * M, M, ModelKind::kLm, 64),
            train_multiset(a, 0, M, ModelKind::kLm, 64));
}

TEST(ShardSource, MlmMasksAreDeterministicAndNearTheRate) {
  TempDir dir;
  SetSpec spec;
  spec.lengths = {1, 60};
  spec.vocab = 5000;
  write_set(dir, spec);
  TrainConfig cfg = config_for(dir, ModelKind::kMlm, 64, 512);
  ShardSource a(cfg, 0, 1), b(cfg, 0, 1);
  Batch x, y;
  int64_t real = 0, chosen = 0, masked = 0;
  for (uint64_t g = 0; g < a.batches_per_epoch(); ++g) {
    a.make_batch(BatchSource::kTrain, g, &x);
    b.make_batch(BatchSource::kTrain, g, &y);
    EXPECT_TRUE(same_batch(x, y));
    for (int s = 0; s < x.decoder.batch(); ++s) {
      const Tokens in = sequence(x.decoder, s), tgt = targets_of(x, s);
      int here = 0;
      for (size_t i = 0; i < in.size(); ++i) {
        if (tgt[i] == kSp.pad) continue;
        ++here;
        masked += in[i] == kSp.mask;
      }
      EXPECT_GE(here, 1);
      chosen += here;
      real += static_cast<int64_t>(in.size());
    }
  }
  EXPECT_NEAR(static_cast<double>(chosen) / real, 0.16, 0.02);
  EXPECT_NEAR(static_cast<double>(masked) / chosen, 0.8, 0.03);
  // The same sequences in another epoch get other masks.
  a.make_batch(BatchSource::kTrain, 0, &x);
  a.make_batch(BatchSource::kTrain, a.batches_per_epoch(), &y);
  EXPECT_FALSE(same_batch(x, y));
}

TEST(ShardSource, EvalStreamIsEveryValidSequenceInFileOrderWhateverTheSeed) {
  TempDir dir;
  SetSpec spec;
  spec.lengths = {1, 60};
  spec.valid_sequences = 300;
  Shard valid;
  write_set(dir, spec, &valid);
  TrainConfig cfg = config_for(dir, ModelKind::kLm, 64, 256);
  ShardSource a(cfg, 0, 1);
  cfg.seed = 99;
  ShardSource b(cfg, 0, 1);
  ASSERT_GT(a.eval_batch_count(), 1u);
  EXPECT_EQ(a.eval_batch_count(), b.eval_batch_count());
  Multiset seen;
  Batch x, y;
  for (uint64_t i = 0; i < a.eval_batch_count(); ++i) {
    a.make_batch(BatchSource::kEval, i, &x);
    b.make_batch(BatchSource::kEval, i, &y);
    EXPECT_TRUE(same_batch(x, y));
    EXPECT_LE(x.padded_tokens(), 256);
    for (int s = 0; s < x.decoder.batch(); ++s) ++seen[recover(x, s, ModelKind::kLm, 64)];
  }
  EXPECT_EQ(seen, expected_multiset({valid}, ModelKind::kLm, 64, true));
  EXPECT_THROW(a.make_batch(BatchSource::kEval, a.eval_batch_count(), &x), std::out_of_range);
  EXPECT_EQ(a.eval_stats().sequences, 300);
}

TEST(ShardSource, EvalStreamCanBeTheTestSplitAlone) {
  TempDir dir;
  SetSpec spec;
  spec.lengths = {1, 60};
  write_set(dir, spec);
  std::mt19937_64 rng(5);
  const Shard test = make_shard(spec, 90, rng);
  write_shard(dir.file(shard_name("test", 0)), test);
  const TrainConfig cfg = config_for(dir, ModelKind::kLm, 64, 256);

  // Evaluation alone: the test split's sequences, in file order; the train
  // shards are checked but not loaded, and train batches are empty.
  ShardSource only(cfg, 0, 1, SplitChoice{"test", false});
  Multiset seen;
  Batch batch;
  for (uint64_t i = 0; i < only.eval_batch_count(); ++i) {
    only.make_batch(BatchSource::kEval, i, &batch);
    for (int s = 0; s < batch.decoder.batch(); ++s) ++seen[recover(batch, s, ModelKind::kLm, 64)];
  }
  EXPECT_EQ(seen, expected_multiset({test}, ModelKind::kLm, 64, true));
  EXPECT_EQ(only.eval_stats().sequences, 90);
  EXPECT_EQ(only.train_stats().sequences, 0);
  only.make_batch(BatchSource::kTrain, 0, &batch);
  EXPECT_EQ(batch.decoder.batch(), 0);

  // The same batches as a source that also loads the training split.
  ShardSource both(cfg, 0, 1, SplitChoice{"test", true});
  ASSERT_EQ(both.eval_batch_count(), only.eval_batch_count());
  Batch other;
  for (uint64_t i = 0; i < only.eval_batch_count(); ++i) {
    only.make_batch(BatchSource::kEval, i, &batch);
    both.make_batch(BatchSource::kEval, i, &other);
    EXPECT_TRUE(same_batch(batch, other));
  }
  EXPECT_EQ(both.train_stats().sequences, 3 * 120);

  // The default is the validation split; a missing test split is named.
  EXPECT_EQ(ShardSource(cfg, 0, 1).eval_stats().sequences, 60);
  fs::remove(dir.file(shard_name("test", 0)));
  EXPECT_EQ(error_of([&] {
              ShardSource(cfg, 0, 1, SplitChoice{"test", false});
            }),
            "--data: " + dir.str() + " holds no test-*.h5 shard");
}

// ---- prefetch --------------------------------------------------------------

TEST(ShardSource, PrefetchGivesTheSynchronousBatchesInAnyOrderOfRequests) {
  TempDir dir;
  SetSpec spec;
  spec.lengths = {1, 60};
  write_set(dir, spec);
  for (ModelKind kind : {ModelKind::kLm, ModelKind::kMlm}) {
    TrainConfig cfg = config_for(dir, kind, 64, 256);
    ShardSource sync(cfg, 0, 1);
    const uint64_t M = sync.batches_per_epoch();
    for (int depth : {1, 4}) {
      cfg.prefetch = depth;
      ShardSource ahead(cfg, 0, 1);
      Batch want, got;
      const auto check = [&](uint64_t index) {
        ahead.make_batch(BatchSource::kTrain, index, &got);
        sync.make_batch(BatchSource::kTrain, index, &want);
        EXPECT_TRUE(same_batch(got, want)) << "depth " << depth << " index " << index;
      };
      // Requests before any prefetch() are built on the spot.
      check(5);
      // In order, across an epoch boundary.
      ahead.prefetch(0, 1);
      for (uint64_t g = 0; g < M + 5; ++g) check(g);
      // A strided sequence, as rank 2 of 3.
      ahead.prefetch(2, 3);
      for (uint64_t g = 2; g < 60; g += 3) check(g);
      // Skips ahead, goes back, repeats, and eval in between.
      for (uint64_t g : {70ull, 73ull, 200ull, 3ull, 3ull, 6ull, 7ull, 9ull, 1000ull, 1003ull}) {
        check(g);
        ahead.make_batch(BatchSource::kEval, 0, &got);
        sync.make_batch(BatchSource::kEval, 0, &want);
        EXPECT_TRUE(same_batch(got, want));
      }
      // Random order.
      std::mt19937_64 rng(depth);
      for (int i = 0; i < 50; ++i) check(rng() % (3 * M));
      // And back to the plan after the detours.
      for (uint64_t g = 1006; g < 1060; g += 3) check(g);
    }
  }
}

TEST(ShardSource, PrefetchedBatchesAreHandedOver) {
  TempDir dir;
  write_set(dir, SetSpec{});
  TrainConfig cfg = config_for(dir, ModelKind::kLm);
  cfg.prefetch = 4;
  ShardSource src(cfg, 0, 1);
  src.prefetch(10, 2);
  // The ring fills (bounded by its depth), however slowly the machine runs.
  for (int wait = 0; wait < 500 && src.prefetch_ready() < 4; ++wait) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(src.prefetch_ready(), 4u);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(src.prefetch_ready(), 4u) << "the worker must stop at the depth";
  Batch batch;
  for (uint64_t g = 10; g < 18; g += 2) src.make_batch(BatchSource::kTrain, g, &batch);
  EXPECT_EQ(src.prefetched_batches(), 4u);
}

TEST(ShardSource, SteadyStateBuildsWithoutAllocating) {
  if (!MPIFORMER_COUNTS_ALLOCATIONS) GTEST_SKIP() << "allocations are not counted in this build";
  for (ModelKind kind : kKinds) {
    TempDir dir;
    SetSpec spec;
    spec.kind = shard_kind(kind);
    spec.lengths = {1, 60};
    write_set(dir, spec);
    for (int depth : {0, 3}) {
      TrainConfig cfg = config_for(dir, kind, 64, 512);
      cfg.prefetch = depth;
      ShardSource src(cfg, 0, 1);
      const uint64_t M = src.batches_per_epoch();
      ASSERT_GT(M, 20u);
      // The caller's buffer joins those that circulate; its first fill sizes it.
      Batch batch;
      src.make_batch(BatchSource::kEval, 0, &batch);
      src.prefetch(0, 1);
      // Warm-up: epoch 1's plan is built.
      for (uint64_t g = 0; g < M + 5; ++g) src.make_batch(BatchSource::kTrain, g, &batch);
      const int64_t before = g_allocations.load();
      for (uint64_t g = M + 5; g < 2 * M - 5; ++g) src.make_batch(BatchSource::kTrain, g, &batch);
      EXPECT_EQ(g_allocations.load() - before, 0) << to_string(kind) << " depth " << depth;
    }
  }
}

TEST(ShardSource, DestroyingWhilePrefetchingIsClean) {
  TempDir dir;
  write_set(dir, SetSpec{});
  TrainConfig cfg = config_for(dir, ModelKind::kLm);
  cfg.prefetch = 8;
  for (int i = 0; i < 20; ++i) {
    ShardSource src(cfg, 0, 1);
    src.prefetch(i, 1 + i % 3);
    if (i % 2) {
      Batch batch;
      src.make_batch(BatchSource::kTrain, i, &batch);
    }
  }
}

// ---- --sharding file -------------------------------------------------------

TEST(ShardSource, FileShardingGivesEachRankItsOwnFiles) {
  TempDir dir;
  SetSpec spec;
  spec.train_shards = 5;
  spec.per_shard = 50;
  const std::vector<Shard> shards = write_set(dir, spec);
  TrainConfig cfg = config_for(dir, ModelKind::kLm);
  cfg.sharding = Sharding::kFile;
  const int W = 2;
  Multiset all;
  for (int r = 0; r < W; ++r) {
    ShardSource src(cfg, r, W);
    EXPECT_FALSE(src.global_indices());
    std::vector<Shard> mine;
    for (int s = r; s < spec.train_shards; s += W) mine.push_back(shards[s]);
    EXPECT_EQ(src.train_stats().shards, static_cast<int64_t>(mine.size()));
    const Multiset got = train_multiset(src, 0, src.batches_per_epoch(), ModelKind::kLm, 32);
    EXPECT_EQ(got, expected_multiset(mine, ModelKind::kLm, 32, false)) << "rank " << r;
    for (const auto& [key, n] : got) all[key] += n;
    EXPECT_NE(src.describe().find("--sharding file"), std::string::npos);
  }
  EXPECT_EQ(all, expected_multiset(shards, ModelKind::kLm, 32, false));
  // Six ranks on five files: rank 5 reads none and its batches are empty,
  // while rank 0 still reads its file and says so.
  ShardSource idle(cfg, 5, 6);
  EXPECT_EQ(idle.train_stats().shards, 0);
  EXPECT_EQ(idle.batches_per_epoch(), 0u);
  idle.prefetch(0, 1);
  Batch batch;
  for (uint64_t g = 0; g < 3; ++g) {
    idle.make_batch(BatchSource::kTrain, g, &batch);
    EXPECT_EQ(batch.decoder.batch(), 0);
    EXPECT_EQ(batch.target_tokens(0), 0);
  }
  idle.make_batch(BatchSource::kEval, 0, &batch);
  EXPECT_GT(batch.decoder.batch(), 0);  // evaluation data is shared by all ranks
  ShardSource busy(cfg, 0, 6);
  EXPECT_EQ(busy.train_stats().shards, 1);
  EXPECT_NE(busy.describe().find("rank 5 has no train shard: it joins every step with zero tokens"),
            std::string::npos)
      << busy.describe();
}

// ---- validation ------------------------------------------------------------

// The start-up reconciles, and says what the shards decided; the source
// itself only checks, and refuses a model the start-up did not reconcile.
TEST(ShardSource, TheStartUpSaysWhatTheShardsDecidedAndTheSourceOnlyChecks) {
  TempDir dir;
  write_set(dir, SetSpec{});
  TrainConfig cfg;
  cfg.data_dir = dir.str();
  cfg.model.kind = ModelKind::kLm;
  cfg.model.vocab = 0;
  cfg.model.max_len = 32;
  cfg.max_tokens = 256;
  cfg.prefetch = 0;
  EXPECT_EQ(error_of([&] { ShardSource(cfg, 0, 1); }),
            "--vocab: the shards in " + dir.str() + " have vocabulary 800; got 0");
  EXPECT_EQ(resolve_data_config(&cfg), "vocab 800, special ids");
  EXPECT_EQ(cfg.model.vocab, 800);
  EXPECT_EQ(resolve_data_config(&cfg), "special ids");  // --vocab given: the flags said it
  const ModelConfig reconciled = cfg.model;
  ShardSource src(cfg, 0, 1);
  EXPECT_EQ(src.model().vocab, reconciled.vocab);
  EXPECT_TRUE(src.model().special == reconciled.special);
  TrainConfig synthetic;
  EXPECT_EQ(resolve_data_config(&synthetic), "");
}

TEST(ShardSource, ResolveTakesVocabularyAndSpecialIdsFromTheShards) {
  TempDir dir;
  write_set(dir, SetSpec{});
  TrainConfig cfg = config_for(dir, ModelKind::kMlm);
  resolve_data_config(&cfg);
  EXPECT_EQ(cfg.model.vocab, 800);
  EXPECT_EQ(cfg.model.special.mask, kSp.mask);
  cfg.model.vocab = 500;
  EXPECT_EQ(error_of([&] { resolve_data_config(&cfg); }),
            "--vocab: the shards in " + dir.str() + " have vocabulary 800; got 500");
  EXPECT_EQ(error_of([&] { ShardSource(cfg, 0, 1); }),
            "--vocab: the shards in " + dir.str() + " have vocabulary 800; got 500");
  cfg.model.vocab = 800;
  cfg.model.kind = ModelKind::kSeq2seq;
  EXPECT_EQ(error_of([&] { resolve_data_config(&cfg); }),
            "--model: seq2seq reads seq2seq shards; the shards in " + dir.str() + " are lm");
  TrainConfig synthetic;  // no --data: nothing to resolve
  synthetic.model.vocab = 0;
  EXPECT_NO_THROW(resolve_data_config(&synthetic));
  EXPECT_EQ(synthetic.model.vocab, 0);
  // make_batch_source builds the shard source for --data.
  cfg.model.kind = ModelKind::kLm;
  const std::unique_ptr<BatchSource> made = make_batch_source(cfg, 0, 1);
  EXPECT_NE(dynamic_cast<ShardSource*>(made.get()), nullptr);
  EXPECT_EQ(made->describe().rfind("data " + dir.str() + ": 3 train shards", 0), 0u)
      << made->describe();
}

TEST(ShardSource, LmShardsRefuseSeq2seqAndTheOtherWayRound) {
  TempDir dir;
  SetSpec spec;
  spec.kind = "seq2seq";
  write_set(dir, spec);
  EXPECT_EQ(error_of([&] { ShardSource(config_for(dir, ModelKind::kLm), 0, 1); }),
            "--model: lm reads lm shards; the shards in " + dir.str() + " are seq2seq");
  EXPECT_EQ(error_of([&] { ShardSource(config_for(dir, ModelKind::kMlm), 0, 1); }),
            "--model: mlm reads lm shards; the shards in " + dir.str() + " are seq2seq");
}

TEST(ShardSource, EveryShardMustMatchTheFirst) {
  const auto check = [](const std::function<void(SetSpec*)>& odd, const std::string& name,
                        const std::string& what) {
    TempDir dir;
    write_set(dir, SetSpec{});
    SetSpec spec;
    odd(&spec);
    std::mt19937_64 rng(3);
    write_shard(dir.file(name), make_shard(spec, 10, rng));
    EXPECT_EQ(error_of([&] { ShardSource(config_for(dir, ModelKind::kLm), 0, 1); }),
              dir.file(name) + ": " + what + " " + dir.file("train-00000.h5"));
  };
  check([](SetSpec* s) { s->vocab = 900; }, "train-00002.h5", "vocabulary 900 differs from 800 in");
  check([](SetSpec* s) { s->vocab = 900; }, "valid-00000.h5", "vocabulary 900 differs from 800 in");
  check([](SetSpec* s) { s->tokenizer = "another model"; }, "train-00001.h5",
        "tokenizer differs from");
  check([](SetSpec* s) { s->tokenizer = "another model"; }, "valid-00000.h5",
        "tokenizer differs from");
  check([](SetSpec* s) { s->kind = "seq2seq"; }, "train-00001.h5",
        "kind seq2seq differs from lm in");
}

TEST(ShardSource, DifferentSpecialIdsAreRefused) {
  TempDir dir;
  write_set(dir, SetSpec{});
  SetSpec spec;
  std::mt19937_64 rng(3);
  Shard odd = make_shard(spec, 10, rng);
  odd.header.special.sep = 4;
  odd.header.special.mask = 5;
  write_shard(dir.file("train-00001.h5"), odd);
  EXPECT_EQ(error_of([&] { ShardSource(config_for(dir, ModelKind::kLm), 0, 1); }),
            dir.file("train-00001.h5") + ": special ids differ from " + dir.file("train-00000.h5"));
}

TEST(ShardSource, MissingSplitsAndCorruptFilesAreNamed) {
  {
    TempDir dir;
    SetSpec spec;
    spec.train_shards = 0;
    write_set(dir, spec);
    EXPECT_EQ(error_of([&] { ShardSource(config_for(dir, ModelKind::kLm), 0, 1); }),
              "--data: " + dir.str() + " holds no train-*.h5 shards");
    TrainConfig cfg = config_for(dir, ModelKind::kLm);
    EXPECT_EQ(error_of([&] { resolve_data_config(&cfg); }),
              "--data: " + dir.str() + " holds no train-*.h5 shards");
  }
  {
    TempDir dir;
    SetSpec spec;
    spec.valid_sequences = 0;
    write_set(dir, spec);
    EXPECT_EQ(error_of([&] { ShardSource(config_for(dir, ModelKind::kLm), 0, 1); }),
              "--data: " + dir.str() + " holds no valid-*.h5 shard");
  }
  {
    TempDir dir;
    write_set(dir, SetSpec{});
    std::ofstream(dir.file("train-00001.h5"), std::ios::trunc) << "not a shard";
    const std::string e = error_of([&] { ShardSource(config_for(dir, ModelKind::kLm), 0, 1); });
    EXPECT_EQ(e.rfind(dir.file("train-00001.h5") + ": ", 0), 0u) << e;
  }
  TrainConfig cfg;
  cfg.data_dir = "/nonexistent/mpiformer-data";
  EXPECT_EQ(error_of([&] { ShardSource(cfg, 0, 1); }),
            "--data: /nonexistent/mpiformer-data is not a directory");
}

TEST(ShardSource, BudgetTooSmallForOneLongestSequenceIsAUsageError) {
  TempDir dir;
  SetSpec spec;
  spec.kind = "seq2seq";
  write_set(dir, spec);
  EXPECT_EQ(error_of([&] { ShardSource(config_for(dir, ModelKind::kSeq2seq, 64, 100), 0, 1); }),
            "--max-tokens: must be at least 128, the padded size of one longest sequence "
            "(--max-len 64, both sides); got 100");
  EXPECT_THROW(ShardSource(config_for(dir, ModelKind::kSeq2seq, 64, 100), 0, 1), UsageError);
}

TEST(ShardSource, SkippingEverySequenceIsAUsageErrorOfTooLong) {
  TempDir dir;
  SetSpec spec;
  spec.lengths = Lengths{20, 30};
  write_set(dir, spec);
  TrainConfig cfg = config_for(dir, ModelKind::kLm, 16, 256);
  cfg.too_long = TooLong::kSkip;
  EXPECT_EQ(error_of([&] { ShardSource(cfg, 0, 1); }),
            "--too-long: skip leaves nothing of the train split of " + dir.str() +
                ": none of its sequences fits --max-len 16 (360 too long, 0 empty); raise "
                "--max-len or use --too-long truncate");
  EXPECT_THROW(ShardSource(cfg, 0, 1), UsageError);
}

// ---- padding ---------------------------------------------------------------

TEST(ShardSource, PaddingEfficiencyOnNaturalLengths) {
  for (ModelKind kind : kKinds) {
    TempDir dir;
    SetSpec spec;
    spec.kind = shard_kind(kind);
    spec.lengths = {5, 120, true};
    spec.train_shards = 2;
    spec.per_shard = 10000;
    write_set(dir, spec);
    TrainConfig cfg = config_for(dir, kind, 128, 4096);
    ShardSource src(cfg, 0, 1);
    EXPECT_GE(src.epoch_padding_efficiency(), 0.90) << to_string(kind) << "\n" << src.describe();
    // The figure is what the batches themselves give.
    int64_t real = 0, padded = 0;
    Batch batch;
    for (uint64_t g = 0; g < src.batches_per_epoch(); ++g) {
      src.make_batch(BatchSource::kTrain, g, &batch);
      real += batch.real_tokens();
      padded += batch.padded_tokens();
    }
    EXPECT_NEAR(static_cast<double>(real) / padded, src.epoch_padding_efficiency(), 1e-12);
    EXPECT_EQ(real, src.train_stats().tokens);
  }
}

// The lead's check on a real corpus: MPIFORMER_DEMO_DATA=DIR (from `prepare`).
TEST(ShardSource, DemoCorpusIfGiven) {
  const char* dir = std::getenv("MPIFORMER_DEMO_DATA");
  if (!dir || !fs::is_directory(dir)) GTEST_SKIP() << "set MPIFORMER_DEMO_DATA to a prepared DIR";
  const ShardHeader header = read_shard_header(list_shards(dir, "train").at(0));
  std::vector<ModelKind> kinds = {ModelKind::kSeq2seq};
  if (header.kind == "lm") kinds = {ModelKind::kLm, ModelKind::kMlm};
  for (ModelKind kind : kinds) {
    TrainConfig cfg;
    cfg.data_dir = dir;
    cfg.model.kind = kind;
    cfg.model.vocab = 0;
    cfg.model.max_len = 256;
    cfg.max_tokens = 8192;
    ShardSource src(cfg, 0, 1);
    std::printf("%s: %s\n", to_string(kind), src.describe().c_str());
    EXPECT_GE(src.epoch_padding_efficiency(), 0.90);
  }
}

}  // namespace
}  // namespace mpiformer
