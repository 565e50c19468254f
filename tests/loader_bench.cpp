// Times the shard loader: loading a shard set (read, decode, validate,
// bucket) and then building training batches (gather, lay out, mask) on one
// thread, the work the prefetch thread must keep ahead of training with.
//
//   loader_bench DIR [--model lm|mlm|seq2seq] [--max-len 256] [--max-tokens 8192]
//                    [--batches N] [--seed S]
//
// Prints one JSON line. Not a test.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "src/data/batch.h"
#include "src/data/make_source.h"
#include "src/data/shard_source.h"
#include "src/train/shard_config.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

[[noreturn]] void usage(const std::string& problem) {
  std::fprintf(stderr,
               "loader_bench: %s\nusage: loader_bench DIR [--model lm|mlm|seq2seq] "
               "[--max-len L] [--max-tokens T] [--batches N] [--seed S]\n",
               problem.c_str());
  std::exit(2);
}

long long parse_int(const std::string& flag, const char* text) {
  char* end = nullptr;
  const long long v = std::strtoll(text, &end, 10);
  if (end == text || *end != '\0' || v < 1) usage(flag + ": expected a positive integer");
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace mpiformer;
  TrainConfig cfg;
  cfg.model.vocab = 0;
  cfg.model.max_len = 256;
  cfg.max_tokens = 8192;
  cfg.prefetch = 0;  // time the building itself, on this thread
  long long batches = 1000;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--", 0) != 0) {
      if (!cfg.data_dir.empty()) usage("one DIR only");
      cfg.data_dir = arg;
      continue;
    }
    if (i + 1 >= argc) usage(arg + ": needs a value");
    const char* value = argv[++i];
    if (arg == "--model") {
      const std::string m = value;
      if (m == "lm") {
        cfg.model.kind = ModelKind::kLm;
      } else if (m == "mlm") {
        cfg.model.kind = ModelKind::kMlm;
      } else if (m == "seq2seq") {
        cfg.model.kind = ModelKind::kSeq2seq;
      } else {
        usage("--model: lm, mlm or seq2seq");
      }
    } else if (arg == "--max-len") {
      cfg.model.max_len = static_cast<int>(parse_int(arg, value));
    } else if (arg == "--max-tokens") {
      cfg.max_tokens = static_cast<int>(parse_int(arg, value));
    } else if (arg == "--batches") {
      batches = parse_int(arg, value);
    } else if (arg == "--seed") {
      cfg.seed = static_cast<uint64_t>(parse_int(arg, value));
    } else {
      usage("unknown flag " + arg);
    }
  }
  if (cfg.data_dir.empty()) usage("DIR is required");

  try {
    resolve_data_config(&cfg);
    const Clock::time_point load_start = Clock::now();
    ShardSource source(cfg, 0, 1);
    const double load_s = seconds_since(load_start);

    Batch batch;
    source.make_batch(BatchSource::kTrain, 0, &batch);  // sizes the buffers
    long long real_tokens = 0, padded_tokens = 0, sequences = 0;
    const Clock::time_point build_start = Clock::now();
    for (long long g = 1; g <= batches; ++g) {
      source.make_batch(BatchSource::kTrain, static_cast<uint64_t>(g), &batch);
      real_tokens += batch.real_tokens();
      padded_tokens += batch.padded_tokens();
      sequences += batch.decoder.batch();
    }
    const double build_s = seconds_since(build_start);

    std::printf(
        "{\"model\": \"%s\", \"max_len\": %d, \"max_tokens\": %d, \"train_sequences\": %lld, "
        "\"batches_per_epoch\": %llu, \"load_s\": %.4f, \"batches\": %lld, \"build_s\": %.4f, "
        "\"batches_per_s\": %.1f, \"sequences_per_s\": %.1f, \"tokens_per_s\": %.1f, "
        "\"padding_efficiency\": %.4f}\n",
        to_string(cfg.model.kind), cfg.model.max_len, cfg.max_tokens,
        static_cast<long long>(source.train_stats().sequences),
        static_cast<unsigned long long>(source.batches_per_epoch()), load_s, batches, build_s,
        batches / build_s, sequences / build_s, real_tokens / build_s,
        padded_tokens > 0 ? static_cast<double>(real_tokens) / padded_tokens : 1.0);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loader_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
