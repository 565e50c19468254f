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
    "Prints one JSON line: tokens_per_s, step_ms, mfu, peak_mem_bytes.\n"
    "Without --max-len the positions table is as long as the longest of --seq and --src-seq.";

void add_bench_flags(FlagTable& t, BenchConfig* c) {
  add_model_flags(t, &c->model);
  add_optim_flags(t, &c->optim);
  t.group("Benchmark");
  t.add("batch", &c->batch, "B", "sequences per step");
  t.add("seq", &c->seq, "T", "sequence length (lm, mlm) or target length (seq2seq)");
  t.add("min-seq", &c->min_seq, "T", ">0: lengths drawn from [min-seq, seq], so padding shows");
  t.add("src-seq", &c->src_seq, "T", "seq2seq source length (0: same as --seq)");
  t.add("steps", &c->steps, "S", "timed steps");
  t.add("warmup-steps", &c->warmup_steps, "S", "untimed steps first");
  t.add("label-smoothing", &c->label_smoothing, "E", "label smoothing, in [0, 1)");
  t.add("seed", &c->seed, "S", "seed of the batch and initialisation");
  t.add("peak-tflops", &c->peak_tflops, "TF", "device peak for MFU (0: estimate for the device)");
  t.add_switch("profile", &c->profile,
               "also time the ops by family (GEMM, attention, layer norm, ...) and print a table");
  add_recompute_flag(t, &c->recompute);
  add_device_flags(t, &c->device, &c->precision, &c->tf32, &c->threads, &c->blas_core,
                   &c->attention);
  t.group("Distribution (under mpirun: every rank runs its own batch of the shape)");
  add_reducer_flags(t, &c->bucket_mb, &c->overlap, &c->grad_sum, &c->transport, &c->deterministic);
}

void validate_bench(const BenchConfig& c) {
  if (c.model.kind == ModelKind::kClassify) {
    usage_error("--model", "bench times lm, seq2seq and mlm steps; time a classifier with train");
  }
  validate_model(c.model);
  validate_optim(c.optim);
  require_non_negative("--bucket-mb", c.bucket_mb);
  require_at_least("--batch", c.batch, 1);
  require_at_least("--seq", c.seq, 1);
  if (c.seq > c.model.max_len) {
    usage_error("--seq", "must not exceed --max-len (" + std::to_string(c.model.max_len) +
                             "); got " + std::to_string(c.seq));
  }
  if (c.min_seq < 0 || c.min_seq > c.seq) {
    usage_error("--min-seq", "must be in [0, --seq (" + std::to_string(c.seq) + ")]; got " +
                                 std::to_string(c.min_seq));
  }
  if (c.src_seq < 0 || c.src_seq > c.model.max_len) {
    usage_error("--src-seq", "must be in [0, --max-len (" + std::to_string(c.model.max_len) +
                                 ")]; got " + std::to_string(c.src_seq));
  }
  require_at_least("--steps", c.steps, 1);
  require_at_least("--warmup-steps", c.warmup_steps, 0);
  require_unit_interval("--label-smoothing", c.label_smoothing);
  require_non_negative("--peak-tflops", c.peak_tflops);
  validate_device(c.device, c.precision, c.tf32, c.threads, c.blas_core, c.attention);
  validate_transport(c.device, c.transport);
}

void finish_bench(const std::set<std::string>& given, BenchConfig* cfg) {
  apply_layers_shorthand(given, &cfg->model);
  // The positions table need not be longer than the benchmarked sequences.
  if (!given.count("max-len")) cfg->model.max_len = std::max(cfg->seq, cfg->src_seq);
  validate_bench(*cfg);
}

constexpr CommandFlags<BenchConfig> kBenchFlags{
    .synopsis = kBenchSynopsis, .add = add_bench_flags, .finish = finish_bench};

}  // namespace

bool parse_bench_options(const std::vector<std::string>& args, BenchConfig* cfg,
                         std::ostream& out) {
  return parse_command(args, kBenchFlags, cfg, out);
}

}  // namespace mpiformer
