// Command-line parsing: defaults, overrides, --config with the command line
// winning, the config.ini round trip, and one usage error per bad value.
#include "src/app/options.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda_architectures.h"
#include "src/app/arch_presets.h"
#include "src/app/shared_options.h"
#include "src/core/error.h"

namespace mpiformer {
namespace {

using Args = std::vector<std::string>;

// The smallest valid train command line.
Args base_args() {
  return {"--model", "seq2seq", "--synthetic", "reverse", "--out", "runs/t"};
}

Args with(Args args, const Args& extra) {
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

TrainConfig parse_train(const Args& args) {
  TrainConfig cfg;
  std::ostringstream out;
  EXPECT_TRUE(parse_train_options(args, &cfg, out));
  return cfg;
}

// The message of the UsageError that parsing `args` throws ("" if none).
std::string train_error(const Args& args) {
  TrainConfig cfg;
  std::ostringstream out;
  try {
    parse_train_options(args, &cfg, out);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

std::string prepare_error(const Args& args) {
  PrepareConfig cfg;
  std::ostringstream out;
  try {
    parse_prepare_options(args, &cfg, out);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

PrepareConfig parse_prepare(const Args& args) {
  PrepareConfig cfg;
  std::ostringstream out;
  EXPECT_TRUE(parse_prepare_options(args, &cfg, out));
  return cfg;
}

std::string bench_error(const Args& args) {
  BenchConfig cfg;
  std::ostringstream out;
  try {
    parse_bench_options(args, &cfg, out);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

// A file in the test's temporary directory, removed with the fixture.
class TempFile {
 public:
  struct Directory {};
  TempFile(const std::string& name, Directory)
      : path_(std::filesystem::temp_directory_path() /
              ("mpiformer_options_test_" + std::to_string(::getpid()) + "_" + name)) {
    std::filesystem::create_directories(path_);
  }
  TempFile(const std::string& name, const std::string& text)
      : path_(std::filesystem::temp_directory_path() /
              ("mpiformer_options_test_" + std::to_string(::getpid()) + "_" + name)) {
    std::ofstream(path_) << text;
  }
  ~TempFile() { std::filesystem::remove_all(path_); }
  std::string path() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

// Label smoothing defaults by model: a language model's loss is then its
// true negative log-likelihood; a given value is kept whatever the model.
TEST(TrainOptions, LabelSmoothingDefaultsByModel) {
  for (const char* model : {"lm", "mlm"}) {
    EXPECT_EQ(parse_train({"--model", model, "--synthetic", "copy", "--out", "r"}).label_smoothing,
              0.0f)
        << model;
    EXPECT_EQ(parse_train({"--model", model, "--synthetic", "copy", "--out", "r",
                           "--label-smoothing", "0.2"})
                  .label_smoothing,
              0.2f)
        << model;
  }
  EXPECT_EQ(parse_train({"--model", "seq2seq", "--synthetic", "reverse", "--out", "r",
                         "--label-smoothing", "0"})
                .label_smoothing,
            0.0f);
}

TEST(TrainOptions, DefaultsComeFromTrainConfig) {
  const TrainConfig cfg = parse_train(base_args());
  const TrainConfig def;
  EXPECT_EQ(cfg.model.kind, ModelKind::kSeq2seq);
  EXPECT_EQ(cfg.synthetic, SyntheticTask::kReverse);
  EXPECT_EQ(cfg.out_dir, "runs/t");
  EXPECT_EQ(cfg.model.d_model, def.model.d_model);
  EXPECT_EQ(cfg.model.heads, def.model.heads);
  EXPECT_EQ(cfg.model.enc_layers, def.model.enc_layers);
  EXPECT_EQ(cfg.model.dec_layers, def.model.dec_layers);
  EXPECT_EQ(cfg.model.vocab, def.model.vocab);
  EXPECT_EQ(cfg.model.max_len, def.model.max_len);
  EXPECT_EQ(cfg.model.pre_norm, def.model.pre_norm);
  EXPECT_EQ(cfg.model.tied_embeddings, def.model.tied_embeddings);
  EXPECT_EQ(cfg.optim.lr, def.optim.lr);
  EXPECT_EQ(cfg.optim.eps, def.optim.eps);
  EXPECT_EQ(cfg.optim.schedule, def.optim.schedule);
  EXPECT_EQ(cfg.optim.decay_all, def.optim.decay_all);
  EXPECT_EQ(cfg.label_smoothing, 0.1f);  // seq2seq's default, as in the Transformer paper
  EXPECT_EQ(cfg.max_tokens, def.max_tokens);
  EXPECT_TRUE(cfg.buckets.empty());
  EXPECT_EQ(cfg.too_long, TooLong::kAuto);
  EXPECT_EQ(cfg.sharding, Sharding::kData);
  EXPECT_EQ(cfg.prefetch, def.prefetch);
  EXPECT_EQ(cfg.steps, def.steps);
  EXPECT_EQ(cfg.seed, def.seed);
  EXPECT_EQ(cfg.resume, "none");
  // --device auto, settled: cuda only where the runtime sees a GPU.
  EXPECT_EQ(cfg.device, cuda_device_count() > 0 ? DeviceKind::kCuda : DeviceKind::kCpu);
  EXPECT_EQ(cfg.device_choice.rfind("auto: ", 0), 0u) << cfg.device_choice;
  EXPECT_EQ(cfg.precision, Precision::kFp32);
  EXPECT_FALSE(cfg.tf32);
  EXPECT_EQ(cfg.loss_scale, def.loss_scale);
  EXPECT_EQ(cfg.loss_scale_window, def.loss_scale_window);
  EXPECT_TRUE(cfg.config_file.empty());
}

TEST(TrainOptions, OverridesEveryKindOfValue) {
  const TrainConfig cfg = parse_train(with(base_args(), {"--enc-layers",
                                                         "3",
                                                         "--dec-layers",
                                                         "5",
                                                         "--d-model",
                                                         "96",
                                                         "--heads",
                                                         "6",
                                                         "--d-ff",
                                                         "200",
                                                         "--max-len",
                                                         "40",
                                                         "--vocab",
                                                         "50",
                                                         "--dropout",
                                                         "0.25",
                                                         "--norm",
                                                         "post",
                                                         "--positions",
                                                         "sinusoidal",
                                                         "--tied-embeddings",
                                                         "false",
                                                         "--activation",
                                                         "relu",
                                                         "--attention-scale",
                                                         "log-length",
                                                         "--attention-ref-len",
                                                         "128",
                                                         "--label-smoothing=0",
                                                         "--max-tokens",
                                                         "999",
                                                         "--max-sentences",
                                                         "7",
                                                         "--buckets",
                                                         "8, 16,40",
                                                         "--too-long",
                                                         "skip",
                                                         "--sharding",
                                                         "file",
                                                         "--prefetch",
                                                         "2",
                                                         "--min-len",
                                                         "2",
                                                         "--mlm-probability",
                                                         "0.2",
                                                         "--accum-steps",
                                                         "4",
                                                         "--steps",
                                                         "12345678901",
                                                         "--lr",
                                                         "3e-4",
                                                         "--warmup",
                                                         "50",
                                                         "--schedule",
                                                         "cosine",
                                                         "--end-lr",
                                                         "1e-5",
                                                         "--poly-power",
                                                         "2",
                                                         "--beta1",
                                                         "0.8",
                                                         "--beta2",
                                                         "0.95",
                                                         "--adam-eps",
                                                         "1e-8",
                                                         "--weight-decay",
                                                         "0.1",
                                                         "--decay-all",
                                                         "--clip-norm",
                                                         "0",
                                                         "--seed",
                                                         "18446744073709551615",
                                                         "--threads",
                                                         "3",
                                                         "--log-every",
                                                         "5",
                                                         "--eval-every",
                                                         "100",
                                                         "--eval-batches",
                                                         "2",
                                                         "--checkpoint-every",
                                                         "1000"}));
  EXPECT_EQ(cfg.model.enc_layers, 3);
  EXPECT_EQ(cfg.model.dec_layers, 5);
  EXPECT_EQ(cfg.model.d_model, 96);
  EXPECT_EQ(cfg.model.heads, 6);
  EXPECT_EQ(cfg.model.d_ff, 200);
  EXPECT_EQ(cfg.model.max_len, 40);
  EXPECT_EQ(cfg.model.vocab, 50);
  EXPECT_FLOAT_EQ(cfg.model.dropout, 0.25f);
  EXPECT_FALSE(cfg.model.pre_norm);
  EXPECT_EQ(cfg.model.positions, PositionKind::kSinusoidal);
  EXPECT_FALSE(cfg.model.tied_embeddings);
  EXPECT_EQ(cfg.model.activation, Activation::kRelu);
  EXPECT_EQ(cfg.model.attention_scale, AttentionScale::kLogLength);
  EXPECT_FLOAT_EQ(cfg.model.attention_ref_len, 128.0f);
  EXPECT_EQ(cfg.label_smoothing, 0.0f);
  EXPECT_EQ(cfg.max_tokens, 999);
  EXPECT_EQ(cfg.max_sentences, 7);
  EXPECT_EQ(cfg.buckets, (std::vector<int>{8, 16, 40}));
  EXPECT_EQ(cfg.too_long, TooLong::kSkip);
  EXPECT_EQ(cfg.sharding, Sharding::kFile);
  EXPECT_EQ(cfg.prefetch, 2);
  EXPECT_EQ(cfg.min_len, 2);
  EXPECT_FLOAT_EQ(cfg.mlm_probability, 0.2f);
  EXPECT_EQ(cfg.accum_steps, 4);
  EXPECT_EQ(cfg.steps, 12345678901LL);
  EXPECT_FLOAT_EQ(cfg.optim.lr, 3e-4f);
  EXPECT_EQ(cfg.optim.warmup, 50);
  EXPECT_EQ(cfg.optim.schedule, ScheduleKind::kCosine);
  EXPECT_FLOAT_EQ(cfg.optim.end_lr, 1e-5f);
  EXPECT_FLOAT_EQ(cfg.optim.poly_power, 2.0f);
  EXPECT_FLOAT_EQ(cfg.optim.beta1, 0.8f);
  EXPECT_FLOAT_EQ(cfg.optim.beta2, 0.95f);
  EXPECT_FLOAT_EQ(cfg.optim.eps, 1e-8f);
  EXPECT_FLOAT_EQ(cfg.optim.weight_decay, 0.1f);
  EXPECT_TRUE(cfg.optim.decay_all);
  EXPECT_EQ(cfg.optim.clip_norm, 0.0f);
  EXPECT_EQ(cfg.seed, 18446744073709551615ull);
  EXPECT_EQ(cfg.threads, 3);
  EXPECT_EQ(cfg.log_every, 5);
  EXPECT_EQ(cfg.eval_every, 100);
  EXPECT_EQ(cfg.eval_batches, 2);
  EXPECT_EQ(cfg.checkpoint_every, 1000);
}

TEST(TrainOptions, DistributionFlags) {
  const TrainConfig defaults = parse_train(base_args());
  EXPECT_EQ(defaults.lr_scaling, LrScaling::kNone);
  EXPECT_TRUE(defaults.overlap);
  EXPECT_EQ(defaults.bucket_mb, 0.0f);  // by transport
  EXPECT_EQ(defaults.transport, Transport::kAuto);
  EXPECT_TRUE(defaults.deterministic);
  EXPECT_GT(defaults.check_every, 0);
  const TrainConfig cfg =
      parse_train(with(base_args(), {"--lr-scaling", "sqrt", "--lr-reference-tokens", "65536",
                                     "--bucket-mb", "0.5", "--overlap", "off", "--check-every", "0",
                                     "--transport", "mpi", "--deterministic", "false"}));
  EXPECT_EQ(cfg.lr_scaling, LrScaling::kSqrt);
  EXPECT_EQ(cfg.lr_reference_tokens, 65536);
  EXPECT_FLOAT_EQ(cfg.bucket_mb, 0.5f);
  EXPECT_FALSE(cfg.overlap);
  EXPECT_EQ(cfg.check_every, 0);
  EXPECT_EQ(cfg.transport, Transport::kMpi);
  EXPECT_FALSE(cfg.deterministic);
  const std::string ini = train_config_ini(cfg);
  EXPECT_NE(ini.find("lr-scaling = sqrt\n"), std::string::npos) << ini;
  EXPECT_NE(ini.find("overlap = off\n"), std::string::npos) << ini;
  EXPECT_NE(ini.find("transport = mpi\n"), std::string::npos) << ini;
  EXPECT_NE(ini.find("deterministic = false\n"), std::string::npos) << ini;
  TempFile file("distribution.ini", ini);
  EXPECT_EQ(train_config_ini(parse_train({"--config", file.path()})), ini);
  // A scaling rule needs the budget the LR was tuned for.
  EXPECT_EQ(train_error(with(base_args(), {"--lr-scaling", "linear"})),
            "--lr-reference-tokens: required with --lr-scaling linear: the global token budget "
            "per step that --lr was tuned for");
}

TEST(TrainOptions, LayersIsShorthandForBothSeq2seqStacks) {
  TrainConfig cfg = parse_train(with(base_args(), {"--layers", "3"}));
  EXPECT_EQ(cfg.model.layers, 3);
  EXPECT_EQ(cfg.model.enc_layers, 3);
  EXPECT_EQ(cfg.model.dec_layers, 3);

  cfg = parse_train(with(base_args(), {"--layers", "3", "--enc-layers", "1"}));
  EXPECT_EQ(cfg.model.enc_layers, 1);
  EXPECT_EQ(cfg.model.dec_layers, 3);

  // Not a shorthand for other kinds: the seq2seq stacks keep their defaults.
  cfg = parse_train({"--model", "lm", "--synthetic", "copy", "--out", "o", "--layers", "5"});
  EXPECT_EQ(cfg.model.layers, 5);
  EXPECT_EQ(cfg.model.enc_layers, ModelConfig{}.enc_layers);
}

TEST(TrainOptions, NegativeValuesReachTheValidator) {
  // Long-only parsing: "-3" is a value, so the message is about the value.
  EXPECT_EQ(train_error(with(base_args(), {"--layers", "-3"})),
            "--layers: must be positive; got -3");
  EXPECT_EQ(train_error(with(base_args(), {"--d-model=-8"})),
            "--d-model: must be positive; got -8");
}

TEST(TrainOptions, HelpListsFlagsWithDefaults) {
  TrainConfig cfg;
  std::ostringstream out;
  EXPECT_FALSE(parse_train_options({"--help"}, &cfg, out));
  const std::string help = out.str();
  EXPECT_NE(help.find("--d-model D (=64)"), std::string::npos) << help;
  EXPECT_NE(help.find("--schedule"), std::string::npos);
  EXPECT_NE(help.find("inverse-sqrt"), std::string::npos);
  EXPECT_NE(help.find("--lr LR (=0.001)"), std::string::npos) << help;
  EXPECT_NE(help.find("--config"), std::string::npos);
  EXPECT_NE(help.find("--vocab V (=0)"), std::string::npos) << help;
  EXPECT_NE(help.find("--buckets LIST"), std::string::npos) << help;
  EXPECT_NE(help.find("--too-long auto|skip|truncate (=auto)"), std::string::npos) << help;
  EXPECT_NE(help.find("--sharding data|file (=data)"), std::string::npos) << help;
  EXPECT_NE(help.find("--prefetch N (=4)"), std::string::npos) << help;
  // Help needs no other flag and validates nothing.
  EXPECT_FALSE(parse_train_options({"--heads", "3", "--help"}, &cfg, out));
}

TEST(TrainOptions, ConfigFileFillsInAndCommandLineWins) {
  TempFile ini("wins.ini",
               "# a comment\n"
               "d-model = 128\n"
               "heads = 8\n"
               "lr = 0.01\n"
               "decay-all = true\n"
               "synthetic = sort\n");
  const TrainConfig cfg =
      parse_train({"--config", ini.path(), "--model", "lm", "--out", "o", "--d-model", "256"});
  EXPECT_EQ(cfg.model.d_model, 256);  // command line
  EXPECT_EQ(cfg.model.heads, 8);      // file
  EXPECT_FLOAT_EQ(cfg.optim.lr, 0.01f);
  EXPECT_TRUE(cfg.optim.decay_all);
  EXPECT_EQ(cfg.synthetic, SyntheticTask::kSort);
  EXPECT_EQ(cfg.config_file, ini.path());
}

TEST(TrainOptions, ConfigIniRoundTrips) {
  TrainConfig cfg = parse_train(with(base_args(), {"--layers",
                                                   "3",
                                                   "--dec-layers",
                                                   "4",
                                                   "--d-model",
                                                   "48",
                                                   "--heads",
                                                   "3",
                                                   "--dropout",
                                                   "0.1",
                                                   "--lr",
                                                   "0.0007",
                                                   "--adam-eps",
                                                   "1e-9",
                                                   "--beta2",
                                                   "0.997",
                                                   "--norm",
                                                   "post",
                                                   "--tied-embeddings",
                                                   "no",
                                                   "--decay-all",
                                                   "--schedule",
                                                   "polynomial",
                                                   "--seed",
                                                   "123456789012",
                                                   "--label-smoothing",
                                                   "0.05",
                                                   "--attention-ref-len",
                                                   "333.25",
                                                   "--buckets",
                                                   "8,12,64",
                                                   "--too-long",
                                                   "truncate",
                                                   "--sharding",
                                                   "file",
                                                   "--prefetch",
                                                   "7"}));
  const std::string ini = train_config_ini(cfg);
  EXPECT_NE(ini.find("d-model = 48\n"), std::string::npos) << ini;
  EXPECT_NE(ini.find("norm = post\n"), std::string::npos) << ini;
  EXPECT_EQ(ini.find("data ="), std::string::npos) << "unset --data must not be written";
  EXPECT_NE(ini.find("buckets = 8,12,64\n"), std::string::npos) << ini;
  EXPECT_NE(ini.find("vocab = 32\n"), std::string::npos) << "the resolved vocabulary: " << ini;

  TempFile file("roundtrip.ini", ini);
  const TrainConfig back = parse_train({"--config", file.path()});
  EXPECT_EQ(train_config_ini(back), ini);
  EXPECT_EQ(back.model.kind, cfg.model.kind);
  EXPECT_EQ(back.model.layers, 3);
  EXPECT_EQ(back.model.enc_layers, 3);
  EXPECT_EQ(back.model.dec_layers, 4);
  EXPECT_EQ(back.model.dropout, cfg.model.dropout);  // bitwise: shortest round-trip text
  EXPECT_EQ(back.optim.lr, cfg.optim.lr);
  EXPECT_EQ(back.optim.eps, cfg.optim.eps);
  EXPECT_EQ(back.optim.beta2, cfg.optim.beta2);
  EXPECT_EQ(back.model.attention_ref_len, 333.25f);
  EXPECT_FALSE(back.model.pre_norm);
  EXPECT_FALSE(back.model.tied_embeddings);
  EXPECT_TRUE(back.optim.decay_all);
  EXPECT_EQ(back.seed, 123456789012ull);
  EXPECT_EQ(back.out_dir, "runs/t");
  EXPECT_EQ(back.synthetic, SyntheticTask::kReverse);
  EXPECT_EQ(back.buckets, (std::vector<int>{8, 12, 64}));
  EXPECT_EQ(back.too_long, TooLong::kTruncate);
  EXPECT_EQ(back.sharding, Sharding::kFile);
  EXPECT_EQ(back.prefetch, 7);
  EXPECT_EQ(back.model.vocab, 32);
}

// --arch: a preset fills in the flags not given; the effective values and
// the preset's name go to config.ini, which then reproduces the run alone.
TEST(TrainOptions, ArchPresetSetsItsFlags) {
  const TrainConfig base =
      parse_train({"--arch", "transformer-base", "--synthetic", "reverse", "--out", "r"});
  EXPECT_EQ(base.arch, "transformer-base");
  EXPECT_EQ(base.model.kind, ModelKind::kSeq2seq);
  EXPECT_EQ(base.model.enc_layers, 6);  // --layers 6 stands for both stacks
  EXPECT_EQ(base.model.dec_layers, 6);
  EXPECT_EQ(base.model.d_model, 512);
  EXPECT_EQ(base.model.heads, 8);
  EXPECT_EQ(base.model.d_ff, 2048);
  EXPECT_EQ(base.model.max_len, 256);
  EXPECT_EQ(base.model.dropout, 0.1f);
  EXPECT_FALSE(base.model.pre_norm);
  EXPECT_EQ(base.model.positions, PositionKind::kSinusoidal);
  EXPECT_EQ(base.model.activation, Activation::kRelu);
  EXPECT_FALSE(base.model.output_bias);
  EXPECT_EQ(base.label_smoothing, 0.1f);
  EXPECT_EQ(base.optim.schedule, ScheduleKind::kInverseSqrt);
  EXPECT_EQ(base.optim.warmup, 4000);
  EXPECT_EQ(base.optim.lr, 0.0007f);
  EXPECT_EQ(base.optim.beta2, 0.98f);
  EXPECT_EQ(base.optim.eps, 1e-9f);

  const TrainConfig gpt2 =
      parse_train({"--arch", "gpt2-small", "--synthetic", "copy", "--out", "r"});
  EXPECT_EQ(gpt2.model.kind, ModelKind::kLm);
  EXPECT_EQ(gpt2.model.layers, 12);
  EXPECT_EQ(gpt2.model.d_model, 768);
  EXPECT_EQ(gpt2.model.heads, 12);
  EXPECT_EQ(gpt2.model.d_ff, 3072);
  EXPECT_EQ(gpt2.model.max_len, 1024);
  EXPECT_TRUE(gpt2.model.pre_norm);
  EXPECT_FALSE(gpt2.model.output_bias);
  EXPECT_EQ(gpt2.label_smoothing, 0.0f);
  EXPECT_EQ(gpt2.optim.schedule, ScheduleKind::kCosine);
  EXPECT_EQ(gpt2.optim.beta2, 0.95f);
  EXPECT_EQ(gpt2.optim.weight_decay, 0.1f);

  // tiny fits any kind; a seq2seq model gets it in both stacks, and the
  // label smoothing of its kind.
  const TrainConfig tiny =
      parse_train({"--arch", "tiny", "--model", "seq2seq", "--synthetic", "reverse", "--out", "r"});
  EXPECT_EQ(tiny.model.enc_layers, 2);
  EXPECT_EQ(tiny.model.dec_layers, 2);
  EXPECT_EQ(tiny.model.d_model, 128);
  EXPECT_EQ(tiny.model.d_ff, 512);
  EXPECT_EQ(tiny.label_smoothing, 0.1f);
}

TEST(TrainOptions, EveryArchPresetNamesTrainFlagsOnly) {
  TempFile data("arch_data", TempFile::Directory{});
  for (const ArchPreset& preset : arch_presets()) {
    SCOPED_TRACE(preset.name);
    TrainConfig cfg;
    std::ostringstream out;
    // Shards give the vocabulary; none is read while parsing.
    EXPECT_NO_THROW(parse_train_options(
        {"--arch", preset.name, "--data", data.path(), "--out", "r"}, &cfg, out));
    // Every value is set as the table shows it: config.ini records it so.
    const std::string ini = train_config_ini(cfg);
    for (const auto& [flag, value] : preset.flags) {
      const std::string line = "\n" + std::string(flag) + " = " + value + "\n";
      EXPECT_NE(ini.find(line), std::string::npos) << line << ini;
    }
  }
}

TEST(TrainOptions, FlagsGivenWinOverTheArchPreset) {
  const TrainConfig cfg =
      parse_train({"--arch", "gpt2-small", "--synthetic", "copy", "--out", "r", "--d-model", "256",
                   "--heads", "8", "--dropout", "0", "--lr", "0.002"});
  EXPECT_EQ(cfg.model.d_model, 256);
  EXPECT_EQ(cfg.model.heads, 8);
  EXPECT_EQ(cfg.model.dropout, 0.0f);
  EXPECT_EQ(cfg.optim.lr, 0.002f);
  EXPECT_EQ(cfg.model.layers, 12);  // the preset's, where nothing was given
  EXPECT_EQ(cfg.model.d_ff, 3072);

  // A --config file's keys are given too.
  TempFile ini("arch.ini", "arch = transformer-big\nd-ff = 1000\nenc-layers = 3\n");
  const TrainConfig big = parse_train(
      {"--config", ini.path(), "--synthetic", "reverse", "--out", "r", "--dropout", "0.2"});
  EXPECT_EQ(big.arch, "transformer-big");
  EXPECT_EQ(big.model.d_model, 1024);
  EXPECT_EQ(big.model.d_ff, 1000);
  EXPECT_EQ(big.model.enc_layers, 3);
  EXPECT_EQ(big.model.dec_layers, 6);
  EXPECT_EQ(big.model.dropout, 0.2f);

  // --layers given stands for both stacks, the preset's 6 for neither.
  const TrainConfig layers = parse_train(
      {"--arch", "transformer-base", "--synthetic", "reverse", "--out", "r", "--layers", "3"});
  EXPECT_EQ(layers.model.enc_layers, 3);
  EXPECT_EQ(layers.model.dec_layers, 3);
  // The same --model as the preset's is no contradiction.
  EXPECT_EQ(
      parse_train({"--arch", "bert-base", "--model", "mlm", "--synthetic", "copy", "--out", "r"})
          .model.layers,
      12);
}

TEST(TrainOptions, ArchPresetIsRecordedWithItsEffectiveValues) {
  const TrainConfig cfg = parse_train({"--arch", "tiny", "--model", "lm", "--synthetic", "copy",
                                       "--out", "runs/a", "--d-ff", "256"});
  const std::string ini = train_config_ini(cfg);
  EXPECT_NE(ini.find("# Model\narch = tiny\nmodel = lm\nlayers = 2\n"), std::string::npos) << ini;
  EXPECT_NE(ini.find("\nd-model = 128\n"), std::string::npos) << ini;
  EXPECT_NE(ini.find("\nd-ff = 256\n"), std::string::npos) << ini;
  EXPECT_NE(ini.find("\ndropout = 0.1\n"), std::string::npos) << ini;
  EXPECT_EQ(train_config_ini(parse_train(base_args())).find("arch ="), std::string::npos);

  // config.ini again, as a resumed run reads it (with its own --arch too):
  // the same configuration, the preset changing nothing.
  TempFile file("arch_roundtrip.ini", ini);
  EXPECT_EQ(train_config_ini(parse_train({"--config", file.path()})), ini);
  EXPECT_EQ(train_config_ini(parse_train({"--config", file.path(), "--arch", "tiny"})), ini);
  // What eval and generate read back from a checkpoint's config.
  const TrainConfig back = train_config_from_ini(ini, "config");
  EXPECT_EQ(back.arch, "tiny");
  EXPECT_EQ(back.model.d_ff, 256);
}

// A run's config.ini with `key`'s line replaced by `key = value`.
std::string ini_with(const std::string& key, const std::string& value) {
  std::string ini = train_config_ini(parse_train(base_args()));
  const size_t at = ini.find("\n" + key + " = ");
  EXPECT_NE(at, std::string::npos) << key;
  const size_t end = ini.find('\n', at + 1);
  return ini.replace(at + 1, end - at - 1, key + " = " + value);
}

// The message train_config_from_ini gives for `ini` read from "ckpt.h5".
std::string config_error(const std::string& ini) {
  try {
    train_config_from_ini(ini, "ckpt.h5");
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(TrainConfigFromIni, ValuesKeepTheFlagsRulesNamingFileAndKey) {
  EXPECT_EQ(config_error(ini_with("d-model", "32")), "");
  EXPECT_EQ(config_error(ini_with("heads", "0")),
            "ckpt.h5: config key 'heads' = 0: must be positive; got 0");
  EXPECT_EQ(config_error(ini_with("heads", "3")),
            "ckpt.h5: config key 'heads' = 3: must divide --d-model (64); got 3");
  EXPECT_EQ(config_error(ini_with("layers", "-1")),
            "ckpt.h5: config key 'layers' = -1: must be positive; got -1");
  EXPECT_EQ(config_error(ini_with("d-model", "1000000000")),
            "ckpt.h5: config key 'd-model' = 1000000000: must be at most 16777216; got "
            "1000000000");
  EXPECT_EQ(config_error(ini_with("dropout", "2")),
            "ckpt.h5: config key 'dropout' = 2: must be in [0, 1); got 2");
  // The reason is the flag's, as train gives it on the command line.
  EXPECT_EQ(train_error(with(base_args(), {"--heads", "0"})), "--heads: must be positive; got 0");
  // A value that does not parse, and text that could reach a terminal.
  EXPECT_EQ(config_error(ini_with("heads", "x\x1b[2J")),
            "ckpt.h5: config key 'heads' = x\\x1b[2J: expected an integer; got 'x\\x1b[2J'");
  // What this machine lacks is not the file's fault: a GPU run's config reads here.
  EXPECT_EQ(config_error(ini_with("device", "cuda")), "");
}

TEST(TrainOptions, ConfigWithByteOrderMarkAndOutWithLineBreak) {
  TempFile bom("bom.ini", "\xef\xbb\xbfheads = 2\n");
  EXPECT_EQ(parse_train(with(base_args(), {"--config", bom.path()})).model.heads, 2);
  EXPECT_EQ(train_error({"--model", "lm", "--synthetic", "copy", "--out", "a\nb"}),
            "--out: a path with a line break cannot be recorded in the run's config.ini; choose "
            "another");
  EXPECT_EQ(ini_value("a = 1\n b  =  two words \n", "b"), "two words");
  EXPECT_EQ(ini_value("a = 1\n", "c"), "");
}

TEST(TrainOptions, ArchPresetRefusals) {
  EXPECT_EQ(train_error({"--arch", "gpt5", "--synthetic", "copy", "--out", "r"}),
            "--arch: expected gpt2-small, gpt2-medium, transformer-base, transformer-big, "
            "bert-base, tiny or list; got 'gpt5'");
  EXPECT_EQ(train_error({"--arch", "gpt2-small", "--model", "seq2seq", "--synthetic", "reverse",
                         "--out", "r"}),
            "--model: seq2seq contradicts --arch gpt2-small, whose model is lm; drop --model, "
            "or choose a preset of that kind (tiny fits any)");
  // Values the preset set are validated like given ones.
  EXPECT_NE(train_error({"--arch", "tiny", "--synthetic", "copy", "--out", "r", "--heads", "3"})
                .find("--heads: must divide --d-model (128)"),
            std::string::npos);
}

TEST(TrainOptions, ArchListAndHelpShowThePresets) {
  TrainConfig cfg;
  std::ostringstream list;
  EXPECT_FALSE(parse_train_options({"--arch", "list"}, &cfg, list));
  EXPECT_EQ(list.str(), arch_preset_table());
  for (const ArchPreset& preset : arch_presets()) {
    EXPECT_NE(list.str().find("\n  " + std::string(preset.name) + " "), std::string::npos)
        << preset.name;
  }
  EXPECT_NE(list.str().find("--d-model 768"), std::string::npos) << list.str();
  std::ostringstream help;
  EXPECT_FALSE(parse_train_options({"--help"}, &cfg, help));
  EXPECT_NE(help.str().find("--arch NAME"), std::string::npos) << help.str();
  EXPECT_NE(help.str().find(arch_preset_table()), std::string::npos);
}

TEST(TrainOptions, AverageCheckpointsAtMostTheKeptOnes) {
  EXPECT_EQ(parse_train(with(base_args(), {"--average-checkpoints", "5"})).average_checkpoints, 5);
  EXPECT_EQ(
      parse_train(with(base_args(), {"--average-checkpoints", "9", "--keep-checkpoints", "0"}))
          .average_checkpoints,
      9);
  EXPECT_EQ(train_error(with(base_args(), {"--average-checkpoints", "6"})),
            "--average-checkpoints: 6 exceeds --keep-checkpoints (5): only that many are kept to "
            "average; raise --keep-checkpoints");
  EXPECT_EQ(train_error(with(base_args(), {"--average-checkpoints", "-1"})),
            "--average-checkpoints: must be at least 0; got -1");
}

TEST(TrainOptions, UnsetBucketsAreNotWritten) {
  const std::string ini = train_config_ini(parse_train(base_args()));
  EXPECT_EQ(ini.find("buckets ="), std::string::npos) << ini;
}

TEST(TrainOptions, VocabZeroMeansFromTheShardsOr32ForSynthetic) {
  EXPECT_EQ(parse_train(base_args()).model.vocab, 32);
  EXPECT_EQ(parse_train(with(base_args(), {"--vocab", "50"})).model.vocab, 50);
  EXPECT_EQ(parse_train(with(base_args(), {"--vocab", "0"})).model.vocab, 32);

  TempFile shards("shards", TempFile::Directory{});
  const Args data = {"--model", "lm", "--data", shards.path(), "--out", "o"};
  TrainConfig cfg = parse_train(data);
  EXPECT_EQ(cfg.data_dir, shards.path());
  EXPECT_EQ(cfg.model.vocab, 0) << "left for the data loader to fill from the shards";
  EXPECT_EQ(parse_train(with(data, {"--vocab", "1000"})).model.vocab, 1000);
  EXPECT_EQ(train_error(with(data, {"--vocab", "7"})).rfind("--vocab: must be at least 8", 0), 0u);

  // config.ini keeps 0 ("from the shards") until the run resolves it.
  const std::string ini = train_config_ini(cfg);
  EXPECT_NE(ini.find("vocab = 0\n"), std::string::npos) << ini;
  TempFile file("data.ini", ini);
  const TrainConfig back = parse_train({"--config", file.path()});
  EXPECT_EQ(back.model.vocab, 0);
  EXPECT_EQ(back.data_dir, shards.path());
}

TEST(TrainOptions, DataMustBeADirectory) {
  EXPECT_EQ(train_error({"--model", "lm", "--data", "/nonexistent/shards", "--out", "o"}),
            "--data: /nonexistent/shards: no such directory");
  TempFile file("not_a_dir", "text");
  EXPECT_EQ(train_error({"--model", "lm", "--data", file.path(), "--out", "o"}),
            "--data: " + file.path() + ": not a directory");
}

// Each bad value: a UsageError whose message starts with the flag it is about.
struct BadCase {
  Args extra;
  std::string flag;
  std::string message;  // exact message when not empty
};

void PrintTo(const BadCase& c, std::ostream* os) {
  for (const auto& a : c.extra) *os << a << " ";
}

class TrainBadValue : public ::testing::TestWithParam<BadCase> {};

TEST_P(TrainBadValue, NamesTheFlag) {
  const BadCase& c = GetParam();
  const std::string what = train_error(with(base_args(), c.extra));
  ASSERT_FALSE(what.empty()) << "no error";
  EXPECT_EQ(what.rfind(c.flag + ": ", 0), 0u) << what;
  EXPECT_EQ(what.find('\n'), std::string::npos) << "one line: " << what;
  if (!c.message.empty()) {
    EXPECT_EQ(what, c.message);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Options, TrainBadValue,
    ::testing::Values(
        BadCase{{"--d-model", "256", "--heads", "3"},
                "--heads",
                "--heads: must divide --d-model (256); got 3"},
        BadCase{{"--label-smoothing", "1.5"},
                "--label-smoothing",
                "--label-smoothing: must be in [0, 1); got 1.5"},
        BadCase{{"--label-smoothing", "-0.1"}, "--label-smoothing", ""},
        BadCase{{"--label-smoothing", "1"}, "--label-smoothing", ""},
        BadCase{{"--heads", "0"}, "--heads", "--heads: must be positive; got 0"},
        BadCase{{"--enc-layers", "-1"}, "--enc-layers", ""}, BadCase{{"--d-ff", "0"}, "--d-ff", ""},
        BadCase{{"--max-tokens", "-5"}, "--max-tokens", ""},
        BadCase{{"--max-sentences", "-1"}, "--max-sentences", ""},
        BadCase{{"--accum-steps", "0"}, "--accum-steps", ""},
        BadCase{{"--steps", "0"}, "--steps", ""}, BadCase{{"--vocab", "7"}, "--vocab", ""},
        BadCase{{"--max-len", "3"}, "--max-len", "--max-len: must be at least 4; got 3"},
        BadCase{{"--dropout", "1"}, "--dropout", ""},
        BadCase{{"--dropout", "-0.5"}, "--dropout", ""},
        BadCase{{"--mlm-probability", "0"}, "--mlm-probability", ""},
        BadCase{{"--attention-ref-len", "1"}, "--attention-ref-len", ""},
        BadCase{{"--lr", "0"}, "--lr", ""},
        BadCase{{"--lr", "nan"}, "--lr", "--lr: expected a finite number; got 'nan'"},
        BadCase{{"--beta2", "1"}, "--beta2", ""}, BadCase{{"--warmup", "-1"}, "--warmup", ""},
        BadCase{{"--clip-norm", "-1"}, "--clip-norm", ""},
        BadCase{{"--layers", "two"}, "--layers", "--layers: expected an integer; got 'two'"},
        BadCase{{"--layers", "2.5"}, "--layers", ""},
        BadCase{{"--layers", "99999999999"}, "--layers", ""},
        BadCase{{"--seed", "-1"}, "--seed", "--seed: expected a non-negative integer; got '-1'"},
        BadCase{{"--tied-embeddings", "maybe"}, "--tied-embeddings", ""},
        BadCase{{"--schedule", "linear"}, "--schedule", ""},
        BadCase{{"--norm", "middle"}, "--norm", ""},
        BadCase{{"--precision", "fp8"}, "--precision", ""},
        BadCase{{"--tf32"}, "--tf32", "--tf32: only with --device cuda --precision fp32"},
        BadCase{{"--tf32", "--precision", "bf16"},
                "--tf32",
                "--tf32: only with --device cuda --precision fp32"},
        BadCase{{"--tf32", "--precision", "fp16"}, "--tf32", ""},
        BadCase{{"--loss-scale", "0.5"},
                "--loss-scale",
                "--loss-scale: must be a finite number >= 1; got 0.5"},
        BadCase{{"--loss-scale", "0"}, "--loss-scale", ""},
        BadCase{{"--loss-scale", "-1024"}, "--loss-scale", ""},
        BadCase{{"--loss-scale", "inf"}, "--loss-scale", ""},
        BadCase{{"--loss-scale", "nan"}, "--loss-scale", ""},
        BadCase{{"--loss-scale", "big"}, "--loss-scale", ""},
        BadCase{{"--precision", "fp16", "--loss-scale", "1e39"}, "--loss-scale", ""},
        BadCase{{"--loss-scale-window", "0"}, "--loss-scale-window", ""},
        BadCase{{"--loss-scale-window", "-5"}, "--loss-scale-window", ""},
        BadCase{{"--loss-scale-window", "2.5"}, "--loss-scale-window", ""},
        BadCase{{"--device", "tpu"}, "--device", ""},
        BadCase{{"--lr-scaling", "cubic"}, "--lr-scaling", ""},
        BadCase{{"--lr-reference-tokens", "-1"}, "--lr-reference-tokens", ""},
        BadCase{{"--bucket-mb", "-1"}, "--bucket-mb", ""},
        BadCase{{"--overlap", "maybe"}, "--overlap", ""},
        BadCase{{"--check-every", "-1"}, "--check-every", ""},
        BadCase{{"--foo", "1"}, "--foo", "--foo: unknown flag (see --help)"},
        BadCase{{"--lay", "1"}, "--lay", ""},  // no abbreviations
        BadCase{{"--layers"}, "--layers", ""},
        BadCase{{"--layers", "1", "--layers", "2"}, "--layers", ""},
        BadCase{{"--data", "shards/"}, "--data", ""},  // with --synthetic: one of the two
        BadCase{{"--resume", "no/such/checkpoint.h5"}, "--resume", ""},
        BadCase{{"--min-len", "64"}, "--min-len", ""},  // seq2seq at max-len 64: x <= 63
        BadCase{{"--max-tokens", "100"}, "--max-tokens", ""},
        BadCase{{"--threads", "-2"}, "--threads", ""},
        BadCase{{"--buckets", "16,8"},
                "--buckets",
                "--buckets: expected comma-separated increasing positive integers such as "
                "8,16,32; got '16,8'"},
        BadCase{{"--buckets", "8,8"}, "--buckets", ""},
        BadCase{{"--buckets", "0,8"}, "--buckets", ""},
        BadCase{{"--buckets", "8,,16"}, "--buckets", ""},
        BadCase{{"--buckets", "8,16,"}, "--buckets", ""},
        BadCase{{"--buckets", "eight"}, "--buckets", ""}, BadCase{{"--buckets="}, "--buckets", ""},
        BadCase{{"--buckets", "8,128"}, "--buckets", "--buckets: 128 exceeds --max-len (64)"},
        BadCase{{"--too-long", "wrap"},
                "--too-long",
                "--too-long: expected auto, skip or truncate; got 'wrap'"},
        BadCase{{"--sharding", "rank"}, "--sharding", ""},
        BadCase{{"--prefetch", "0"}, "--prefetch", "--prefetch: must be positive; got 0"},
        BadCase{{"--vocab", "-1"}, "--vocab", ""}));

TEST(TrainOptions, ClassifierFlags) {
  TrainConfig cfg;
  std::ostringstream out;
  ASSERT_TRUE(parse_train_options({"--model", "classify", "--data", ".", "--out", "o", "--loss",
                                   "zlpr", "--pool", "mean", "--patch", "2"},
                                  &cfg, out));
  EXPECT_EQ(cfg.model.loss, ClassifyLoss::kZlpr);
  EXPECT_EQ(cfg.model.pool, PoolKind::kMean);
  EXPECT_EQ(cfg.model.patch, 2);
  EXPECT_EQ(train_error({"--model", "classify", "--synthetic", "copy", "--out", "o"})
                .rfind("--synthetic: the synthetic tasks are sequence tasks", 0),
            0u);
  EXPECT_EQ(train_error({"--model", "lm", "--patch", "2", "--synthetic", "copy", "--out", "o"}),
            "--patch: only with --model classify");
  EXPECT_EQ(bench_error({"--model", "classify"}).rfind("--model: the synthetic batch is of lm", 0),
            0u);
}

TEST(TrainOptions, UnknownModelKind) {
  EXPECT_EQ(train_error({"--model", "gpt", "--synthetic", "copy", "--out", "o"}),
            "--model: expected lm, seq2seq, mlm or classify; got 'gpt'");
}

TEST(TrainOptions, RequiredFlags) {
  EXPECT_EQ(train_error({"--model", "lm", "--out", "o"}).rfind("--data: ", 0), 0u);
  EXPECT_EQ(train_error({"--model", "lm", "--synthetic", "copy"}),
            "--out: required: the run directory");
  EXPECT_EQ(train_error({"--model", "lm", "--data", "d", "--out", "o"}),
            "--data: d: no such directory");
}

TEST(TrainOptions, StrayArgumentIsRefused) {
  const std::string what = train_error(with(base_args(), {"extra"}));
  EXPECT_NE(what.find("'extra'"), std::string::npos) << what;
}

TEST(TrainOptions, MixedPrecisionOnTheCpuToo) {
  for (const char* precision : {"bf16", "fp16"}) {
    EXPECT_EQ(train_error(with(base_args(), {"--precision", precision})), "") << precision;
  }
  TrainConfig cfg;
  std::ostringstream out;
  ASSERT_TRUE(parse_train_options(with(base_args(), {"--precision", "fp16", "--loss-scale", "1024",
                                                     "--loss-scale-window", "50"}),
                                  &cfg, out));
  EXPECT_EQ(cfg.precision, Precision::kFp16);
  EXPECT_EQ(cfg.loss_scale, 1024.0f);
  EXPECT_EQ(cfg.loss_scale_window, 50);
  // The smallest scale and window are allowed; bf16 takes them too (and
  // ignores them: only fp16 scales).
  EXPECT_EQ(train_error(with(base_args(), {"--precision", "fp16", "--loss-scale", "1",
                                           "--loss-scale-window", "1"})),
            "");
  EXPECT_EQ(train_error(with(base_args(), {"--precision", "bf16", "--loss-scale", "8"})), "");
  // They travel through config.ini like every other flag.
  const std::string ini = train_config_ini(cfg);
  EXPECT_NE(ini.find("precision = fp16\n"), std::string::npos) << ini;
  EXPECT_NE(ini.find("loss-scale = 1024\n"), std::string::npos) << ini;
  EXPECT_NE(ini.find("loss-scale-window = 50\n"), std::string::npos) << ini;
  TempFile file("precision.ini", ini);
  const TrainConfig back = parse_train({"--config", file.path()});
  EXPECT_EQ(back.precision, Precision::kFp16);
  EXPECT_EQ(back.loss_scale, 1024.0f);
  EXPECT_EQ(back.loss_scale_window, 50);
  EXPECT_EQ(train_config_ini(back), ini);
}

// --tf32 is a cuda fp32 switch: refused on the CPU whatever the precision.
TEST(TrainOptions, Tf32OnlyWithCudaFp32) {
  for (const char* precision : {"fp32", "bf16", "fp16"}) {
    EXPECT_EQ(
        train_error(with(base_args(), {"--device", "cpu", "--precision", precision, "--tf32"})),
        "--tf32: only with --device cuda --precision fp32")
        << precision;
  }
}

TEST(TrainOptions, CudaNeedsACudaBuildWithAGpu) {
  const std::string what = train_error(with(base_args(), {"--device", "cuda"}));
  if (cuda_backend_built() && cuda_device_count() > 0) {
    EXPECT_EQ(what, "");
    EXPECT_EQ(train_error(with(base_args(), {"--device", "cuda", "--precision", "bf16"})), "");
    EXPECT_EQ(train_error(with(base_args(), {"--device", "cuda", "--tf32"})), "");
    EXPECT_EQ(train_error(with(base_args(), {"--device", "cuda", "--precision", "bf16", "--tf32"}))
                  .rfind("--tf32: ", 0),
              0u);
  } else {
    EXPECT_EQ(what.rfind("--device: cuda ", 0), 0u) << what;
  }
}

TEST(TrainOptions, ConfigFileErrorsNameTheKeyAndFile) {
  TempFile unknown("unknown.ini", "d-model = 64\nwidth = 3\n");
  std::string what = train_error(with(base_args(), {"--config", unknown.path()}));
  EXPECT_EQ(what.rfind("--config: ", 0), 0u) << what;
  EXPECT_NE(what.find("'width'"), std::string::npos) << what;

  // Where the key is and what was meant: a section, dashes, a typo.
  TempFile section("section.ini", "# a model\n[model]\nmodel = lm\n");
  what = train_error(with(base_args(), {"--config", section.path()}));
  EXPECT_EQ(what, "--config: " + section.path() +
                      " line 3: unknown key 'model' under [model]; sections are not read: write "
                      "'model = ...' outside any [section]")
      << what;
  TempFile dashes("dashes.ini", "--d-model = 64\n");
  what = train_error(with(base_args(), {"--config", dashes.path()}));
  EXPECT_EQ(what, "--config: " + dashes.path() +
                      " line 1: unknown key '--d-model'; keys are flag names without the dashes: "
                      "'d-model = ...'")
      << what;
  TempFile typo("typo.ini", "steps = 3\nd_model = 64\n");
  what = train_error(with(base_args(), {"--config", typo.path()}));
  EXPECT_NE(what.find(" line 2: unknown key 'd_model'; did you mean 'd-model'?"), std::string::npos)
      << what;

  TempFile bad_value("bad_value.ini", "d-model = wide\n");
  what = train_error(with(base_args(), {"--config", bad_value.path()}));
  EXPECT_EQ(what.rfind("--d-model: expected an integer; got 'wide'", 0), 0u) << what;
  EXPECT_NE(what.find(bad_value.path()), std::string::npos) << what;

  what = train_error(with(base_args(), {"--config", "/nonexistent/mpiformer.ini"}));
  EXPECT_EQ(what.rfind("--config: cannot read", 0), 0u) << what;
}

TEST(ValidateModel, AcceptsDefaultsAndRefusesBadShapes) {
  EXPECT_NO_THROW(validate_model(ModelConfig{}));
  ModelConfig m;
  m.heads = 5;
  EXPECT_THROW(validate_model(m), UsageError);
  m = ModelConfig{};
  m.vocab = SpecialTokens::kCount + 1;
  EXPECT_THROW(validate_model(m), UsageError);
  m.vocab = SpecialTokens::kCount + 2;
  EXPECT_NO_THROW(validate_model(m));
  m.dropout = 1.0f;
  EXPECT_THROW(validate_model(m), UsageError);
}

TEST(ValidateModel, SizesKeepEveryShapeAnInt) {
  ModelConfig m;
  m.d_model = 1000000000;
  m.heads = 1;
  EXPECT_THROW(validate_model(m), UsageError);
  m = ModelConfig{};
  m.layers = kMaxLayers + 1;
  try {
    validate_model(m);
    ADD_FAILURE() << "no refusal";
  } catch (const UsageError& e) {
    EXPECT_EQ(e.flag(), "--layers");
    EXPECT_EQ(e.reason(), "must be at most 4096; got 4097");
  }
  m = ModelConfig{};
  m.vocab = kMaxWidth;
  EXPECT_NO_THROW(validate_model(m));
  EXPECT_EQ(vocab_fault(kMaxWidth + 1), "must be at most 16777216; got 16777217");
  EXPECT_EQ(vocab_fault(3), "must be at least 8 (6 reserved ids and two data symbols); got 3");
}

TEST(ValidateModel, VocabZeroOnlyAsFromData) {
  ModelConfig m;
  m.vocab = 0;
  EXPECT_THROW(validate_model(m), UsageError);
  EXPECT_NO_THROW(validate_model(m, /*vocab_from_data=*/true));
  m.vocab = SpecialTokens::kCount + 1;
  EXPECT_THROW(validate_model(m, /*vocab_from_data=*/true), UsageError);
}

// ---- prepare ----------------------------------------------------------------

TEST(PrepareOptions, DefaultsAndOverrides) {
  PrepareConfig cfg = parse_prepare({"--input", "in.txt", "--out", "shards"});
  const PrepareConfig def;
  EXPECT_EQ(cfg.kind, "lm");
  EXPECT_EQ(cfg.input, "in.txt");
  EXPECT_EQ(cfg.out_dir, "shards");
  EXPECT_EQ(cfg.shards, def.shards);
  EXPECT_EQ(cfg.vocab_size, def.vocab_size);
  EXPECT_EQ(cfg.model_type, "unigram");
  EXPECT_EQ(cfg.valid_lines, def.valid_lines);
  EXPECT_FALSE(cfg.valid_lines_given);  // the default is capped without a word
  EXPECT_EQ(cfg.test_lines, 0);         // no test split unless asked for
  EXPECT_FALSE(cfg.valid.given());
  EXPECT_FALSE(cfg.test.given());
  EXPECT_EQ(cfg.seed, def.seed);
  EXPECT_TRUE(cfg.tokenizer.empty());

  cfg = parse_prepare({"--kind", "seq2seq", "--input", "en.txt", "--target", "de.txt", "--out", "d",
                       "--shards", "16", "--vocab-size", "32000", "--model-type", "bpe",
                       "--valid-lines", "5", "--seed", "9"});
  EXPECT_EQ(cfg.kind, "seq2seq");
  EXPECT_EQ(cfg.target, "de.txt");
  EXPECT_EQ(cfg.shards, 16);
  EXPECT_EQ(cfg.vocab_size, 32000);
  EXPECT_EQ(cfg.model_type, "bpe");
  EXPECT_EQ(cfg.valid_lines, 5);
  EXPECT_TRUE(cfg.valid_lines_given);
  EXPECT_EQ(cfg.seed, 9u);
}

TEST(PrepareOptions, HeldOutSplitsFromFilesOrLines) {
  PrepareConfig cfg =
      parse_prepare({"--input", "in.txt", "--out", "d", "--valid", "v.txt", "--test-lines", "300"});
  EXPECT_EQ(cfg.valid.input, "v.txt");
  EXPECT_TRUE(cfg.valid.target.empty());
  EXPECT_FALSE(cfg.test.given());
  EXPECT_EQ(cfg.test_lines, 300);

  cfg = parse_prepare({"--kind", "seq2seq", "--input", "s.en", "--target", "s.de", "--out", "d",
                       "--valid", "v.en,v.de", "--test", "t.en,t.de"});
  EXPECT_EQ(cfg.valid.input, "v.en");
  EXPECT_EQ(cfg.valid.target, "v.de");
  EXPECT_EQ(cfg.test.input, "t.en");
  EXPECT_EQ(cfg.test.target, "t.de");

  // --valid-lines 0 is refused only where it would leave no validation split.
  cfg = parse_prepare(
      {"--input", "in.txt", "--out", "d", "--valid-lines", "20", "--test-lines", "10"});
  EXPECT_EQ(cfg.valid_lines, 20);
  EXPECT_EQ(cfg.test_lines, 10);
}

TEST(PrepareOptions, HeldOutSplitFaultsNameTheFlag) {
  const Args lm = {"--input", "in.txt", "--out", "d"};
  const Args s2s = {"--kind", "seq2seq", "--input", "s.en", "--target", "s.de", "--out", "d"};
  EXPECT_EQ(prepare_error(with(lm, {"--valid", "v.txt", "--valid-lines", "5"})),
            "--valid-lines: not with --valid, which gives the validation split");
  EXPECT_EQ(prepare_error(with(lm, {"--test", "t.txt", "--test-lines", "5"})),
            "--test-lines: not with --test, which gives the test split");
  EXPECT_EQ(prepare_error(with(lm, {"--test-lines", "-1"})),
            "--test-lines: must be at least 0; got -1");
  EXPECT_EQ(prepare_error(with(lm, {"--valid", "a.txt,b.txt"})),
            "--valid: --kind lm reads one file (SOURCE,TARGET is for --kind seq2seq); got "
            "'a.txt,b.txt'");
  EXPECT_EQ(prepare_error(with(s2s, {"--test", "t.en"})),
            "--test: --kind seq2seq needs SOURCE,TARGET (two files, comma-separated); got 't.en'");
  for (const char* bad : {",t.de", "t.en,", "a,b,c"}) {
    EXPECT_EQ(prepare_error(with(s2s, {"--valid", bad})).rfind("--valid: --kind seq2seq needs", 0),
              0u)
        << bad;
  }
}

TEST(PrepareOptions, TokenizerAloneTakesTheModelsVocabulary) {
  const Args base = {"--input", "in.txt", "--out", "d", "--tokenizer", "m.model"};
  EXPECT_EQ(parse_prepare(base).vocab_size, 0);
  EXPECT_EQ(parse_prepare(with(base, {"--vocab-size", "500"})).vocab_size, 500);
  EXPECT_EQ(prepare_error(with(base, {"--model-type", "bpe"})).rfind("--model-type: ", 0), 0u);
}

TEST(PrepareOptions, ConfigFileAndHelp) {
  TempFile ini("prepare.ini", "kind = seq2seq\ntarget = t.txt\nshards = 3\n");
  const PrepareConfig cfg =
      parse_prepare({"--config", ini.path(), "--input", "s.txt", "--out", "d", "--shards", "5"});
  EXPECT_EQ(cfg.kind, "seq2seq");
  EXPECT_EQ(cfg.target, "t.txt");
  EXPECT_EQ(cfg.shards, 5);  // the command line wins

  PrepareConfig help_cfg;
  std::ostringstream out;
  EXPECT_FALSE(parse_prepare_options({"--help"}, &help_cfg, out));
  for (const char* flag :
       {"--kind lm|seq2seq|classify|image (=lm)", "--input FILE", "--labels FILE", "--target FILE",
        "--out DIR", "--shards N (=4)", "--vocab-size V (=8000)", "--tokenizer MODEL",
        "--model-type unigram|bpe (=unigram)", "--valid-lines N (=1000)", "--valid FILE[,TARGET]",
        "--test FILE[,TARGET]", "--test-lines N (=0)", "--seed S (=1)"}) {
    EXPECT_NE(out.str().find(flag), std::string::npos) << flag << " in\n" << out.str();
  }
}

TEST(PrepareOptions, BadValuesNameTheFlag) {
  const Args base = {"--input", "in.txt", "--out", "d"};
  EXPECT_EQ(prepare_error({"--out", "d"}), "--input: required: the text to prepare");
  EXPECT_EQ(prepare_error({"--input", "in.txt"}), "--out: required: the directory for the shards");
  EXPECT_EQ(prepare_error(with(base, {"--kind", "seq2seq"})).rfind("--target: required", 0), 0u);
  EXPECT_EQ(prepare_error(with(base, {"--target", "t.txt"})),
            "--target: only for --kind seq2seq (--kind classify reads --labels)");
  EXPECT_EQ(prepare_error(with(base, {"--kind", "mlm"})),
            "--kind: expected lm, seq2seq, classify or image; got 'mlm'");
  EXPECT_EQ(prepare_error(with(base, {"--shards", "0"})), "--shards: must be positive; got 0");
  EXPECT_EQ(prepare_error(with(base, {"--vocab-size", "6"})),
            "--vocab-size: must be at least 8 (6 reserved ids and two data symbols); got 6");
  EXPECT_EQ(prepare_error(with(base, {"--vocab-size", "0"})).rfind("--vocab-size: ", 0), 0u);
  EXPECT_EQ(prepare_error(with(base, {"--valid-lines", "-1"})).rfind("--valid-lines: ", 0), 0u);
  // A set without held-out lines has no validation shard, which train --data refuses.
  EXPECT_EQ(prepare_error(with(base, {"--valid-lines", "0"})),
            "--valid-lines: must be at least 1: training evaluates on the held-out lines");
  EXPECT_EQ(prepare_error(with(base, {"--model-type", "word"})),
            "--model-type: expected unigram or bpe; got 'word'");
  EXPECT_EQ(prepare_error(with(base, {"--vocab", "100"})), "--vocab: unknown flag (see --help)");
}

// ---- eval and generate ------------------------------------------------------

// A checkpoint file and a data directory for the flags to name (parsing only
// checks that they exist).
struct EvalPaths {
  TempFile checkpoint{"ckpt.h5", "not read by the parser"};
  TempFile data{"shards", TempFile::Directory{}};
};

template <class Config>
std::string parse_error(bool (*parse)(const Args&, Config*, std::ostream&), const Args& args) {
  Config cfg;
  std::ostringstream out;
  try {
    parse(args, &cfg, out);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(EvalOptions, SplitIsValidOrTest) {
  const EvalPaths paths;
  const Args base = {"--checkpoint", paths.checkpoint.path(), "--data", paths.data.path()};
  EvalConfig cfg;
  std::ostringstream out;
  ASSERT_TRUE(parse_eval_options(base, &cfg, out));
  EXPECT_EQ(cfg.split, "valid");
  ASSERT_TRUE(parse_eval_options(with(base, {"--split", "test"}), &cfg, out));
  EXPECT_EQ(cfg.split, "test");
  EXPECT_EQ(parse_error(parse_eval_options, with(base, {"--split", "train"})),
            "--split: expected valid or test; got 'train'");
  EXPECT_EQ(parse_error(parse_eval_options,
                        {"--checkpoint", paths.checkpoint.path(), "--data", "/no/such/dir"}),
            "--data: /no/such/dir: no such directory");
  EXPECT_EQ(parse_error(parse_eval_options, {"--checkpoint", paths.checkpoint.path(), "--data",
                                             paths.checkpoint.path()}),
            "--data: " + paths.checkpoint.path() + ": not a directory");
}

TEST(DeviceChoice, AutoIsCudaOnlyWhereABuiltBackendSeesAGpu) {
  std::string why;
  // A stand-in for the device query: the count is what the runtime would say.
  EXPECT_EQ(resolve_device(DeviceKind::kAuto, true, 0, &why), DeviceKind::kCpu);
  EXPECT_EQ(why, "auto: no GPU visible");
  EXPECT_EQ(resolve_device(DeviceKind::kAuto, false, 2, &why), DeviceKind::kCpu);
  EXPECT_EQ(why, "auto: this build has no CUDA backend");
  EXPECT_EQ(resolve_device(DeviceKind::kAuto, true, 2, &why), DeviceKind::kCuda);
  EXPECT_EQ(why, "auto: 2 GPU(s) visible");
  // Given devices stay as given, with nothing to say.
  EXPECT_EQ(resolve_device(DeviceKind::kCpu, true, 2, &why), DeviceKind::kCpu);
  EXPECT_EQ(why, "");
  EXPECT_EQ(resolve_device(DeviceKind::kCuda, true, 0, &why), DeviceKind::kCuda);
  EXPECT_EQ(why, "");
}

TEST(DeviceChoice, KernelsRunOnTheCapabilitiesTheirArchitecturesCover) {
  // The default list (CMakeLists.txt): machine code for 8.0, 8.6, 8.9, 9.0
  // and sm_90's PTX.
  const std::string defaults = "80-real;86-real;89-real;90";
  for (const auto& [major, minor] : {std::pair{8, 0}, {8, 6}, {8, 9}, {9, 0}, {10, 0}, {12, 0}})
    EXPECT_TRUE(architectures_run_on(defaults, major, minor)) << major << "." << minor;
  EXPECT_FALSE(architectures_run_on(defaults, 7, 5));  // a T4: older than every entry
  EXPECT_FALSE(architectures_run_on(defaults, 7, 0));
  // Machine code runs on later minors of its major only; PTX on every later one.
  EXPECT_TRUE(architectures_run_on("80-real", 8, 6));
  EXPECT_FALSE(architectures_run_on("80-real", 9, 0));
  EXPECT_FALSE(architectures_run_on("86-real", 8, 0));
  EXPECT_TRUE(architectures_run_on("80-virtual", 9, 0));
  EXPECT_FALSE(architectures_run_on("90-real", 10, 0));
  EXPECT_TRUE(architectures_run_on("90", 10, 0));
  EXPECT_TRUE(architectures_run_on("80,90", 9, 0));  // as the build records it
  EXPECT_TRUE(architectures_run_on("native", 7, 5));
  // The refusal: one line with the GPU, its capability and the variable.
  EXPECT_EQ(architectures_problem(defaults, 9, 0, "GPU 0 (H100)"), "");
  EXPECT_EQ(architectures_problem("90", 8, 0, "GPU 0 (NVIDIA A100-SXM4-80GB)"),
            "GPU 0 (NVIDIA A100-SXM4-80GB) has compute capability 8.0, and this build has "
            "kernels for CMAKE_CUDA_ARCHITECTURES 90 only: configure a fresh build with "
            "-DCMAKE_CUDA_ARCHITECTURES=80 (or scripts/setup with MPIFORMER_NATIVE=1 on that "
            "machine)");
  // A CPU-only build, or no GPU: nothing to refuse.
  if (cuda_device_count() == 0) {
    EXPECT_EQ(cuda_architectures_problem(), "");
  }
}

TEST(DeviceChoice, EveryComputingCommandTakesAutoAndSettlesIt) {
  const EvalPaths paths;
  const Args eval = {"--checkpoint", paths.checkpoint.path(), "--data", paths.data.path()};
  EvalConfig cfg;
  std::ostringstream out;
  ASSERT_TRUE(parse_eval_options(with(eval, {"--device", "auto"}), &cfg, out));
  // On this machine: a GPU only where the runtime sees one.
  const DeviceKind here = cuda_device_count() > 0 ? DeviceKind::kCuda : DeviceKind::kCpu;
  EXPECT_EQ(cfg.device, here);
  EXPECT_NE(cfg.device_choice.find("auto: "), std::string::npos);
  EXPECT_EQ(parse_train(with(base_args(), {"--device", "auto"})).device, here);
  GenerateConfig generate;
  ASSERT_TRUE(parse_generate_options(
      {"--checkpoint", paths.checkpoint.path(), "--prompt", "a", "--device", "auto"}, &generate,
      out));
  EXPECT_EQ(generate.device, here);
  // auto is every command's default; --device cpu stays cpu with no reason.
  ASSERT_TRUE(parse_eval_options(eval, &cfg, out));
  EXPECT_EQ(cfg.device, here);
  EXPECT_NE(cfg.device_choice.find("auto: "), std::string::npos);
  ASSERT_TRUE(parse_generate_options({"--checkpoint", paths.checkpoint.path(), "--prompt", "a"},
                                     &generate, out));
  EXPECT_EQ(generate.device, here);
  EXPECT_EQ(parse_train(base_args()).device, here);
  ASSERT_TRUE(parse_eval_options(with(eval, {"--device", "cpu"}), &cfg, out));
  EXPECT_EQ(cfg.device, DeviceKind::kCpu);
  EXPECT_TRUE(cfg.device_choice.empty()) << cfg.device_choice;
  if (here == DeviceKind::kCpu) {
    const std::string error = parse_error(parse_eval_options, with(eval, {"--device", "cuda"}));
    EXPECT_EQ(error.rfind("--device: cuda ", 0), 0u) << error;
  }
}

TEST(GenerateOptions, DataSplitAndReferences) {
  const EvalPaths paths;
  const TempFile input("inputs.txt", "a b\n");
  const Args base = {"--checkpoint", paths.checkpoint.path()};
  GenerateConfig cfg;
  std::ostringstream out;
  ASSERT_TRUE(parse_generate_options(with(base, {"--data", paths.data.path()}), &cfg, out));
  EXPECT_EQ(cfg.data_dir, paths.data.path());
  EXPECT_EQ(cfg.split, "test");
  EXPECT_TRUE(cfg.references.empty());
  ASSERT_TRUE(parse_generate_options(with(base, {"--data", paths.data.path(), "--split", "valid",
                                                 "--references", "ref.txt", "--output", "hyp.txt"}),
                                     &cfg, out));
  EXPECT_EQ(cfg.split, "valid");
  EXPECT_EQ(cfg.references, "ref.txt");
  EXPECT_EQ(cfg.output, "hyp.txt");

  EXPECT_EQ(parse_error(parse_generate_options, base),
            "--input: give one of --prompt TEXT, --input FILE or --data DIR");
  EXPECT_EQ(parse_error(parse_generate_options,
                        with(base, {"--data", paths.data.path(), "--input", input.path()})),
            "--input: give one of --prompt TEXT, --input FILE or --data DIR");
  EXPECT_EQ(parse_error(parse_generate_options, with(base, {"--data", "/no/such/dir"})),
            "--data: /no/such/dir: no such directory");
  EXPECT_EQ(parse_error(parse_generate_options,
                        with(base, {"--input", input.path(), "--references", "r.txt"})),
            "--references: only with --data DIR, whose split holds the references");
  EXPECT_EQ(
      parse_error(parse_generate_options, with(base, {"--input", input.path(), "--split", "test"})),
      "--split: only with --data DIR");
  EXPECT_EQ(
      parse_error(parse_generate_options, with(base, {"--data", paths.data.path(), "--references",
                                                      "x.txt", "--output", "x.txt"})),
      "--references: the same file as --output");
  EXPECT_EQ(parse_error(parse_generate_options,
                        with(base, {"--data", paths.data.path(), "--split", "train"})),
            "--split: expected test or valid; got 'train'");
}

TEST(BenchOptions, DefaultsAndOverrides) {
  BenchConfig cfg;
  std::ostringstream out;
  ASSERT_TRUE(parse_bench_options({}, &cfg, out));
  EXPECT_EQ(cfg.batch, BenchConfig{}.batch);
  EXPECT_EQ(cfg.seq, BenchConfig{}.seq);
  EXPECT_EQ(cfg.run.model.max_len, cfg.seq);  // follows --seq unless given

  ASSERT_TRUE(parse_bench_options(
      {"--model",        "seq2seq", "--layers",      "4",   "--max-len", "256",   "--batch",   "16",
       "--seq",          "200",     "--min-seq",     "100", "--src-seq", "180",   "--steps",   "5",
       "--warmup-steps", "1",       "--peak-tflops", "989", "--lr",      "0.002", "--threads", "2"},
      &cfg, out));
  EXPECT_EQ(cfg.run.model.kind, ModelKind::kSeq2seq);
  EXPECT_EQ(cfg.run.model.enc_layers, 4);
  EXPECT_EQ(cfg.run.model.dec_layers, 4);
  EXPECT_EQ(cfg.batch, 16);
  EXPECT_EQ(cfg.seq, 200);
  EXPECT_EQ(cfg.min_seq, 100);
  EXPECT_EQ(cfg.src_seq, 180);
  EXPECT_EQ(cfg.steps, 5);
  EXPECT_EQ(cfg.warmup_steps, 1);
  EXPECT_EQ(cfg.peak_tflops, 989.0);
  EXPECT_FLOAT_EQ(cfg.run.optim.lr, 0.002f);
  EXPECT_EQ(cfg.run.threads, 2);

  EXPECT_FALSE(parse_bench_options({"--help"}, &cfg, out));
  EXPECT_NE(out.str().find("--peak-tflops"), std::string::npos);
}

TEST(BenchOptions, CudaNeedsACudaBuildWithAGpu) {
  const std::string what = bench_error({"--device", "cuda"});
  if (cuda_backend_built() && cuda_device_count() > 0) {
    EXPECT_EQ(what, "");
    EXPECT_EQ(bench_error({"--device", "cuda", "--precision", "bf16", "--profile"}), "");
  } else {
    EXPECT_EQ(what.rfind("--device: cuda ", 0), 0u) << what;
  }
}

TEST(BenchOptions, MixedPrecisionOnTheCpuButNoTf32) {
  for (const char* precision : {"bf16", "fp16"}) {
    EXPECT_EQ(bench_error({"--precision", precision}), "") << precision;
  }
  BenchConfig cfg;
  std::ostringstream out;
  ASSERT_TRUE(parse_bench_options({"--precision", "bf16"}, &cfg, out));
  EXPECT_EQ(cfg.run.precision, Precision::kBf16);
  EXPECT_FALSE(cfg.run.tf32);
  EXPECT_EQ(bench_error({"--tf32"}), "--tf32: only with --device cuda --precision fp32");
  EXPECT_EQ(bench_error({"--precision", "fp16", "--tf32"}),
            "--tf32: only with --device cuda --precision fp32");
  EXPECT_EQ(bench_error({"--precision", "fp8"}).rfind("--precision: ", 0), 0u);
}

TEST(BenchOptions, BadValuesNameTheFlag) {
  EXPECT_EQ(bench_error({"--batch", "0"}), "--batch: must be positive; got 0");
  EXPECT_EQ(bench_error({"--max-len", "64", "--seq", "128"}),
            "--seq: must not exceed --max-len (64); got 128");
  EXPECT_EQ(
      bench_error({"--max-len", "128", "--seq", "64", "--min-seq", "65"}).rfind("--min-seq: ", 0),
      0u);
  EXPECT_EQ(bench_error({"--d-model", "30", "--heads", "4"}).rfind("--heads: ", 0), 0u);
  EXPECT_EQ(bench_error({"--out", "x"}).rfind("--out: unknown flag", 0), 0u);
}

// bench --data settles the flags as train does: the vocabulary from the
// shards, label smoothing by kind, a classifier allowed, train's checks.
TEST(BenchOptions, DataTakesTrainsFlagsAndDefaults) {
  BenchConfig cfg;
  std::ostringstream out;
  ASSERT_TRUE(parse_bench_options(
      {"--model", "seq2seq", "--data", ".", "--layers", "3", "--max-tokens", "512",
       "--max-sentences", "7", "--buckets", "8,16", "--accum-steps", "2", "--steps", "4"},
      &cfg, out));
  EXPECT_EQ(cfg.run.data_dir, ".");
  EXPECT_EQ(cfg.run.model.vocab, 0);  // the shards'
  EXPECT_EQ(cfg.run.model.enc_layers, 3);
  EXPECT_FLOAT_EQ(cfg.run.label_smoothing, 0.1f);
  EXPECT_EQ(cfg.run.max_tokens, 512);
  EXPECT_EQ(cfg.run.max_sentences, 7);
  EXPECT_EQ(cfg.run.buckets, (std::vector<int>{8, 16}));
  EXPECT_EQ(cfg.run.accum_steps, 2);
  EXPECT_EQ(cfg.steps, 4);
  EXPECT_EQ(cfg.run.model.max_len, TrainConfig{}.model.max_len);  // not --seq's
  ASSERT_TRUE(parse_bench_options({"--model", "classify", "--data", "."}, &cfg, out));
  EXPECT_FLOAT_EQ(cfg.run.label_smoothing, 0.0f);
  // Without --data the synthetic batch keeps bench's own smoothing.
  ASSERT_TRUE(parse_bench_options({"--model", "lm"}, &cfg, out));
  EXPECT_FLOAT_EQ(cfg.run.label_smoothing, 0.1f);
}

TEST(BenchOptions, DataRefusesTheSyntheticShapeAndTheReverse) {
  for (const char* flag : {"--batch", "--seq", "--min-seq", "--src-seq"}) {
    EXPECT_EQ(
        bench_error({"--data", ".", flag, "4"}).rfind(std::string(flag) + ": not with --data", 0),
        0u)
        << flag;
  }
  EXPECT_EQ(bench_error({"--max-tokens", "512"}),
            "--max-tokens: only with --data; the synthetic batch is --batch x --seq");
  EXPECT_EQ(bench_error({"--accum-steps", "2"}).rfind("--accum-steps: only with --data", 0), 0u);
  EXPECT_EQ(bench_error({"--data", "no/such/dir"}).rfind("--data: ", 0), 0u);
  // train's own checks of the values.
  EXPECT_EQ(bench_error({"--data", ".", "--max-tokens", "0"}),
            "--max-tokens: must be positive; got 0");
  EXPECT_EQ(bench_error({"--data", ".", "--buckets", "8,128", "--max-len", "64"}),
            "--buckets: 128 exceeds --max-len (64)");
  EXPECT_EQ(
      bench_error({"--data", ".", "--synthetic", "copy"}).rfind("--synthetic: unknown flag", 0),
      0u);
}

}  // namespace
}  // namespace mpiformer
