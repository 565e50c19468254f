// HDF5 checkpoints: a bitwise round trip of a real model's tensors and AdamW
// moments, the run directory's naming, `latest` and pruning, one "PATH:
// fault" error per bad file, and averaging (the mean in float64, rounded
// once; refusals naming the first input at fault).
#include "src/io/checkpoint.h"

#include <gtest/gtest.h>
#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "src/io/atomic_file.h"
#include "src/io/checkpoint_average.h"
#include "src/io/checkpoint_layout.h"
#include "src/io/shard.h"
#include "src/model/model.h"
#include "src/parallel/collective_checkpoint.h"
#include "tests/damaged_file.h"
#include "tests/test_batches.h"

namespace mpiformer {
namespace {

namespace fs = std::filesystem;

// A tiny seq2seq model: encoder, decoder and cross-attention tensors, so the
// names carry every dotted form the model uses.
struct TinyModel {
  std::unique_ptr<Ops> ops = make_cpu_ops(1);
  std::unique_ptr<Model> model;
  std::vector<float> m, v;  // (count), standing in for AdamW's moments

  TinyModel() {
    const ModelConfig c = testing::tiny(ModelKind::kSeq2seq);
    model = std::make_unique<Model>(*ops, c, ModelCapacity{32, c.max_len});
    model->init_parameters(11);
    const size_t n = params().count();
    std::mt19937 rng(5);
    std::normal_distribution<float> normal(0.0f, 1e-3f);
    m.resize(n);
    v.resize(n);
    for (size_t i = 0; i < n; ++i) {
      m[i] = normal(rng);
      v[i] = normal(rng) * normal(rng);
    }
    // Values a float conversion could disturb must survive bit for bit
    // (infinities and NaNs make a checkpoint unreadable on purpose).
    m[0] = -0.0f;
    m[1] = std::numeric_limits<float>::denorm_min();
    m[2] = std::numeric_limits<float>::lowest();
    v[0] = std::numeric_limits<float>::max();
  }
  ParameterSet& params() { return model->parameters(); }
};

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    // The pid keeps concurrent runs (several build trees, ctest -j) apart.
    dir_ = fs::path(::testing::TempDir()) /
           ("mpiformer_checkpoint_test_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string file(const std::string& name) const { return (dir_ / name).string(); }

  // The names in `dir`, sorted.
  static std::vector<std::string> listing(const fs::path& dir) {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

  fs::path dir_;
};

std::string shape_of(const std::vector<int>& shape) {
  std::string text = "(";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + ")";
}

CheckpointState some_state() {
  CheckpointState s;
  s.step = 1234567890123;
  s.world_size = 3;
  s.config_ini = "[model]\nkind = seq2seq\nd-model = 16\n\n[optim]\nlr = 0.003\n";
  s.optimizer_steps = 1234567890000;
  s.next_batch = (uint64_t{1} << 47) + 7;  // wide, within what a reader accepts
  s.epoch = 41;
  s.batches_per_step = 12;
  s.sharding = "file";
  s.seed = ~uint64_t{0} - 5;  // the full 64 bits
  s.loss_scale = 32768.5;
  s.loss_scale_good_steps = 1999;
  s.vocab_size = 300;
  s.special = SpecialTokens{10, 11, 12, 13, 14, 15};
  s.tokenizer = std::string("spm\0bytes\xff", 10);
  return s;
}

// The tensors of `group` must be exactly those of `p` at `base`, bit for bit.
// base: host (p.count())
void expect_same_tensors(const std::vector<CheckpointTensor>& got, const ParameterSet& p,
                         const float* base, const std::string& group) {
  ASSERT_EQ(got.size(), p.info().size()) << group;
  for (const CheckpointTensor& t : got) {
    SCOPED_TRACE(group + "/" + t.name);
    const int i = p.find(t.name);
    ASSERT_GE(i, 0);
    const ParamInfo& info = p.info()[i];
    EXPECT_EQ(t.shape, info.shape);
    ASSERT_EQ(t.data.size(), info.size);
    EXPECT_EQ(std::memcmp(t.data.data(), base + info.offset, info.size * sizeof(float)), 0);
  }
  for (size_t i = 1; i < got.size(); ++i) EXPECT_LT(got[i - 1].name, got[i].name);
}

TEST_F(CheckpointTest, RoundTripIsBitwise) {
  TinyModel t;
  const ParameterSet& p = t.params();
  const std::string path = file("ckpt.h5");
  write_checkpoint(path, p, t.m.data(), t.v.data(), some_state());

  expect_same_tensors(read_checkpoint_tensors(path, "params"), p, p.params(), "params");
  expect_same_tensors(read_checkpoint_tensors(path, "optimizer/m"), p, t.m.data(), "optimizer/m");
  expect_same_tensors(read_checkpoint_tensors(path, "/optimizer/v"), p, t.v.data(), "optimizer/v");
  bool dotted = false;
  for (const ParamInfo& info : p.info()) dotted |= info.name.find('.') != std::string::npos;
  EXPECT_TRUE(dotted) << "the model's names should exercise dots in dataset names";

  const CheckpointState s = read_checkpoint_state(path);
  EXPECT_EQ(s.step, some_state().step);
  EXPECT_EQ(s.world_size, 3);
  EXPECT_EQ(s.config_ini, some_state().config_ini);
  const CheckpointState w = some_state();
  EXPECT_EQ(s.optimizer_steps, w.optimizer_steps);
  EXPECT_EQ(s.next_batch, w.next_batch);
  EXPECT_EQ(s.epoch, w.epoch);
  EXPECT_EQ(s.batches_per_step, w.batches_per_step);
  EXPECT_EQ(s.sharding, w.sharding);
  EXPECT_EQ(s.seed, w.seed);
  EXPECT_EQ(s.loss_scale, w.loss_scale);
  EXPECT_EQ(s.loss_scale_good_steps, w.loss_scale_good_steps);
  EXPECT_EQ(s.vocab_size, w.vocab_size);
  EXPECT_EQ(s.special, w.special);
  EXPECT_EQ(s.tokenizer, w.tokenizer);
  EXPECT_EQ(s.run_id, "");  // none given, none written: a file of an earlier version
  EXPECT_TRUE(is_checkpoint(path));
  EXPECT_EQ(listing(dir_), std::vector<std::string>{"ckpt.h5"});  // no .tmp left
}

TEST_F(CheckpointTest, RecordsTheRunId) {
  TinyModel t;
  const std::string path = file("ckpt.h5");
  CheckpointState s = some_state();
  s.run_id = "0123456789abcdef";
  write_checkpoint(path, t.params(), t.m.data(), t.v.data(), s);
  EXPECT_EQ(read_checkpoint_state(path).run_id, "0123456789abcdef");
}

TEST_F(CheckpointTest, StoresFloat32UnderDottedNamesWithRootAttributes) {
  TinyModel t;
  const std::string path = file("ckpt.h5");
  write_checkpoint(path, t.params(), t.m.data(), t.v.data(), some_state());
  const ParamInfo& first = t.params().info().front();

  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  const std::string name = "/optimizer/v/" + first.name;
  hid_t d = H5Dopen2(f, name.c_str(), H5P_DEFAULT);
  ASSERT_GE(d, 0) << name;
  hid_t type = H5Dget_type(d);
  EXPECT_EQ(H5Tequal(type, H5T_IEEE_F32LE), 1);
  hid_t space = H5Dget_space(d);
  EXPECT_EQ(H5Sget_simple_extent_ndims(space), static_cast<int>(first.shape.size()));
  for (const char* attr : {"format", "version", "step", "world_size", "config"}) {
    EXPECT_GT(H5Aexists(f, attr), 0) << attr;
  }
  int64_t step = 0;
  hid_t a = H5Aopen(f, "step", H5P_DEFAULT);
  H5Aread(a, H5T_NATIVE_INT64, &step);
  EXPECT_EQ(step, some_state().step);
  H5Aclose(a);
  H5Sclose(space);
  H5Tclose(type);
  H5Dclose(d);
  H5Fclose(f);
}

TEST_F(CheckpointTest, ConfigLargerThanACompactAttribute) {
  TinyModel t;
  CheckpointState s = some_state();
  std::ostringstream ini;
  for (int i = 0; i < 8000; ++i) ini << "key-" << i << " = value " << i << "\n";
  s.config_ini = ini.str();
  ASSERT_GT(s.config_ini.size(), 64u * 1024u);
  const std::string path = file("big.h5");
  write_checkpoint(path, t.params(), t.m.data(), t.v.data(), s);
  EXPECT_EQ(read_checkpoint_state(path).config_ini, s.config_ini);
}

TEST_F(CheckpointTest, OverwritesAnExistingCheckpoint) {
  TinyModel t;
  const std::string path = file("ckpt.h5");
  CheckpointState s = some_state();
  write_checkpoint(path, t.params(), t.m.data(), t.v.data(), s);
  s.step = 9;
  s.optimizer_steps = s.step;
  write_checkpoint(path, t.params(), t.v.data(), t.m.data(), s);
  EXPECT_EQ(read_checkpoint_state(path).step, 9);
  expect_same_tensors(read_checkpoint_tensors(path, "optimizer/m"), t.params(), t.v.data(),
                      "optimizer/m");
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST_F(CheckpointTest, SaveNamesPointsLatestAndPrunes) {
  TinyModel t;
  const fs::path rundir = dir_ / "run";  // created by save_checkpoint
  const fs::path ckpts = rundir / "checkpoints";
  CheckpointState s = some_state();
  for (int64_t step : {5, 10, 15, 20}) {
    s.step = step;
    s.optimizer_steps = s.step;
    const std::string written =
        save_checkpoint(rundir.string(), t.params(), t.m.data(), t.v.data(), s, 2);
    char name[32];
    std::snprintf(name, sizeof name, "step_%08lld.h5", static_cast<long long>(step));
    EXPECT_EQ(written, (ckpts / name).string());
    EXPECT_EQ(read_text(ckpts / "latest"), std::string(name) + "\n");
    EXPECT_EQ(read_checkpoint_state(written).step, step);
  }
  EXPECT_EQ(listing(ckpts),
            (std::vector<std::string>{"latest", "step_00000015.h5", "step_00000020.h5"}));

  // keep_last <= 0 keeps everything.
  for (int64_t step : {25, 30}) {
    s.step = step;
    s.optimizer_steps = s.step;
    save_checkpoint(rundir.string(), t.params(), t.m.data(), t.v.data(), s, 0);
  }
  EXPECT_EQ(listing(ckpts).size(), 5u);

  // Past 8 digits names grow; pruning goes by number, not by name.
  s.step = 123456789;
  s.optimizer_steps = s.step;
  save_checkpoint(rundir.string(), t.params(), t.m.data(), t.v.data(), s, 2);
  EXPECT_EQ(listing(ckpts),
            (std::vector<std::string>{"latest", "step_00000030.h5", "step_123456789.h5"}));
  EXPECT_EQ(read_text(ckpts / "latest"), "step_123456789.h5\n");
}

TEST_F(CheckpointTest, PruningNeverRemovesTheFileJustWritten) {
  TinyModel t;
  const fs::path ckpts = dir_ / "checkpoints";
  CheckpointState s = some_state();
  for (int64_t step : {100, 200}) {
    s.step = step;
    s.optimizer_steps = s.step;
    save_checkpoint(dir_.string(), t.params(), t.m.data(), t.v.data(), s, 0);
  }
  // A run restarted from an earlier point writes a lower step number.
  s.step = 50;
  s.optimizer_steps = s.step;
  save_checkpoint(dir_.string(), t.params(), t.m.data(), t.v.data(), s, 1);
  EXPECT_EQ(listing(ckpts), (std::vector<std::string>{"latest", "step_00000050.h5"}));
}

// Asserts that `f` throws a runtime_error whose message starts with
// "PATH: " and contains `words`.
template <class F>
void expect_fault(F f, const std::string& path, const std::string& words) {
  try {
    f();
    FAIL() << "no error for " << path;
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind(path + ": ", 0), 0u) << what;
    EXPECT_NE(what.find(words), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
}

TEST_F(CheckpointTest, FaultsNameTheFile) {
  const std::string absent = file("absent.h5");
  expect_fault([&] { read_checkpoint_state(absent); }, absent, "no such file");
  expect_fault([&] { read_checkpoint_tensors(absent, "params"); }, absent, "no such file");
  EXPECT_FALSE(is_checkpoint(absent));

  const std::string text = file("text.h5");
  std::ofstream(text) << "not hdf5\n";
  expect_fault([&] { read_checkpoint_state(text); }, text, "not an HDF5 file");
  EXPECT_FALSE(is_checkpoint(text));

  // A valid HDF5 file of another kind: a token shard.
  const std::string shard_path = file("shard.h5");
  Shard shard;
  shard.header.vocab_size = 16;
  const int32_t ids[] = {7, 8, 9};
  shard.target.append(ids, 3);
  write_shard(shard_path, shard);
  expect_fault([&] { read_checkpoint_tensors(shard_path, "params"); }, shard_path,
               "not an mpiformer checkpoint (format is 'mpiformer-shard')");
  EXPECT_FALSE(is_checkpoint(shard_path));

  // An HDF5 file with no attributes at all.
  const std::string bare = file("bare.h5");
  H5Fclose(H5Fcreate(bare.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
  expect_fault([&] { read_checkpoint_state(bare); }, bare,
               "not an mpiformer checkpoint (no 'format' attribute)");

  // A checkpoint lacking a group.
  TinyModel t;
  const std::string ckpt = file("ckpt.h5");
  write_checkpoint(ckpt, t.params(), t.m.data(), t.v.data(), some_state());
  expect_fault([&] { read_checkpoint_tensors(ckpt, "optimizer/w"); }, ckpt,
               "missing group /optimizer/w");
  expect_fault([&] { read_checkpoint_tensors(ckpt, "nothing/here"); }, ckpt,
               "missing group /nothing/here");

  // Cut short, as by an interrupted copy.
  const std::string cut = file("cut.h5");
  fs::copy_file(ckpt, cut);
  fs::resize_file(cut, fs::file_size(cut) / 2);
  expect_fault([&] { read_checkpoint_state(cut); }, cut, "truncated or corrupt");

  // Attributes that cannot be read (their heap's checksum is wrong) are a
  // damaged file, not a missing 'format' attribute.
  const std::string scrambled = file("scrambled.h5");
  fs::copy_file(ckpt, scrambled);
  ASSERT_GT(damage_blocks(scrambled, "FRHP", 16), 0) << "the root attributes are not in a heap";
  expect_fault([&] { read_checkpoint_state(scrambled); }, scrambled,
               "truncated or corrupt (HDF5 could not read attribute 'format'");
  EXPECT_FALSE(is_checkpoint(scrambled));
}

TEST_F(CheckpointTest, ChecksumCatchesAFlippedBit) {
  TinyModel t;
  // A run of a value found nowhere else, to locate m's data in the file.
  const float marker = 1234.5678f;
  std::fill(t.m.begin() + 8, t.m.begin() + 16, marker);
  const std::string path = file("ckpt.h5");
  write_checkpoint(path, t.params(), t.m.data(), t.v.data(), some_state());

  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  std::string run;
  for (int i = 0; i < 8; ++i) run.append(reinterpret_cast<const char*>(&marker), sizeof marker);
  const size_t at = bytes.find(run);
  ASSERT_NE(at, std::string::npos);
  bytes[at + 13] ^= 0x01;
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;

  EXPECT_EQ(read_checkpoint_tensors(path, "params").size(), t.params().info().size());
  expect_fault([&] { read_checkpoint_tensors(path, "optimizer/m"); }, path, "Fletcher32 checksum");
}

TEST_F(CheckpointTest, FailedWriteLeavesNothing) {
  TinyModel t;
  // The parent directory does not exist: HDF5 cannot create the file.
  const std::string path = file("no/such/dir/ckpt.h5");
  expect_fault([&] { write_checkpoint(path, t.params(), t.m.data(), t.v.data(), some_state()); },
               path, "cannot write the file");
  expect_fault([&] { write_checkpoint(file("x.h5"), t.params(), nullptr, t.v.data(), {}); },
               file("x.h5"), "optimizer moments are missing");
  CheckpointState bad = some_state();
  bad.world_size = 0;
  expect_fault([&] { write_checkpoint(file("x.h5"), t.params(), t.m.data(), t.v.data(), bad); },
               file("x.h5"), "world size 0");
  EXPECT_TRUE(listing(dir_).empty());

  // Fails only at the rename (a non-empty directory is in the way), after
  // the whole file was written: the temporary file goes too.
  const std::string blocked = file("blocked.h5");
  fs::create_directories(fs::path(blocked) / "inside");
  expect_fault([&] { write_checkpoint(blocked, t.params(), t.m.data(), t.v.data(), {}); }, blocked,
               "cannot rename");
  EXPECT_EQ(listing(dir_), std::vector<std::string>{"blocked.h5"});
}

// The space a collective writer sets aside must hold the whole file: a
// small and a large model (tensors of several chunks), with long strings.
TEST_F(CheckpointTest, TheBoundHoldsTheFile) {
  ModelConfig large = testing::tiny(ModelKind::kLm);
  large.d_model = 256;
  large.vocab = 5000;  // the embedding: 1.28M elements, two chunks
  for (const ModelConfig& c : {testing::tiny(ModelKind::kSeq2seq), large}) {
    std::unique_ptr<Ops> ops = make_cpu_ops(1);
    Model model(*ops, c, ModelCapacity{32, c.max_len});
    model.init_parameters(3);
    ParameterSet& params = model.parameters();
    const std::vector<float> moments(params.count(), 0.5f);
    CheckpointState s = some_state();
    s.config_ini.assign(100000, 'x');
    s.label_names.assign(10000, "a label name");  // several chunks
    const std::string path = file("bound.h5");
    write_checkpoint(path, params, moments.data(), moments.data(), s);
    const uint64_t size = fs::file_size(path), data = 3 * params.count() * sizeof(float);
    SCOPED_TRACE("d_model " + std::to_string(c.d_model));
    EXPECT_GE(checkpoint_file_bound(params, s), size);
    // Not wildly above it either, or a disk that would hold the file refuses it.
    EXPECT_LE(checkpoint_file_bound(params, s), 2 * size + (256u << 10));
    EXPECT_GT(size, data);
  }
}

// A link planted where the temporary goes (a shared directory) is replaced,
// never written through.
TEST_F(CheckpointTest, ALinkAtTheTemporaryIsNotFollowed) {
  TinyModel t;
  const std::string victim = file("victim.txt"), path = file("ckpt.h5");
  std::ofstream(victim) << "keep me\n";
  fs::create_symlink(victim, temporary_name(path));
  write_checkpoint(path, t.params(), t.m.data(), t.v.data(), some_state());
  EXPECT_EQ(read_text(victim), "keep me\n");
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(path)));
  EXPECT_EQ(listing(dir_), (std::vector<std::string>{"ckpt.h5", "victim.txt"}));
}

TEST_F(CheckpointTest, ReadCheckpointRestoresEveryTensorIntoTheParameterLayout) {
  TinyModel t;
  const ParameterSet& p = t.params();
  const std::string path = file("ckpt.h5");
  write_checkpoint(path, p, t.m.data(), t.v.data(), some_state());
  const LoadedCheckpoint c = read_checkpoint(path);
  EXPECT_EQ(c.path, path);
  EXPECT_EQ(c.state.seed, some_state().seed);
  const std::pair<const std::vector<CheckpointTensor>*, const float*> groups[] = {
      {&c.params, p.params()}, {&c.m, t.m.data()}, {&c.v, t.v.data()}};
  for (const auto& [tensors, expected] : groups) {
    std::vector<float> restored(p.count(), 42.0f);  // (count)
    unpack_checkpoint_tensors(path, *tensors, p, restored.data());
    EXPECT_EQ(std::memcmp(restored.data(), expected, p.count() * sizeof(float)), 0);
  }
}

TEST_F(CheckpointTest, UnpackNamesTheFirstTensorOfAnotherShape) {
  TinyModel t;
  const std::string path = file("ckpt.h5");
  write_checkpoint(path, t.params(), t.m.data(), t.v.data(), some_state());
  std::vector<CheckpointTensor> tensors = read_checkpoint_tensors(path, "params");
  std::vector<float> dest(t.params().count());  // (count)
  const auto message = [&](const std::vector<CheckpointTensor>& ts) {
    try {
      unpack_checkpoint_tensors(path, ts, t.params(), dest.data());
    } catch (const CheckpointMismatch& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  std::vector<CheckpointTensor> reshaped = tensors;
  reshaped[0].shape.push_back(1);
  EXPECT_EQ(message(reshaped), path + ": tensor '" + tensors[0].name + "' has shape " +
                                   shape_of(reshaped[0].shape) + "; these flags build " +
                                   shape_of(tensors[0].shape));
  std::vector<CheckpointTensor> missing(tensors.begin() + 1, tensors.end());
  EXPECT_NE(message(missing).find("has no tensor '" + tensors[0].name + "'"), std::string::npos);
  std::vector<CheckpointTensor> extra = tensors;
  extra.push_back(CheckpointTensor{"zzz.extra", {2}, {1.0f, 2.0f}});
  EXPECT_NE(message(extra).find("holds tensor 'zzz.extra', which these flags do not build"),
            std::string::npos);
}

TEST_F(CheckpointTest, ListsCompleteCheckpointsNewestFirst) {
  TinyModel t;
  CheckpointState s = some_state();
  for (int64_t step : {9, 100, 10}) {
    s.step = step;
    s.optimizer_steps = s.step;
    save_checkpoint(dir_.string(), t.params(), t.m.data(), t.v.data(), s, 0);
  }
  // What a killed writer leaves, and strangers: never listed.
  std::ofstream(dir_ / "checkpoints" / "step_00000200.h5.tmp") << "half";
  std::ofstream(dir_ / "checkpoints" / "step_x.h5") << "x";
  const fs::path d = dir_ / "checkpoints";
  EXPECT_EQ(list_checkpoints(dir_.string()),
            (std::vector<std::string>{(d / "step_00000100.h5").string(),
                                      (d / "step_00000010.h5").string(),
                                      (d / "step_00000009.h5").string()}));
  EXPECT_TRUE(list_checkpoints(file("nowhere")).empty());
}
// Overwrites a root attribute of an existing checkpoint, as a hand edit would.
template <class T>
void set_attribute(const std::string& path, const char* name, hid_t mem_type, T value) {
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  hid_t a = H5Aopen(f, name, H5P_DEFAULT);
  ASSERT_GE(a, 0) << name;
  EXPECT_GE(H5Awrite(a, mem_type, &value), 0);
  H5Aclose(a);
  H5Fclose(f);
}

TEST_F(CheckpointTest, ResumeAttributesNoRunWritesAreRefused) {
  TinyModel t;
  const std::string path = file("edited.h5");
  CheckpointState s = some_state();
  s.step = 40;
  s.optimizer_steps = 38;
  s.next_batch = 160;
  s.epoch = 2;
  s.loss_scale = 1024.0;
  write_checkpoint(path, t.params(), t.m.data(), t.v.data(), s);
  ASSERT_EQ(read_checkpoint_state(path).optimizer_steps, 38);

  set_attribute(path, "optimizer_steps", H5T_NATIVE_INT64, int64_t{-1});
  expect_fault([&] { read_checkpoint_state(path); }, path,
               "attribute 'optimizer_steps' = -1; expected 0 to the step (40)");
  set_attribute(path, "optimizer_steps", H5T_NATIVE_INT64, int64_t{41});
  expect_fault([&] { read_checkpoint(path); }, path, "attribute 'optimizer_steps' = 41");
  set_attribute(path, "optimizer_steps", H5T_NATIVE_INT64, int64_t{38});

  set_attribute(path, "data_next_batch", H5T_NATIVE_UINT64, uint64_t{1} << 60);
  expect_fault([&] { read_checkpoint_state(path); }, path,
               "attribute 'data_next_batch' = 1152921504606846976; expected at most 2^48");
  set_attribute(path, "data_next_batch", H5T_NATIVE_UINT64, uint64_t{160});

  for (double scale : {std::nan(""), 0.5, 1e30, -1.0}) {
    set_attribute(path, "loss_scale", H5T_NATIVE_DOUBLE, scale);
    expect_fault([&] { read_checkpoint_state(path); }, path, "attribute 'loss_scale' = ");
  }
  set_attribute(path, "loss_scale", H5T_NATIVE_DOUBLE, 1.0);
  EXPECT_EQ(read_checkpoint_state(path).loss_scale, 1.0);

  // The writer refuses what the reader would: nothing is written.
  CheckpointState bad = s;
  bad.optimizer_steps = 41;
  const std::string refused = file("refused.h5");
  expect_fault([&] { write_checkpoint(refused, t.params(), t.m.data(), t.v.data(), bad); }, refused,
               "cannot write: attribute 'optimizer_steps' = 41");
  EXPECT_FALSE(fs::exists(refused));
}

TEST_F(CheckpointTest, NonFiniteValuesAreRefusedByReaders) {
  TinyModel t;
  const std::string path = file("nan.h5");
  const ParameterSet& p = t.params();
  const std::string second = p.info()[1].name;
  std::vector<float> v = t.v;
  v[p.info()[1].offset + 1] = INFINITY;
  write_checkpoint(path, p, t.m.data(), v.data(), some_state());
  // The tensors themselves read (inspect shows them); a whole checkpoint does not.
  EXPECT_EQ(read_checkpoint_tensors(path, "optimizer/v").size(), p.info().size());
  expect_fault([&] { read_checkpoint(path); }, path,
               "optimizer/v tensor '" + second + "' holds non-finite values (inf)");
  std::vector<CheckpointTensor> params = read_checkpoint_tensors(path, "params");
  EXPECT_NO_THROW(require_finite(path, params, "params"));
  params.back().data.front() = std::nanf("");
  expect_fault([&] { require_finite(path, params, "params"); }, path,
               "params tensor '" + params.back().name + "' holds non-finite values (nan)");
}

TEST_F(CheckpointTest, LatestNamesACheckpointOfTheDirectory) {
  TinyModel t;
  const fs::path ckpts = dir_ / "checkpoints";
  EXPECT_EQ(latest_checkpoint(dir_.string()), "");
  CheckpointState s = some_state();
  for (int64_t step : {3, 7}) {
    s.step = s.optimizer_steps = step;
    save_checkpoint(dir_.string(), t.params(), t.m.data(), t.v.data(), s, 0);
  }
  EXPECT_EQ(latest_checkpoint(dir_.string()), (ckpts / "step_00000007.h5").string());
  point_latest_at(dir_.string(), (ckpts / "step_00000003.h5").string());
  EXPECT_EQ(read_text(ckpts / "latest"), "step_00000003.h5\n");
  EXPECT_EQ(latest_checkpoint(dir_.string()), (ckpts / "step_00000003.h5").string());
  // A `latest` naming a file that is gone, or not a checkpoint name, is none.
  fs::remove(ckpts / "step_00000003.h5");
  EXPECT_EQ(latest_checkpoint(dir_.string()), "");
  std::ofstream(ckpts / "latest") << "../../etc/passwd\n";
  EXPECT_EQ(latest_checkpoint(dir_.string()), "");

  // read_latest refuses each of these, and a link out of the directory.
  const fs::path latest = ckpts / "latest";
  const auto refused = [&](const std::string& text, const std::string& words) {
    std::ofstream(latest) << text;
    expect_fault([&] { read_latest(dir_.string()); }, latest.string(), words);
  };
  refused("", "is empty");
  refused("step_00000003.h5\n", "names step_00000003.h5, which does not exist");
  refused("../../etc/passwd\n", "names '../../etc/passwd', outside " + ckpts.string());
  refused("notes.txt\n", "names 'notes.txt', which is not a checkpoint file");
  fs::create_directories(dir_ / "elsewhere");
  fs::copy_file(ckpts / "step_00000007.h5", dir_ / "elsewhere" / "step_00000009.h5");
  fs::create_symlink(fs::canonical(dir_ / "elsewhere" / "step_00000009.h5"),
                     ckpts / "step_00000009.h5");
  refused("step_00000009.h5\n", "names step_00000009.h5, a link to ");
  std::ofstream(latest) << "step_00000007.h5\n";
  EXPECT_EQ(read_latest(dir_.string()), (ckpts / "step_00000007.h5").string());
  fs::remove(latest);
  EXPECT_EQ(read_latest(dir_.string()), "");

  EXPECT_EQ(checkpoint_step("a/b/step_00000042.h5"), 42);
  EXPECT_EQ(checkpoint_step("step_123456789.h5"), 123456789);
  for (const char* other : {"step_.h5", "step_12.h5.tmp", "step_1x.h5", "latest", "x_00000001.h5"})
    EXPECT_EQ(checkpoint_step(other), -1) << other;
}

// ---------------------------------------------------------------- averaging

// A state the readers accept, of step `step`.
CheckpointState state_of_step(int64_t step) {
  CheckpointState s;
  s.step = step;
  s.optimizer_steps = step;
  s.next_batch = static_cast<uint64_t>(step);
  s.config_ini = "model = seq2seq\n";
  s.vocab_size = 24;
  s.tokenizer = "spm";
  s.run_id = "00000000000000" + std::to_string(step);
  return s;
}

TEST_F(CheckpointTest, AverageIsTheMeanInDoubleRoundedOnce) {
  TinyModel older, newer;
  float* a = older.params().params();
  float* b = newer.params().params();
  // Other weights, and other moments to tell whose are kept.
  std::mt19937 rng(7);
  std::normal_distribution<float> step(0.0f, 0.05f);
  for (size_t i = 0; i < newer.params().count(); ++i) b[i] += step(rng);
  for (float& x : newer.m) x *= 0.5f;
  // Where the order and width of the sum show: 1 + 2^-24 rounds to 1 (to
  // even); a float sum of 3e38 twice would overflow.
  a[0] = 1.0f;
  b[0] = std::nextafter(1.0f, 2.0f);
  a[1] = b[1] = 3e38f;
  a[2] = 0.1f;
  b[2] = 0.2f;
  const std::string older_path = file("older.h5"), newer_path = file("newer.h5");
  write_checkpoint(older_path, older.params(), older.m.data(), older.v.data(), state_of_step(10));
  write_checkpoint(newer_path, newer.params(), newer.m.data(), newer.v.data(), state_of_step(20));

  const std::string out = file("average.h5");
  // The older first: the sum runs in the order given; the newest sets the rest.
  const CheckpointAverage written = average_checkpoints({older_path, newer_path}, out, nullptr);
  EXPECT_EQ(written.newest, newer_path);
  EXPECT_EQ(written.step, 20);
  EXPECT_EQ(written.steps, (std::vector<int64_t>{10, 20}));
  EXPECT_EQ(written.parameters, older.params().count());

  const size_t n = older.params().count();
  std::vector<float> mean(n);  // (count), laid out like the parameter buffer
  for (size_t i = 0; i < n; ++i) {
    mean[i] = static_cast<float>((static_cast<double>(a[i]) + static_cast<double>(b[i])) / 2.0);
  }
  EXPECT_EQ(mean[0], 1.0f);
  EXPECT_EQ(mean[1], 3e38f);
  EXPECT_EQ(mean[2], static_cast<float>((double{0.1f} + double{0.2f}) / 2));
  expect_same_tensors(read_checkpoint_tensors(out, "params"), older.params(), mean.data(),
                      "params");
  expect_same_tensors(read_checkpoint_tensors(out, "optimizer/m"), newer.params(), newer.m.data(),
                      "optimizer/m");
  expect_same_tensors(read_checkpoint_tensors(out, "optimizer/v"), newer.params(), newer.v.data(),
                      "optimizer/v");
  const CheckpointState s = read_checkpoint_state(out);
  EXPECT_EQ(s.step, 20);
  EXPECT_EQ(s.run_id, state_of_step(20).run_id);
  EXPECT_EQ(s.tokenizer, "spm");
  EXPECT_EQ(s.averaged_from, older_path + "\n" + newer_path);
  // The whole file reads as a checkpoint: resume's reader accepts it.
  EXPECT_EQ(read_checkpoint(out).params.size(), older.params().info().size());
  EXPECT_EQ(read_checkpoint_state(newer_path).averaged_from, "");
  EXPECT_EQ(listing(dir_), (std::vector<std::string>{"average.h5", "newer.h5", "older.h5"}));
}

TEST_F(CheckpointTest, AverageRefusesOtherModelsAndDamagedInputsNamingThem) {
  TinyModel t;
  const std::string a = file("a.h5"), b = file("b.h5"), out = file("average.h5");
  write_checkpoint(a, t.params(), t.m.data(), t.v.data(), state_of_step(4));
  std::ofstream(out) << "an earlier average\n";
  const auto refused = [&](const std::vector<std::string>& inputs, const ModelDifference& differ,
                           const std::string& path, const std::string& words) {
    try {
      average_checkpoints(inputs, out, differ);
      ADD_FAILURE() << "no refusal: " << words;
    } catch (const AverageInputError& e) {
      const std::string what = e.what();
      EXPECT_EQ(what.rfind(path + ": ", 0), 0u) << what;
      EXPECT_NE(what.find(words), std::string::npos) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    }
    EXPECT_EQ(read_text(out), "an earlier average\n");  // left as it was, no temporary beside it
    EXPECT_FALSE(fs::exists(temporary_name(out)));
  };

  // Another shape: the first tensor that differs, from the newest's side.
  ModelConfig wider = testing::tiny(ModelKind::kSeq2seq);
  wider.d_ff = 48;
  auto ops = make_cpu_ops(1);
  Model other(*ops, wider, ModelCapacity{32, wider.max_len});
  other.init_parameters(3);
  std::vector<float> zeros(other.parameters().count(), 0.0f);
  write_checkpoint(b, other.parameters(), zeros.data(), zeros.data(), state_of_step(2));
  refused({a, b}, nullptr, b,
          "another model than " + a +
              ", the newest input: tensor 'decoder.layers.0.mlp.fc.bias' "
              "of shape (48) (not (32))");

  // The flags come first, as the caller reads them.
  const ModelDifference by_config = [](const std::string&, const std::string& mine,
                                       const std::string&, const std::string& newest) {
    return mine == newest ? std::string() : "--norm post (not pre)";
  };
  CheckpointState post = state_of_step(2);
  post.config_ini = "norm = post\n";
  write_checkpoint(b, t.params(), t.m.data(), t.v.data(), post);
  refused({b, a}, by_config, b, "the newest input: --norm post (not pre)");

  CheckpointState other_vocabulary = state_of_step(2);
  other_vocabulary.tokenizer = "another spm";
  write_checkpoint(b, t.params(), t.m.data(), t.v.data(), other_vocabulary);
  refused({a, b}, by_config, b, "another tokenizer");

  refused({a, file("absent.h5")}, nullptr, file("absent.h5"), "no such file");

  // A non-finite weight is found while streaming; nothing is left behind.
  t.params().params()[5] = std::numeric_limits<float>::quiet_NaN();
  write_checkpoint(b, t.params(), t.m.data(), t.v.data(), state_of_step(2));
  refused({a, b}, nullptr, b, "params tensor");
}

}  // namespace
}  // namespace mpiformer
