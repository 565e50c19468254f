// `mpiformer average`'s flags: the checkpoints are the arguments that are
// neither a flag nor a flag's value.
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "src/app/flags.h"
#include "src/app/options.h"
#include "src/core/error.h"
#include "src/io/checkpoint.h"

namespace mpiformer {
namespace {

constexpr const char* kAverageSynopsis =
    "mpiformer average --out FILE.h5 (CKPT.h5 CKPT.h5 ... | --run RUNDIR --last K)\n"
    "Writes a checkpoint whose weights are the element-wise mean of the given checkpoints' "
    "(summed\n"
    "in float64, rounded once to float32), all of one model. The optimizer moments and every\n"
    "attribute (step, config, vocabulary, run id) are the newest input's (the highest step); the\n"
    "attribute averaged_from lists the inputs. eval, generate and classify read it as any other.";

void add_average_flags(FlagTable& t, AverageConfig* c) {
  t.group("Average");
  t.add("out", &c->out, "FILE", "the checkpoint to write (written whole, then renamed into place)");
  t.add("run", &c->run_dir, "RUNDIR", "a run directory: average its newest --last checkpoints");
  t.add("last", &c->last, "K", "with --run: how many of its newest checkpoints");
}

void finish_average(const std::set<std::string>& /*given*/, AverageConfig* /*cfg*/) {}

constexpr CommandFlags<AverageConfig> kAverageFlags{
    .synopsis = kAverageSynopsis, .add = add_average_flags, .finish = finish_average};

// The flags that take no value.
bool is_bare_flag(const std::string& arg) {
  return arg == "--help" || arg.find('=') != std::string::npos;
}

void validate_average(const AverageConfig& c) {
  namespace fs = std::filesystem;
  if (c.out.empty()) usage_error("--out", "required: the averaged checkpoint to write");
  require_output_file("--out", c.out);
  // Pruning and --resume auto take step_*.h5 for checkpoints of training.
  if (checkpoint_step(c.out) >= 0) {
    usage_error("--out", c.out +
                             ": step_NNNNNNNN.h5 names a training checkpoint, which pruning and "
                             "--resume auto would take it for; choose another name");
  }
  if (!c.inputs.empty() && !c.run_dir.empty()) {
    usage_error("--run", "give checkpoint files or --run RUNDIR --last K, not both");
  }
  if (c.inputs.empty() && c.run_dir.empty()) {
    throw UsageError("no checkpoints given: CKPT.h5 CKPT.h5 ... or --run RUNDIR --last K");
  }
  if (!c.run_dir.empty()) {
    require_directory("--run", c.run_dir);
    if (c.last == 0) usage_error("--last", "required with --run: how many checkpoints to average");
    require_at_least("--last", c.last, 1);
  } else if (c.last != 0) {
    usage_error("--last", "only with --run RUNDIR");
  }
  std::error_code ec;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    require_file(c.inputs[i].c_str(), c.inputs[i]);
    for (size_t j = 0; j < i; ++j) {
      if (fs::equivalent(c.inputs[i], c.inputs[j], ec)) {
        throw UsageError(c.inputs[i] + ": given twice (as " + c.inputs[j] +
                         "), which would weigh it double");
      }
    }
    if (fs::equivalent(c.inputs[i], c.out, ec)) {
      usage_error("--out", c.out + " is one of the checkpoints to average; write a new file");
    }
  }
}

}  // namespace

bool parse_average_options(const std::vector<std::string>& args, AverageConfig* cfg,
                           std::ostream& out) {
  std::vector<std::string> flags, inputs;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg.rfind("--", 0) == 0) {
      flags.push_back(arg);
      if (!is_bare_flag(arg) && i + 1 < args.size()) flags.push_back(args[++i]);
    } else if (arg == "-h") {
      flags.push_back(arg);
    } else {
      inputs.push_back(arg);
    }
  }
  if (!parse_command(flags, kAverageFlags, cfg, out)) return false;
  cfg->inputs = inputs;
  validate_average(*cfg);
  return true;
}

}  // namespace mpiformer
