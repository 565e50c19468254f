// `mpiformer bench`'s flags.
#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "src/app/flags.h"
#include "src/app/options.h"
#include "src/app/shared_options.h"
#include "src/core/error.h"

namespace mpiformer {
namespace {

constexpr const char* kBenchSynopsis =
    "mpiformer bench --model lm|seq2seq|mlm --batch B --seq T [flags]\n"
    "       mpiformer bench --model lm|seq2seq|mlm|classify --data DIR [--max-tokens T ...] "
    "[flags]\n"
    "Times training steps after --warmup-steps untimed ones and prints one JSON line:\n"
    "tokens_per_s (real tokens), step_ms, mfu, peak_mem_bytes, real_tokens, padded_tokens,\n"
    "target_tokens, batch_shapes, startup_seconds, ...\n"
    "Without --data every step runs one synthetic batch of the shape; without --max-len the\n"
    "positions table is as long as the longest of --seq and --src-seq.\n"
    "With --data DIR (the shards train reads) the model is built as train builds it from the\n"
    "flags and the shards, and the steps take train's batches in its order: the warm-up steps\n"
    "are train's first steps, the timed ones the next (--max-tokens, --max-sentences,\n"
    "--buckets, --accum-steps, ... as train has them).";

// The synthetic batch's shape flags, which --data replaces.
const char* const kShapeFlags[] = {"batch", "seq", "min-seq", "src-seq"};
// The flags of train's batches, which only --data reads.
const char* const kDataFlags[] = {"max-tokens", "max-sentences", "buckets",     "too-long",
                                  "sharding",   "prefetch",      "accum-steps", "mlm-probability"};

void add_bench_flags(FlagTable& t, BenchConfig* c) {
  TrainConfig* run = &c->run;
  add_model_flags(t, &run->model);
  add_optim_flags(t, &run->optim);
  t.group("Benchmark");
  t.add("batch", &c->batch, "B", "sequences per step (without --data)");
  t.add("seq", &c->seq, "T", "sequence length (lm, mlm) or target length (seq2seq)");
  t.add("min-seq", &c->min_seq, "T", ">0: lengths drawn from [min-seq, seq], so padding shows");
  t.add("src-seq", &c->src_seq, "T", "seq2seq source length (0: same as --seq)");
  t.add("steps", &c->steps, "S", "timed steps");
  t.add("warmup-steps", &c->warmup_steps, "S", "untimed steps first");
  t.add("label-smoothing", &run->label_smoothing, "E",
        "label smoothing, in [0, 1) (with --data, train's default: 0.1 for seq2seq, else 0)");
  t.add("seed", &run->seed, "S", "seed of the batches (with --data: their order), initialisation");
  t.add("peak-tflops", &c->peak_tflops, "TF", "device peak for MFU (0: estimate for the device)");
  t.add_switch("profile", &c->profile,
               "also time the ops by family (GEMM, attention, layer norm, ...) and print a table");
  add_recompute_flag(t, &run->recompute);
  add_device_flags(t, &run->device, &run->precision, &run->tf32, &run->threads, &run->blas_core,
                   &run->attention);
  t.group("Data (--data: train's batches of a shard directory, in train's order)");
  add_data_flags(t, run, /*synthetic_tasks=*/false);
  t.add("accum-steps", &run->accum_steps, "K", "micro-batches per rank and step");
  t.group("Distribution (under mpirun: every rank runs its own batch, or its share of the step)");
  add_reducer_flags(t, &run->bucket_mb, &run->overlap, &run->grad_sum, &run->transport,
                    &run->deterministic);
}

// Without --data: one synthetic batch of the shape.
void finish_synthetic(const std::set<std::string>& given, BenchConfig* cfg) {
  for (const char* flag : kDataFlags) {
    if (given.count(flag)) {
      usage_error(std::string("--") + flag,
                  "only with --data; the synthetic batch is --batch x --seq");
    }
  }
  ModelConfig& m = cfg->run.model;
  apply_layers_shorthand(given, &m);
  // The positions table need not be longer than the benchmarked sequences.
  if (!given.count("max-len")) m.max_len = std::max(cfg->seq, cfg->src_seq);
  if (m.kind == ModelKind::kClassify) {
    usage_error("--model",
                "the synthetic batch is of lm, seq2seq and mlm; time a classifier on its "
                "shards with --data");
  }
  validate_model(m);
  validate_optim(cfg->run.optim);
  require_non_negative("--bucket-mb", cfg->run.bucket_mb);
  require_at_least("--batch", cfg->batch, 1);
  require_at_least("--seq", cfg->seq, 1);
  if (cfg->seq > m.max_len) {
    usage_error("--seq", "must not exceed --max-len (" + std::to_string(m.max_len) + "); got " +
                             std::to_string(cfg->seq));
  }
  if (cfg->min_seq < 0 || cfg->min_seq > cfg->seq) {
    usage_error("--min-seq", "must be in [0, --seq (" + std::to_string(cfg->seq) + ")]; got " +
                                 std::to_string(cfg->min_seq));
  }
  if (cfg->src_seq < 0 || cfg->src_seq > m.max_len) {
    usage_error("--src-seq", "must be in [0, --max-len (" + std::to_string(m.max_len) + ")]; got " +
                                 std::to_string(cfg->src_seq));
  }
  require_unit_interval("--label-smoothing", cfg->run.label_smoothing);
  settle_device(&cfg->run.device, &cfg->run.device_choice);
  const TrainConfig& r = cfg->run;
  validate_device(r.device, r.precision, r.tf32, r.threads, r.blas_core, r.attention);
  validate_transport(r.device, r.transport);
}

// With --data: the flags as train settles them (the model's vocabulary from
// the shards unless given).
void finish_data(const std::set<std::string>& given, BenchConfig* cfg) {
  for (const char* flag : kShapeFlags) {
    if (given.count(flag)) {
      usage_error(std::string("--") + flag,
                  "not with --data, whose batches are train's; size them with --max-tokens, "
                  "--max-sentences and --accum-steps");
    }
  }
  if (!given.count("vocab")) cfg->run.model.vocab = 0;
  settle_training_flags(given, &cfg->run);
}

// A synthetic batch's label smoothing, as bench has always used.
BenchConfig initial_bench_config() {
  BenchConfig cfg;
  cfg.run.label_smoothing = 0.1f;
  return cfg;
}

void finish_bench(const std::set<std::string>& given, BenchConfig* cfg) {
  if (cfg->run.data_dir.empty()) {
    finish_synthetic(given, cfg);
  } else {
    finish_data(given, cfg);
  }
  require_at_least("--steps", cfg->steps, 1);
  require_at_least("--warmup-steps", cfg->warmup_steps, 0);
  require_non_negative("--peak-tflops", cfg->peak_tflops);
}

constexpr CommandFlags<BenchConfig> kBenchFlags{.synopsis = kBenchSynopsis,
                                                .initial = initial_bench_config,
                                                .add = add_bench_flags,
                                                .finish = finish_bench};

}  // namespace

bool parse_bench_options(const std::vector<std::string>& args, BenchConfig* cfg,
                         std::ostream& out) {
  return parse_command(args, kBenchFlags, cfg, out);
}

}  // namespace mpiformer
