// `mpiformer prepare`'s flags.
#include <set>
#include <string>
#include <vector>

#include "src/app/flags.h"
#include "src/app/options.h"
#include "src/core/error.h"

namespace mpiformer {
namespace {

constexpr const char* kPrepareSynopsis =
    "mpiformer prepare --kind lm|seq2seq|classify|image --input FILE [--target FILE]\n"
    "                  [--labels FILE] --out DIR --shards N\n"
    "                  --vocab-size V [--tokenizer MODEL]\n"
    "                  [--valid FILE[,TARGET] | --valid-lines N]\n"
    "                  [--test FILE[,TARGET] | --test-lines N] [flags]\n"
    "Writes DIR/train-NNNNN.h5, DIR/valid-00000.h5, DIR/test-00000.h5 (with --test or\n"
    "--test-lines) and DIR/tokenizer.model, trained on the training lines alone; run it under\n"
    "mpirun to encode the shards in parallel.";

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

// The second file of a --kind: required with it, refused without it.
struct KindFile {
  const char* kind;
  std::string PrepareConfig::*path;
  const char* flag;
  const char* required;  // the reason when --kind names it but it is missing
  const char* only_for;  // the reason when it is given with another --kind
};

constexpr KindFile kKindFiles[] = {
    {"seq2seq", &PrepareConfig::target, "--target",
     "required with --kind seq2seq: the target side of the pairs",
     "only for --kind seq2seq (--kind classify reads --labels)"},
    {"classify", &PrepareConfig::labels, "--labels",
     "required with --kind classify: the labels of each line of --input",
     "only for --kind classify"},
};

// --input, and --target or --labels as --kind wants them: every missing one
// is reported before any one given where it does not belong.
void validate_input_files(const PrepareConfig& c) {
  if (c.input.empty()) usage_error("--input", "required: the text to prepare");
  for (const KindFile& f : kKindFiles) {
    if (c.kind == f.kind && (c.*f.path).empty()) usage_error(f.flag, f.required);
  }
  for (const KindFile& f : kKindFiles) {
    if (c.kind != f.kind && !(c.*f.path).empty()) usage_error(f.flag, f.only_for);
  }
}

// The held-out splits come from files or from the end of --input, not both.
void validate_held_out(const PrepareConfig& c, const std::set<std::string>& given) {
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
}

// With --tokenizer alone the model decides; otherwise the size is checked
// here (and against the model by run_prepare).
void validate_vocab_size(const PrepareConfig& c, const std::set<std::string>& given) {
  if (c.vocab_size == 0 && !c.tokenizer.empty() && !given.count("vocab-size")) return;
  const int least_vocab = SpecialTokens::kCount + 2;
  if (c.vocab_size < least_vocab) {
    usage_error("--vocab-size", "must be at least " + std::to_string(least_vocab) + " (" +
                                    std::to_string(SpecialTokens::kCount) +
                                    " reserved ids and two data symbols); got " +
                                    std::to_string(c.vocab_size));
  }
}

void validate_prepare(const PrepareConfig& c, const std::set<std::string>& given) {
  validate_input_files(c);
  if (c.out_dir.empty()) usage_error("--out", "required: the directory for the shards");
  require_at_least("--shards", c.shards, 1);
  validate_held_out(c, given);
  validate_vocab_size(c, given);
  if (!c.tokenizer.empty() && given.count("model-type")) {
    usage_error("--model-type", "only for a trained tokenizer, not with --tokenizer");
  }
}

void finish_prepare(const std::set<std::string>& given, PrepareConfig* cfg) {
  if (!cfg->tokenizer.empty() && !given.count("vocab-size")) cfg->vocab_size = 0;
  cfg->valid = parse_split_files("--valid", cfg->valid_files, cfg->kind);
  cfg->test = parse_split_files("--test", cfg->test_files, cfg->kind);
  cfg->valid_lines_given = given.count("valid-lines") > 0;
  validate_prepare(*cfg, given);
}

constexpr CommandFlags<PrepareConfig> kPrepareFlags{
    .synopsis = kPrepareSynopsis, .add = add_prepare_flags, .finish = finish_prepare};

}  // namespace

bool parse_prepare_options(const std::vector<std::string>& args, PrepareConfig* cfg,
                           std::ostream& out) {
  return parse_command(args, kPrepareFlags, cfg, out);
}

}  // namespace mpiformer
