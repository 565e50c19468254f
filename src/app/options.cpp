#include "src/app/options.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ostream>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "src/app/flags.h"
#include "src/app/shared_options.h"
#include "src/core/error.h"
#include "src/data/synthetic.h"

namespace mpiformer {
namespace {

void add_train_flags(FlagTable& t, TrainConfig* c) {
  add_model_flags(t, &c->model,
                  "vocabulary size, reserved ids included (0: from the shards with --data, "
                  "32 with --synthetic)");
  t.group("Data");
  t.add("data", &c->data_dir, "DIR", "directory of HDF5 token shards (`mpiformer prepare`)");
  t.add_choice("synthetic", &c->synthetic,
               {{"reverse", SyntheticTask::kReverse},
                {"copy", SyntheticTask::kCopy},
                {"sort", SyntheticTask::kSort}},
               "generated task instead of --data");
  t.add("max-tokens", &c->max_tokens, "T", "padded tokens per micro-batch");
  t.add("max-sentences", &c->max_sentences, "N", "sequences per micro-batch (0: no limit)");
  t.add_increasing_list("buckets", &c->buckets, "LIST",
                        "length-bucket boundaries, e.g. 8,16,32 (default: from 8 growing x1.1 to "
                        "--max-len)");
  t.add_choice(
      "too-long", &c->too_long,
      {{"auto", TooLong::kAuto}, {"skip", TooLong::kSkip}, {"truncate", TooLong::kTruncate}},
      "sequences longer than --max-len (auto: skip for seq2seq, truncate for lm and mlm)");
  t.add_choice("sharding", &c->sharding, {{"data", Sharding::kData}, {"file", Sharding::kFile}},
               "data: every rank reads all shards and takes every W-th batch; file: each rank "
               "reads its own shard files");
  t.add("prefetch", &c->prefetch, "N", "batches the loader thread prepares ahead");
  t.add("min-len", &c->min_len, "N", "shortest synthetic example");
  t.add("mlm-probability", &c->mlm_probability, "P", "mlm: share of tokens chosen for prediction");
  t.add("label-smoothing", &c->label_smoothing, "E",
        "label smoothing, in [0, 1) (default: 0.1 for seq2seq, 0 for lm and mlm)");
  add_optim_flags(t, &c->optim);
  t.group("Run");
  t.add("out", &c->out_dir, "RUNDIR", "run directory (config.ini, metrics.h5, checkpoints)");
  t.add("resume", &c->resume, "auto|none|PATH",
        "continue from a checkpoint: auto takes the newest complete one in --out (none there: "
        "start); none refuses an --out that holds a run");
  t.add("accum-steps", &c->accum_steps, "K", "micro-batches per rank and optimizer step");
  t.add("steps", &c->steps, "S", "optimizer steps");
  t.add("seed", &c->seed, "S", "seed of data order, initialisation and dropout");
  t.add("log-every", &c->log_every, "N", "steps between training log lines");
  t.add("eval-every", &c->eval_every, "N", "steps between evaluations (0: only at the end)");
  t.add("eval-batches", &c->eval_batches, "N",
        "micro-batches per evaluation (0: the whole validation split; a synthetic task: 8)");
  t.add("checkpoint-every", &c->checkpoint_every, "N",
        "steps between checkpoints; the last step always writes one (0: only the last)");
  t.add("keep-checkpoints", &c->keep_checkpoints, "K", "newest checkpoints kept (0: all)");
  t.add_choice("on-divergence", &c->on_divergence,
               {{"stop", OnDivergence::kStop}, {"skip", OnDivergence::kSkip}},
               "a step whose loss or gradient norm is not finite: stop (exit 3, nothing of it "
               "saved; the last good checkpoint stays latest) or skip the step (stopping after "
               "20 in a row)");
  add_device_flags(t, &c->device, &c->precision, &c->tf32, &c->threads, &c->blas_core,
                   &c->attention);
  t.add("loss-scale", &c->loss_scale, "S",
        "fp16: the initial loss scale (halved on overflow, doubled after --loss-scale-window "
        "good steps)");
  t.add("loss-scale-window", &c->loss_scale_window, "N",
        "fp16: good steps in a row before the loss scale doubles");
  t.group("Distribution");
  t.add_choice(
      "lr-scaling", &c->lr_scaling,
      {{"none", LrScaling::kNone}, {"linear", LrScaling::kLinear}, {"sqrt", LrScaling::kSqrt}},
      "scale --lr by the global token budget per step (max-tokens x accum-steps x "
      "ranks) over --lr-reference-tokens, or its square root");
  t.add("lr-reference-tokens", &c->lr_reference_tokens, "T",
        "the global token budget per step that --lr was tuned for");
  add_reducer_flags(t, &c->bucket_mb, &c->overlap, &c->grad_sum, &c->transport, &c->deterministic);
  t.add("check-every", &c->check_every, "N",
        "steps between checks that all replicas hold identical parameters (0: off)");
}

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
  add_device_flags(t, &c->device, &c->precision, &c->tf32, &c->threads, &c->blas_core,
                   &c->attention);
  t.group("Distribution (under mpirun: every rank runs its own batch of the shape)");
  add_reducer_flags(t, &c->bucket_mb, &c->overlap, &c->grad_sum, &c->transport, &c->deterministic);
}

void add_eval_flags(FlagTable& t, EvalConfig* c) {
  t.group("Evaluation");
  t.add("checkpoint", &c->checkpoint, "FILE", "a checkpoint written by mpiformer train");
  t.add("data", &c->data_dir, "DIR", "shards of the same vocabulary");
  t.add_choice("split", &c->split, {{"valid", std::string("valid")}, {"test", std::string("test")}},
               "the split of --data to evaluate (test: from prepare --test or --test-lines)");
  t.add("max-tokens", &c->max_tokens, "T", "padded tokens per batch (0: the run's)");
  t.add("batches", &c->batches, "N", "evaluation batches (0: all)");
  add_cpu_flags(t, &c->threads, "CPU threads per rank (0: the node's cores shared)", &c->blas_core);
}

void add_generate_flags(FlagTable& t, GenerateConfig* c) {
  t.group("Generation");
  t.add("checkpoint", &c->checkpoint, "FILE", "a checkpoint of an lm or seq2seq run");
  t.add("prompt", &c->prompt, "TEXT", "one input: a source sentence (seq2seq) or prompt (lm)");
  t.add("input", &c->input, "FILE", "inputs, one per line");
  t.add("data", &c->data_dir, "DIR",
        "seq2seq: translate the source sentences of a split of these shards, in order");
  t.add_choice("split", &c->split, {{"test", std::string("test")}, {"valid", std::string("valid")}},
               "with --data: the split to translate");
  t.add("references", &c->references, "FILE",
        "with --data: write the split's target sentences here, line-aligned with the output");
  t.add("output", &c->output, "FILE", "write the outputs here, one per line (default: stdout)");
  t.add("beam", &c->beam, "N", "beam width (1: greedy)");
  t.add("length-alpha", &c->length_alpha, "A", "beam scores are log p / length^A");
  t.add("max-new-tokens", &c->max_new_tokens, "N", "tokens to produce at most (0: up to max-len)");
  t.add("top-k", &c->top_k, "K", "lm: sample among the K most likely tokens (0: no sampling)");
  t.add("temperature", &c->temperature, "T", "sampling temperature");
  t.add("seed", &c->seed, "S", "seed of the sampling");
  add_cpu_flags(t, &c->threads, "CPU threads (0: all cores)", &c->blas_core);
}

void add_classify_flags(FlagTable& t, ClassifyConfig* c) {
  t.group("Classify");
  t.add("checkpoint", &c->checkpoint, "FILE", "a checkpoint of `train --model classify` on text");
  t.add("text", &c->text, "TEXT", "one input");
  t.add("input", &c->input, "FILE", "inputs, one per line");
  t.add("output", &c->output, "FILE",
        "write the labels here, one line per input (default: stdout)");
  t.add("top", &c->top, "K", "labels printed per input, best first");
  t.add("batch", &c->batch, "N", "lines scored at a time");
  add_cpu_flags(t, &c->threads, "CPU threads (0: all cores)", &c->blas_core);
}

void add_prepare_flags(FlagTable& t, PrepareConfig* c) {
  t.group("Input");
  t.add_choice("kind", &c->kind,
               {{"lm", std::string("lm")},
                {"seq2seq", std::string("seq2seq")},
                {"classify", std::string("classify")},
                {"image", std::string("image")}},
               "lm: one sequence per line; seq2seq: line-aligned --input/--target pairs; "
               "classify: text lines with --labels; image: an HDF5 or .npz file of uint8 images "
               "and labels");
  t.add("input", &c->input, "FILE",
        "text, one sequence (or source sentence) per line; image: FILE.h5 or FILE.npz");
  t.add("target", &c->target, "FILE", "seq2seq: target sentences, line-aligned with --input");
  t.add("labels", &c->labels, "FILE",
        "classify: the labels of each line of --input, space-separated, each NAME or "
        "NAME:WEIGHT (a soft label, weight in [0, 1])");
  t.add("valid", &c->valid_files, "FILE[,TARGET]",
        "the validation split from these files (seq2seq: source,target; classify: text,labels) "
        "instead of --valid-lines");
  t.add("test", &c->test_files, "FILE[,TARGET]",
        "a test split from these files (seq2seq: source,target; classify: text,labels) instead "
        "of --test-lines");
  t.add("valid-lines", &c->valid_lines, "N",
        "lines (pairs) held out for validation from the end of --input, before any test lines; "
        "at most a tenth of them");
  t.add("test-lines", &c->test_lines, "N",
        "the last lines (pairs) of --input held out as a test split, at most a tenth of them "
        "(0: none)");
  t.group("Tokenizer");
  t.add("vocab-size", &c->vocab_size, "V",
        "pieces of the trained tokenizer, reserved ids included");
  t.add("tokenizer", &c->tokenizer, "MODEL",
        "use this SentencePiece model instead of training one");
  t.add_choice("model-type", &c->model_type,
               {{"unigram", std::string("unigram")}, {"bpe", std::string("bpe")}},
               "SentencePiece algorithm of the trained tokenizer");
  t.add("seed", &c->seed, "S", "seed of the tokenizer's sentence sampling");
  t.group("Output");
  t.add("out", &c->out_dir, "DIR", "new directory for the shards (must not hold shards yet)");
  t.add("shards", &c->shards, "N", "training shard files (each rank writes every W-th)");
}

void validate_train(const TrainConfig& c) {
  const bool has_data = !c.data_dir.empty();
  const bool has_synthetic = c.synthetic != SyntheticTask::kNone;
  if (has_data && has_synthetic)
    usage_error("--data", "give either --data or --synthetic, not both");
  if (!has_data && !has_synthetic) {
    usage_error("--data", "required: --data DIR or --synthetic reverse|copy|sort");
  }
  if (has_synthetic && c.model.kind == ModelKind::kClassify) {
    usage_error("--synthetic",
                "the synthetic tasks are sequence tasks; --model classify reads "
                "--data (prepare --kind classify or image)");
  }
  validate_model(c.model, /*vocab_from_data=*/has_data);
  if (has_data) {
    // <filesystem> is left out on purpose: its std::quoted would be found by
    // argument-dependent lookup beside quoted() of src/app/flags.h.
    struct stat info {};
    if (::stat(c.data_dir.c_str(), &info) != 0) {
      usage_error("--data", c.data_dir + ": no such directory");
    }
    if (!S_ISDIR(info.st_mode)) usage_error("--data", c.data_dir + ": not a directory");
  }
  if (c.out_dir.empty()) usage_error("--out", "required: the run directory");
  if (c.resume.empty()) usage_error("--resume", "expected auto, none or a checkpoint file");
  if (c.resume != "none" && c.resume != "auto") require_file("--resume", c.resume);
  require_at_least("--max-tokens", c.max_tokens, 1);
  require_at_least("--max-sentences", c.max_sentences, 0);
  for (int boundary : c.buckets) {
    if (boundary > c.model.max_len) {
      usage_error("--buckets", std::to_string(boundary) + " exceeds --max-len (" +
                                   std::to_string(c.model.max_len) + ")");
    }
  }
  require_at_least("--prefetch", c.prefetch, 1);
  require_at_least("--min-len", c.min_len, 1);
  if (!(c.mlm_probability > 0 && c.mlm_probability < 1)) {
    usage_error("--mlm-probability", "must be in (0, 1); got " + format_number(c.mlm_probability));
  }
  require_unit_interval("--label-smoothing", c.label_smoothing);
  validate_optim(c.optim);
  require_at_least("--accum-steps", c.accum_steps, 1);
  require_at_least("--steps", c.steps, 1);
  require_at_least("--log-every", c.log_every, 1);
  require_at_least("--eval-every", c.eval_every, 0);
  require_at_least("--eval-batches", c.eval_batches, 0);
  require_at_least("--checkpoint-every", c.checkpoint_every, 0);
  require_at_least("--keep-checkpoints", c.keep_checkpoints, 0);
  validate_device(c.device, c.precision, c.tf32, c.threads, c.blas_core, c.attention);
  validate_transport(c.device, c.transport);
  if (!(c.loss_scale >= 1.0f && std::isfinite(c.loss_scale))) {
    usage_error("--loss-scale", "must be a finite number >= 1; got " + format_number(c.loss_scale));
  }
  require_at_least("--loss-scale-window", c.loss_scale_window, 1);
  require_at_least("--lr-reference-tokens", c.lr_reference_tokens, int64_t{0});
  if (c.lr_scaling != LrScaling::kNone && c.lr_reference_tokens == 0) {
    usage_error("--lr-reference-tokens",
                std::string("required with --lr-scaling ") + to_string(c.lr_scaling) +
                    ": the global token budget per step that --lr was tuned for");
  }
  require_non_negative("--bucket-mb", c.bucket_mb);
  require_at_least("--check-every", c.check_every, 0);
  if (has_synthetic) {
    // The source knows its layout; its messages already name the flags.
    try {
      SyntheticSource source(c.synthetic, c.model, c.max_tokens, c.max_sentences, c.min_len,
                             c.mlm_probability, c.seed);
    } catch (const std::invalid_argument& e) {
      throw UsageError(e.what());
    }
  }
}

// --valid/--test FILE[,TARGET]: one file for lm, a source,target pair for
// seq2seq (paths with a comma cannot be named).
SplitFiles parse_split_files(const std::string& flag, const std::string& text,
                             const std::string& kind) {
  SplitFiles files;
  if (text.empty()) return files;
  const size_t comma = text.find(',');
  if (kind == "seq2seq" || kind == "classify") {
    if (comma == std::string::npos || comma == 0 || comma + 1 == text.size() ||
        text.find(',', comma + 1) != std::string::npos) {
      usage_error(flag, "--kind " + kind + " needs " +
                            (kind == "seq2seq" ? "SOURCE,TARGET" : "TEXT,LABELS") +
                            " (two files, comma-separated); got " + quoted(text));
    }
    files.input = text.substr(0, comma);
    files.target = text.substr(comma + 1);
  } else {
    if (comma != std::string::npos) {
      usage_error(flag, "--kind " + kind +
                            " reads one file (SOURCE,TARGET is for --kind seq2seq); got " +
                            quoted(text));
    }
    files.input = text;
  }
  return files;
}

void validate_prepare(const PrepareConfig& c, const std::set<std::string>& given) {
  if (c.input.empty()) usage_error("--input", "required: the text to prepare");
  if (c.kind == "seq2seq" && c.target.empty()) {
    usage_error("--target", "required with --kind seq2seq: the target side of the pairs");
  }
  if (c.kind == "classify" && c.labels.empty()) {
    usage_error("--labels", "required with --kind classify: the labels of each line of --input");
  }
  if (c.kind != "seq2seq" && !c.target.empty()) {
    usage_error("--target", "only for --kind seq2seq (--kind classify reads --labels)");
  }
  if (c.kind != "classify" && !c.labels.empty()) {
    usage_error("--labels", "only for --kind classify");
  }
  if (c.out_dir.empty()) usage_error("--out", "required: the directory for the shards");
  require_at_least("--shards", c.shards, 1);
  if (c.valid.given() && given.count("valid-lines")) {
    usage_error("--valid-lines", "not with --valid, which gives the validation split");
  }
  if (c.test.given() && given.count("test-lines")) {
    usage_error("--test-lines", "not with --test, which gives the test split");
  }
  if (!c.valid.given() && c.valid_lines < 1) {
    usage_error("--valid-lines", "must be at least 1: training evaluates on the held-out lines");
  }
  require_at_least("--test-lines", c.test_lines, 0);
  // With --tokenizer alone the model decides; otherwise the size is checked
  // here (and against the model by run_prepare).
  if (!(c.vocab_size == 0 && !c.tokenizer.empty() && !given.count("vocab-size"))) {
    const int least_vocab = SpecialTokens::kCount + 2;
    if (c.vocab_size < least_vocab) {
      usage_error("--vocab-size", "must be at least " + std::to_string(least_vocab) + " (" +
                                      std::to_string(SpecialTokens::kCount) +
                                      " reserved ids and two data symbols); got " +
                                      std::to_string(c.vocab_size));
    }
  }
  if (!c.tokenizer.empty() && given.count("model-type")) {
    usage_error("--model-type", "only for a trained tokenizer, not with --tokenizer");
  }
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

// --vocab 0 with --synthetic: the vocabulary the synthetic tasks have always used.
constexpr int kSyntheticVocab = 32;

constexpr const char* kTrainSynopsis =
    "mpiformer train --model lm|seq2seq|mlm|classify (--data DIR | --synthetic reverse|copy|sort) "
    "--out RUNDIR [flags]";
constexpr const char* kPrepareSynopsis =
    "mpiformer prepare --kind lm|seq2seq|classify|image --input FILE [--target FILE]\n"
    "                  [--labels FILE] --out DIR --shards N\n"
    "                  --vocab-size V [--tokenizer MODEL]\n"
    "                  [--valid FILE[,TARGET] | --valid-lines N]\n"
    "                  [--test FILE[,TARGET] | --test-lines N] [flags]\n"
    "Writes DIR/train-NNNNN.h5, DIR/valid-00000.h5, DIR/test-00000.h5 (with --test or\n"
    "--test-lines) and DIR/tokenizer.model, trained on the training lines alone; run it under\n"
    "mpirun to encode the shards in parallel.";
constexpr const char* kEvalSynopsis =
    "mpiformer eval --checkpoint FILE --data DIR [--split valid|test] [flags]\n"
    "Global loss, perplexity and token accuracy of the checkpoint on a split of DIR's shards\n"
    "(valid by default), split over the MPI ranks like training.";
constexpr const char* kGenerateSynopsis =
    "mpiformer generate --checkpoint FILE (--prompt TEXT | --input FILE) [flags]\n"
    "mpiformer generate --checkpoint FILE --data DIR [--split test|valid] [--references REF]\n"
    "                   [--output HYP] [flags]\n"
    "seq2seq: translates each input (greedy, or beam search with --beam N); lm: continues each\n"
    "prompt (greedy, beam, or top-k sampling with --top-k K). Text goes through the tokenizer\n"
    "kept in the checkpoint; a checkpoint of a synthetic task reads and writes token ids.\n"
    "With --data, a seq2seq checkpoint translates the source sentences of a split in order and\n"
    "--references gets their targets, so that `sacrebleu REF < HYP` scores the output.";
constexpr const char* kClassifySynopsis =
    "mpiformer classify --checkpoint FILE (--text TEXT | --input FILE) [--top K] [flags]\n"
    "Prints the K best labels of each input line as NAME:SCORE, best first: the probability\n"
    "under --loss softmax, the score s under --loss zlpr (a label is predicted when s > 0).";
constexpr const char* kBenchSynopsis =
    "mpiformer bench --model lm|seq2seq|mlm --batch B --seq T [flags]\n"
    "Prints one JSON line: tokens_per_s, step_ms, mfu, peak_mem_bytes.\n"
    "Without --max-len the positions table is as long as the longest of --seq and --src-seq.";

}  // namespace

bool parse_train_options(const std::vector<std::string>& args, TrainConfig* cfg,
                         std::ostream& out) {
  *cfg = TrainConfig{};
  cfg->model.vocab = 0;  // until known: from the shards, or kSyntheticVocab
  FlagTable table;
  add_train_flags(table, cfg);
  const auto given = parse_flags(args, table, kTrainSynopsis, &cfg->config_file, out);
  if (!given) return false;
  apply_layers_shorthand(*given, &cfg->model);
  // As in the Transformer paper for translation; a language model's loss is
  // then its true negative log-likelihood.
  if (!given->count("label-smoothing")) {
    cfg->label_smoothing = cfg->model.kind == ModelKind::kSeq2seq ? 0.1f : 0.0f;
  }
  if (cfg->model.vocab == 0 && cfg->synthetic != SyntheticTask::kNone) {
    cfg->model.vocab = kSyntheticVocab;
  }
  validate_train(*cfg);
  return true;
}

bool parse_bench_options(const std::vector<std::string>& args, BenchConfig* cfg,
                         std::ostream& out) {
  *cfg = BenchConfig{};
  FlagTable table;
  add_bench_flags(table, cfg);
  std::string config_file;
  const auto given = parse_flags(args, table, kBenchSynopsis, &config_file, out);
  if (!given) return false;
  apply_layers_shorthand(*given, &cfg->model);
  // The positions table need not be longer than the benchmarked sequences.
  if (!given->count("max-len")) cfg->model.max_len = std::max(cfg->seq, cfg->src_seq);
  validate_bench(*cfg);
  return true;
}

bool parse_eval_options(const std::vector<std::string>& args, EvalConfig* cfg, std::ostream& out) {
  *cfg = EvalConfig{};
  FlagTable table;
  add_eval_flags(table, cfg);
  std::string config_file;
  if (!parse_flags(args, table, kEvalSynopsis, &config_file, out)) return false;
  if (cfg->checkpoint.empty()) usage_error("--checkpoint", "required: the checkpoint to evaluate");
  require_file("--checkpoint", cfg->checkpoint);
  if (cfg->data_dir.empty()) usage_error("--data", "required: a directory of shards");
  require_directory("--data", cfg->data_dir);
  require_at_least("--max-tokens", cfg->max_tokens, 0);
  require_at_least("--batches", cfg->batches, 0);
  validate_cpu(cfg->threads, cfg->blas_core);
  return true;
}

bool parse_classify_options(const std::vector<std::string>& args, ClassifyConfig* cfg,
                            std::ostream& out) {
  *cfg = ClassifyConfig{};
  FlagTable table;
  add_classify_flags(table, cfg);
  std::string config_file;
  const auto given = parse_flags(args, table, kClassifySynopsis, &config_file, out);
  if (!given) return false;
  if (cfg->checkpoint.empty()) usage_error("--checkpoint", "required: the classifier to use");
  require_file("--checkpoint", cfg->checkpoint);
  if (cfg->text.empty() == cfg->input.empty()) {
    usage_error("--input", "give one of --text TEXT or --input FILE");
  }
  if (!cfg->input.empty()) require_file("--input", cfg->input);
  require_at_least("--top", cfg->top, 1);
  require_at_least("--batch", cfg->batch, 1);
  validate_cpu(cfg->threads, cfg->blas_core);
  return true;
}

bool parse_generate_options(const std::vector<std::string>& args, GenerateConfig* cfg,
                            std::ostream& out) {
  *cfg = GenerateConfig{};
  FlagTable table;
  add_generate_flags(table, cfg);
  std::string config_file;
  const auto given = parse_flags(args, table, kGenerateSynopsis, &config_file, out);
  if (!given) return false;
  if (cfg->checkpoint.empty())
    usage_error("--checkpoint", "required: the checkpoint to decode with");
  require_file("--checkpoint", cfg->checkpoint);
  const int sources = !cfg->prompt.empty() + !cfg->input.empty() + !cfg->data_dir.empty();
  if (sources != 1) usage_error("--input", "give one of --prompt TEXT, --input FILE or --data DIR");
  if (!cfg->input.empty()) require_file("--input", cfg->input);
  if (cfg->data_dir.empty()) {
    if (given->count("split")) usage_error("--split", "only with --data DIR");
    if (!cfg->references.empty()) {
      usage_error("--references", "only with --data DIR, whose split holds the references");
    }
  } else {
    require_directory("--data", cfg->data_dir);
    if (!cfg->references.empty() && cfg->references == cfg->output) {
      usage_error("--references", "the same file as --output");
    }
  }
  require_at_least("--beam", cfg->beam, 1);
  require_at_least("--max-new-tokens", cfg->max_new_tokens, 0);
  require_at_least("--top-k", cfg->top_k, 0);
  validate_cpu(cfg->threads, cfg->blas_core);
  require_positive("--temperature", cfg->temperature);
  require_non_negative("--length-alpha", cfg->length_alpha);
  if (cfg->top_k > 0 && cfg->beam > 1) usage_error("--top-k", "sampling takes no --beam");
  return true;
}

TrainConfig train_config_from_ini(const std::string& ini, const std::string& source) {
  TrainConfig cfg;
  cfg.model.vocab = 0;
  FlagTable table;
  add_train_flags(table, &cfg);
  read_ini(table, ini, source);
  return cfg;
}

bool parse_prepare_options(const std::vector<std::string>& args, PrepareConfig* cfg,
                           std::ostream& out) {
  *cfg = PrepareConfig{};
  FlagTable table;
  add_prepare_flags(table, cfg);
  std::string config_file;
  const auto given = parse_flags(args, table, kPrepareSynopsis, &config_file, out);
  if (!given) return false;
  if (!cfg->tokenizer.empty() && !given->count("vocab-size")) cfg->vocab_size = 0;
  cfg->valid = parse_split_files("--valid", cfg->valid_files, cfg->kind);
  cfg->test = parse_split_files("--test", cfg->test_files, cfg->kind);
  cfg->valid_lines_given = given->count("valid-lines") > 0;
  validate_prepare(*cfg, *given);
  return true;
}

std::string train_config_ini(const TrainConfig& cfg) {
  TrainConfig copy = cfg;  // the table binds to fields it may write
  FlagTable table;
  add_train_flags(table, &copy);
  return write_ini(table, "mpiformer train configuration; re-use with --config FILE");
}

}  // namespace mpiformer
