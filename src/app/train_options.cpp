// `mpiformer train`'s flags, and a run's config.ini written and read back.
#include <cmath>
#include <ostream>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "src/app/arch_presets.h"
#include "src/app/flags.h"
#include "src/app/options.h"
#include "src/app/shared_options.h"
#include "src/core/error.h"
#include "src/core/escape.h"
#include "src/data/synthetic.h"

namespace mpiformer {
namespace {

constexpr const char* kTrainSynopsis =
    "mpiformer train --model lm|seq2seq|mlm|classify (--data DIR | --synthetic reverse|copy|sort) "
    "--out RUNDIR [flags]";

// --vocab 0 with --synthetic: the vocabulary the synthetic tasks have always used.
constexpr int kSyntheticVocab = 32;

void add_train_flags(FlagTable& t, TrainConfig* c) {
  t.group("Model");
  t.add("arch", &c->arch, "NAME",
        "a preset of model and recipe flags (table below; `--arch list`); the flags given win");
  add_model_flags(t, &c->model,
                  "vocabulary size, reserved ids included (0: from the shards with --data, "
                  "32 with --synthetic)");
  t.group("Data");
  add_data_flags(t, c, /*synthetic_tasks=*/true);
  t.add("label-smoothing", &c->label_smoothing, "E",
        "label smoothing, in [0, 1) (default: 0.1 for seq2seq, 0 for lm and mlm)");
  add_optim_flags(t, &c->optim);
  t.group("Run");
  t.add("out", &c->out_dir, "RUNDIR", "run directory (config.ini, metrics.h5, checkpoints)");
  t.add("resume", &c->resume, "auto|none|PATH",
        "continue from a checkpoint: auto takes the newest complete one in --out (none there: "
        "start); none refuses an --out that holds a run");
  t.add_switch("resume-other-run", &c->resume_other_run,
               "with --resume PATH: continue a checkpoint of another run in an --out that "
               "holds a run of its own (refused without it; ignored with auto and none)");
  t.add("accum-steps", &c->accum_steps, "K", "micro-batches per rank and optimizer step");
  t.add("steps", &c->steps, "S", "optimizer steps");
  t.add("seed", &c->seed, "S", "seed of data order, initialisation and dropout");
  t.add("log-every", &c->log_every, "N", "steps between training log lines");
  t.add("eval-every", &c->eval_every, "N", "steps between evaluations (0: only at the end)");
  t.add("eval-batches", &c->eval_batches, "N",
        "micro-batches per evaluation (0: the whole validation split; a synthetic task: 8)");
  t.add("checkpoint-every", &c->checkpoint_every, "N",
        "steps between checkpoints; the last step always writes one (0: only the last)");
  t.add("keep-checkpoints", &c->keep_checkpoints, "K",
        "newest checkpoints kept (0: all); --keep-best's are kept besides");
  t.add("valid-bleu", &c->valid_bleu, "true|false",
        "seq2seq: each evaluation also translates the validation split (greedy) and scores it "
        "with BLEU (sacreBLEU's 13a tokens and defaults), the metric --keep-best and "
        "--early-stop then follow (else the nll)");
  t.add("keep-best", &c->keep_best, "N",
        "keep the checkpoints of the N best evaluations in checkpoints/best/, the best as "
        "checkpoints/best.h5 (a checkpoint is written at an evaluation that makes the N best; "
        "0: none)");
  t.add("early-stop", &c->early_stop, "N",
        "stop after N evaluations in a row without a better validation metric, with a "
        "checkpoint (0: never)");
  t.add("average-checkpoints", &c->average_checkpoints, "K",
        "at the end, write checkpoints/average_last_K.h5, the mean of the newest K checkpoints' "
        "weights (`mpiformer average`; 0: none)");
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
  t.add("shard-optimizer", &c->shard_optimizer, "true|false",
        "each rank keeps the master weights and Adam moments of its 1/W slice only (ZeRO-1): "
        "gradients are reduce-scattered, weights all-gathered after the update");
  t.group("Memory");
  add_recompute_flag(t, &c->recompute);
}

// One of --data and --synthetic, as the model kind allows, and the model's
// own rules.
void validate_data_source(const TrainConfig& c) {
  const bool has_data = !c.data_dir.empty();
  const bool has_synthetic = c.synthetic != SyntheticTask::kNone;
  if (has_data && has_synthetic)
    usage_error("--data", "give either --data or --synthetic, not both");
  if (has_synthetic && c.model.kind == ModelKind::kClassify) {
    usage_error("--synthetic",
                "the synthetic tasks are sequence tasks; --model classify reads "
                "--data (prepare --kind classify or image)");
  }
  // A recorded configuration may name neither (an imported checkpoint's):
  // its vocabulary is then the file's, as it is the shards' for --data.
  validate_model(c.model, /*vocab_from_data=*/!has_synthetic);
}

void validate_run_paths(const TrainConfig& c) {
  // config.ini records the path on one line, and every checkpoint carries it.
  if (c.out_dir.find_first_of("\n\r") != std::string::npos) {
    usage_error("--out",
                "a path with a line break cannot be recorded in the run's config.ini; "
                "choose another");
  }
  if (c.resume.empty()) usage_error("--resume", "expected auto, none or a checkpoint file");
}

// How the data is cut into batches and what the loss makes of it.
void validate_batching(const TrainConfig& c) {
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
}

// The counts of steps, evaluations and checkpoints, checked in this order.
void validate_schedule(const TrainConfig& c) {
  struct AtLeast {
    const char* flag;
    int64_t value;
    int64_t least;
  };
  const AtLeast counts[] = {
      {"--accum-steps", c.accum_steps, 1},
      {"--steps", c.steps, 1},
      {"--log-every", c.log_every, 1},
      {"--eval-every", c.eval_every, 0},
      {"--eval-batches", c.eval_batches, 0},
      {"--checkpoint-every", c.checkpoint_every, 0},
      {"--keep-checkpoints", c.keep_checkpoints, 0},
      {"--keep-best", c.keep_best, 0},
      {"--early-stop", c.early_stop, 0},
  };
  for (const AtLeast& count : counts) require_at_least(count.flag, count.value, count.least);
}

// --valid-bleu translates the validation split of --data with a seq2seq
// model's fp32 weights.
void validate_valid_bleu(const TrainConfig& c) {
  if (!c.valid_bleu) return;
  if (c.model.kind != ModelKind::kSeq2seq) {
    usage_error("--valid-bleu", std::string("translates the validation split: a seq2seq model's; "
                                            "got --model ") +
                                    to_string(c.model.kind));
  }
  if (c.shard_optimizer && c.precision != Precision::kFp32) {
    usage_error("--valid-bleu",
                "translates with the fp32 master weights, which a sharded "
                "optimizer keeps in slices beside a bf16 or fp16 copy; train "
                "with --precision fp32 or --shard-optimizer false");
  }
  if (c.data_dir.empty()) {
    usage_error("--valid-bleu",
                "scores translations against the references of --data's "
                "validation split; a synthetic task has none");
  }
}

void validate_checkpoint_average(const TrainConfig& c) {
  require_at_least("--average-checkpoints", c.average_checkpoints, 0);
  if (c.keep_checkpoints > 0 && c.average_checkpoints > c.keep_checkpoints) {
    usage_error("--average-checkpoints",
                std::to_string(c.average_checkpoints) + " exceeds --keep-checkpoints (" +
                    std::to_string(c.keep_checkpoints) +
                    "): only that many are kept to average; raise --keep-checkpoints");
  }
}

void validate_loss_scale(const TrainConfig& c) {
  if (!(c.loss_scale >= 1.0f && std::isfinite(c.loss_scale))) {
    usage_error("--loss-scale", "must be a finite number >= 1; got " + format_number(c.loss_scale));
  }
  require_at_least("--loss-scale-window", c.loss_scale_window, 1);
}

// The learning rate's scaling over the ranks, and the reducer's flags.
void validate_distribution(const TrainConfig& c) {
  require_at_least("--lr-reference-tokens", c.lr_reference_tokens, int64_t{0});
  if (c.lr_scaling != LrScaling::kNone && c.lr_reference_tokens == 0) {
    usage_error("--lr-reference-tokens",
                std::string("required with --lr-scaling ") + to_string(c.lr_scaling) +
                    ": the global token budget per step that --lr was tuned for");
  }
  require_non_negative("--bucket-mb", c.bucket_mb);
  require_at_least("--check-every", c.check_every, 0);
}

// A synthetic task's layout: the source knows it, and its messages already
// name the flags.
void validate_synthetic_task(const TrainConfig& c) {
  if (c.synthetic == SyntheticTask::kNone) return;
  try {
    SyntheticSource source(c.synthetic, c.model, c.max_tokens, c.max_sentences, c.min_len,
                           c.mlm_probability, c.seed);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
}

// The rules of the values alone, which a run's recorded configuration (a
// checkpoint's config) keeps as the command line does: nothing here looks
// at files or devices.
void validate_train_values(const TrainConfig& c) {
  validate_data_source(c);
  validate_run_paths(c);
  validate_batching(c);
  validate_optim(c.optim);
  validate_schedule(c);
  validate_valid_bleu(c);
  validate_checkpoint_average(c);
  validate_device_choice(c.device, c.precision, c.tf32, c.threads, c.attention);
  validate_loss_scale(c);
  validate_distribution(c);
  validate_synthetic_task(c);
}

// What the values name on this machine: the shards, the device and the BLAS
// kernels.
void validate_train_machine(const TrainConfig& c) {
  if (!c.data_dir.empty()) require_directory("--data", c.data_dir);
  validate_device(c.device, c.precision, c.tf32, c.threads, c.blas_core, c.attention);
  validate_transport(c.device, c.transport);
}

// Before any flag is read: no vocabulary until it is known, from the shards
// or kSyntheticVocab.
TrainConfig initial_train_config() {
  TrainConfig cfg;
  cfg.model.vocab = 0;
  return cfg;
}

void finish_train(const std::set<std::string>& given_flags, TrainConfig* cfg) {
  // --arch fills in what was not given; its values then count as given.
  FlagTable table;
  add_train_flags(table, cfg);
  const std::set<std::string> given = apply_arch_preset(table, given_flags, cfg->arch);
  if (cfg->data_dir.empty() && cfg->synthetic == SyntheticTask::kNone)
    usage_error("--data", "required: --data DIR or --synthetic reverse|copy|sort");
  if (cfg->out_dir.empty()) usage_error("--out", "required: the run directory");
  settle_training_flags(given, cfg);
  if (cfg->resume != "none" && cfg->resume != "auto") require_file("--resume", cfg->resume);
}

constexpr CommandFlags<TrainConfig> kTrainFlags{.synopsis = kTrainSynopsis,
                                                .initial = initial_train_config,
                                                .add = add_train_flags,
                                                .finish = finish_train,
                                                .config_file = &TrainConfig::config_file,
                                                .epilog = arch_preset_table};

}  // namespace

void settle_training_flags(const std::set<std::string>& given, TrainConfig* cfg) {
  settle_device(&cfg->device, &cfg->device_choice);
  apply_layers_shorthand(given, &cfg->model);
  // As in the Transformer paper for translation; a language model's loss is
  // then its true negative log-likelihood.
  if (!given.count("label-smoothing")) {
    cfg->label_smoothing = cfg->model.kind == ModelKind::kSeq2seq ? 0.1f : 0.0f;
  }
  if (cfg->model.vocab == 0 && cfg->synthetic != SyntheticTask::kNone) {
    cfg->model.vocab = kSyntheticVocab;
  }
  validate_train_values(*cfg);
  validate_train_machine(*cfg);
}

bool parse_train_options(const std::vector<std::string>& args, TrainConfig* cfg,
                         std::ostream& out) {
  if (early_flag_value(args, "arch") == "list") {
    out << arch_preset_table();
    return false;
  }
  return parse_command(args, kTrainFlags, cfg, out);
}

std::string train_config_ini(const TrainConfig& cfg) {
  TrainConfig copy = cfg;  // the table binds to fields it may write
  FlagTable table;
  add_train_flags(table, &copy);
  return write_ini(table, "mpiformer train configuration; re-use with --config FILE");
}

TrainConfig train_config_from_ini(const std::string& ini, const std::string& path) {
  TrainConfig cfg = initial_train_config();
  FlagTable table;
  add_train_flags(table, &cfg);
  try {
    read_ini(table, ini, path);
    validate_train_values(cfg);
  } catch (const UsageError& e) {
    // The text's form (an unknown key): its message names `path`.
    if (e.flag() == "--config") throw UsageError(escaped(e.reason()));
    if (e.flag().rfind("--", 0) != 0) throw UsageError(path + ": config: " + e.what());
    // The key and its text as the file has them, with the flag's reason.
    const std::string key = e.flag().substr(2);
    throw UsageError(path + ": config key " + quoted(key) + " = " + escaped(ini_value(ini, key)) +
                     ": " + escaped(e.reason()));
  }
  return cfg;
}

}  // namespace mpiformer
