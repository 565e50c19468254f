// `mpiformer generate`'s flags.
#include <set>
#include <string>
#include <vector>

#include "src/app/flags.h"
#include "src/app/options.h"
#include "src/app/shared_options.h"
#include "src/core/error.h"

namespace mpiformer {
namespace {

constexpr const char* kGenerateSynopsis =
    "mpiformer generate --checkpoint FILE (--prompt TEXT | --input FILE) [flags]\n"
    "mpiformer generate --checkpoint FILE --data DIR [--split test|valid] [--references REF]\n"
    "                   [--output HYP] [flags]\n"
    "seq2seq: translates each input (greedy, or beam search with --beam N); lm: continues each\n"
    "prompt (greedy, beam, or top-k sampling with --top-k K). Text goes through the tokenizer\n"
    "kept in the checkpoint; a checkpoint of a synthetic task reads and writes token ids.\n"
    "With --data, a seq2seq checkpoint translates the source sentences of a split in order and\n"
    "--references gets their targets, so that `sacrebleu REF < HYP` scores the output.\n"
    "Inputs decode many at a time, shortest first, each finished one making room for the\n"
    "next, written back in input order; under mpirun the ranks share the inputs and rank 0\n"
    "writes the output.";

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
  t.add("min-new-tokens", &c->min_new_tokens, "N",
        "tokens to produce at least before EOS may end a line (up to --max-new-tokens)");
  t.add("top-k", &c->top_k, "K", "lm: sample among the K most likely tokens (0: no sampling)");
  t.add("temperature", &c->temperature, "T", "sampling temperature");
  t.add("seed", &c->seed, "S", "seed of the sampling");
  t.add("max-tokens", &c->max_tokens, "N",
        "sentences decode together while their key/value cache fits N rows (a sentence takes "
        "its prompt plus beam x its longest output)");
  t.add("cache", &c->cache, "BOOL",
        "keep each layer's keys and values between steps (false: recompute every prefix at "
        "every step, the slow reference; the same output)");
  add_device_choice(t, &c->device,
                    "where the model runs (cuda: the GPU of the rank's local rank; the CPU gives "
                    "the same tokens alone or with others, a GPU to rounding; auto: cuda where a "
                    "GPU is visible, the CPU otherwise)");
  add_precision_choice(t, &c->precision,
                       "precision of the weights' compute copy and of the activations (bf16, "
                       "fp16: faster on a GPU; where two tokens come near a tie, another may win)");
  add_cpu_flags(t, &c->threads, "CPU threads (0: all cores)", &c->blas_core);
  t.add_switch("profile", &c->profile,
               "also time decoding's ops by family (GEMM, attention, ...) and print a table of a "
               "step's time on stderr");
}

void finish_generate(const std::set<std::string>& given, GenerateConfig* cfg) {
  if (cfg->checkpoint.empty())
    usage_error("--checkpoint", "required: the checkpoint to decode with");
  require_file("--checkpoint", cfg->checkpoint);
  const int sources = !cfg->prompt.empty() + !cfg->input.empty() + !cfg->data_dir.empty();
  if (sources != 1) usage_error("--input", "give one of --prompt TEXT, --input FILE or --data DIR");
  if (!cfg->input.empty()) require_file("--input", cfg->input);
  if (cfg->data_dir.empty()) {
    if (given.count("split")) usage_error("--split", "only with --data DIR");
    if (!cfg->references.empty()) {
      usage_error("--references", "only with --data DIR, whose split holds the references");
    }
  } else {
    require_directory("--data", cfg->data_dir);
    if (!cfg->references.empty() && cfg->references == cfg->output) {
      usage_error("--references", "the same file as --output");
    }
    if (!cfg->references.empty()) require_output_file("--references", cfg->references);
  }
  if (!cfg->output.empty()) require_output_file("--output", cfg->output);
  require_at_least("--beam", cfg->beam, 1);
  require_at_least("--max-new-tokens", cfg->max_new_tokens, 0);
  require_at_least("--min-new-tokens", cfg->min_new_tokens, 0);
  if (cfg->max_new_tokens > 0 && cfg->min_new_tokens > cfg->max_new_tokens)
    usage_error("--min-new-tokens",
                "more than --max-new-tokens " + std::to_string(cfg->max_new_tokens));
  require_at_least("--top-k", cfg->top_k, 0);
  require_at_least("--max-tokens", cfg->max_tokens, 1);
  settle_device(&cfg->device, &cfg->device_choice);
  validate_device(cfg->device, cfg->precision, false, cfg->threads, cfg->blas_core,
                  AttentionPath::kAuto);
  require_positive("--temperature", cfg->temperature);
  require_non_negative("--length-alpha", cfg->length_alpha);
  if (cfg->top_k > 0 && cfg->beam > 1) usage_error("--top-k", "sampling takes no --beam");
}

constexpr CommandFlags<GenerateConfig> kGenerateFlags{
    .synopsis = kGenerateSynopsis, .add = add_generate_flags, .finish = finish_generate};

}  // namespace

bool parse_generate_options(const std::vector<std::string>& args, GenerateConfig* cfg,
                            std::ostream& out) {
  return parse_command(args, kGenerateFlags, cfg, out);
}

}  // namespace mpiformer
