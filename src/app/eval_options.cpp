// `mpiformer eval`'s flags.
#include <set>
#include <string>
#include <vector>

#include "src/app/flags.h"
#include "src/app/options.h"
#include "src/app/shared_options.h"
#include "src/core/error.h"

namespace mpiformer {
namespace {

constexpr const char* kEvalSynopsis =
    "mpiformer eval --checkpoint FILE --data DIR [--split valid|test] [flags]\n"
    "Global loss, perplexity and token accuracy of the checkpoint on a split of DIR's shards\n"
    "(valid by default), split over the MPI ranks like training.";

void add_eval_flags(FlagTable& t, EvalConfig* c) {
  t.group("Evaluation");
  t.add("checkpoint", &c->checkpoint, "FILE", "a checkpoint written by mpiformer train");
  t.add("data", &c->data_dir, "DIR", "shards of the same vocabulary");
  t.add_choice("split", &c->split, {{"valid", std::string("valid")}, {"test", std::string("test")}},
               "the split of --data to evaluate (test: from prepare --test or --test-lines)");
  t.add("max-tokens", &c->max_tokens, "T", "padded tokens per batch (0: the run's)");
  t.add("batches", &c->batches, "N", "evaluation batches (0: all)");
  add_device_choice(t, &c->device,
                    "where the model runs: cuda in the run's precision on the GPU of the rank's "
                    "local rank, cpu in fp32 (auto: cuda where a GPU is visible, the CPU "
                    "otherwise)");
  add_cpu_flags(t, &c->threads, "CPU threads per rank (0: the node's cores shared)", &c->blas_core);
}

void finish_eval(const std::set<std::string>& /*given*/, EvalConfig* cfg) {
  if (cfg->checkpoint.empty()) usage_error("--checkpoint", "required: the checkpoint to evaluate");
  require_file("--checkpoint", cfg->checkpoint);
  if (cfg->data_dir.empty()) usage_error("--data", "required: a directory of shards");
  require_directory("--data", cfg->data_dir);
  require_at_least("--max-tokens", cfg->max_tokens, 0);
  require_at_least("--batches", cfg->batches, 0);
  settle_device(&cfg->device, &cfg->device_choice);
  validate_device(cfg->device, Precision::kFp32, false, cfg->threads, cfg->blas_core,
                  AttentionPath::kAuto);
}

constexpr CommandFlags<EvalConfig> kEvalFlags{
    .synopsis = kEvalSynopsis, .add = add_eval_flags, .finish = finish_eval};

}  // namespace

bool parse_eval_options(const std::vector<std::string>& args, EvalConfig* cfg, std::ostream& out) {
  return parse_command(args, kEvalFlags, cfg, out);
}

}  // namespace mpiformer
