// `mpiformer classify`'s flags.
#include <set>
#include <string>
#include <vector>

#include "src/app/flags.h"
#include "src/app/options.h"
#include "src/app/shared_options.h"
#include "src/core/error.h"

namespace mpiformer {
namespace {

constexpr const char* kClassifySynopsis =
    "mpiformer classify --checkpoint FILE (--text TEXT | --input FILE) [--top K] [flags]\n"
    "Prints the K best labels of each input line as NAME:SCORE, best first: the probability\n"
    "under --loss softmax, the score s under --loss zlpr (a label is predicted when s > 0).";

void add_classify_flags(FlagTable& t, ClassifyConfig* c) {
  t.group("Classify");
  t.add("checkpoint", &c->checkpoint, "FILE", "a checkpoint of `train --model classify` on text");
  t.add("text", &c->text, "TEXT", "one input");
  t.add("input", &c->input, "FILE", "inputs, one per line");
  t.add("output", &c->output, "FILE",
        "write the labels here, one line per input (default: stdout)");
  t.add("top", &c->top, "K", "labels printed per input, best first");
  t.add("batch", &c->batch, "N", "lines scored at a time");
  add_device_choice(t, &c->device,
                    "where the model scores (cuda: the first visible GPU, in the run's precision; "
                    "cpu: fp32; auto: cuda where a GPU is visible, the CPU otherwise)");
  add_cpu_flags(t, &c->threads, "CPU threads (0: all cores)", &c->blas_core);
}

void finish_classify(const std::set<std::string>& /*given*/, ClassifyConfig* cfg) {
  if (cfg->checkpoint.empty()) usage_error("--checkpoint", "required: the classifier to use");
  require_file("--checkpoint", cfg->checkpoint);
  if (cfg->text.empty() == cfg->input.empty()) {
    usage_error("--input", "give one of --text TEXT or --input FILE");
  }
  if (!cfg->input.empty()) require_file("--input", cfg->input);
  if (!cfg->output.empty()) require_output_file("--output", cfg->output);
  require_at_least("--top", cfg->top, 1);
  require_at_least("--batch", cfg->batch, 1);
  settle_device(&cfg->device, &cfg->device_choice);
  validate_device(cfg->device, Precision::kFp32, false, cfg->threads, cfg->blas_core,
                  AttentionPath::kAuto);
}

constexpr CommandFlags<ClassifyConfig> kClassifyFlags{
    .synopsis = kClassifySynopsis, .add = add_classify_flags, .finish = finish_classify};

}  // namespace

bool parse_classify_options(const std::vector<std::string>& args, ClassifyConfig* cfg,
                            std::ostream& out) {
  return parse_command(args, kClassifyFlags, cfg, out);
}

}  // namespace mpiformer
