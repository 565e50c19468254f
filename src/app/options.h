// Command-line parsing for every sub-command (Boost.Program_options). Every
// flag may also come from --config FILE (INI); the command line wins. Bad
// flags or values throw UsageError naming the flag and what is allowed.
//
// Each command's flag table and checks are in src/app/COMMAND_options.cpp;
// flags several commands take in shared_options.h; the parsing, help and
// INI machinery they all use in flags.h.
#pragma once

#include <iosfwd>
#include <set>
#include <string>
#include <vector>

#include "src/core/config.h"

namespace mpiformer {

// Returns false (after printing help to `out`) when --help was given.
bool parse_train_options(const std::vector<std::string>& args, TrainConfig* cfg, std::ostream& out);
bool parse_bench_options(const std::vector<std::string>& args, BenchConfig* cfg, std::ostream& out);
// `mpiformer prepare`. Without --vocab-size but with --tokenizer, vocab_size
// is 0: the model's own size.
bool parse_prepare_options(const std::vector<std::string>& args, PrepareConfig* cfg,
                           std::ostream& out);

bool parse_eval_options(const std::vector<std::string>& args, EvalConfig* cfg, std::ostream& out);
bool parse_classify_options(const std::vector<std::string>& args, ClassifyConfig* cfg,
                            std::ostream& out);
bool parse_generate_options(const std::vector<std::string>& args, GenerateConfig* cfg,
                            std::ostream& out);
// `mpiformer average`: the checkpoint files are the arguments that are no
// flag nor a flag's value.
bool parse_average_options(const std::vector<std::string>& args, AverageConfig* cfg,
                           std::ostream& out);

// --blas-core's value ("auto" when not given) from a command's arguments
// or its --config file, read before anything else (kernels/cpu/blas_kernels.h):
// parsing proper validates it later.
std::string requested_blas_core(const std::vector<std::string>& args);

// train's defaults that follow from the flags `given` (--layers for both
// seq2seq stacks, label smoothing by kind, a synthetic task's vocabulary),
// then train's checks of the values and of what they name on this machine:
// the shards' directory, the device and the BLAS kernels; the run
// directory's flags (--out, --resume) are train's alone. bench --data
// settles its flags with it, so it builds what train would of them. Throws
// UsageError.
void settle_training_flags(const std::set<std::string>& given, TrainConfig* cfg);

// The effective configuration as INI, re-usable with --config.
std::string train_config_ini(const TrainConfig& cfg);

// The configuration a run recorded (train_config_ini's text, e.g. a
// checkpoint's config attribute), read back like --config and held to the
// rules of train's flags that concern the values alone (not whether the
// shards, devices or files it names exist here). A file decides this text,
// so a value its flag would refuse is UsageError "PATH: config key 'heads' =
// 0: must be positive; got 0", `path` naming the file.
TrainConfig train_config_from_ini(const std::string& ini, const std::string& path);

// Checks that hold for any model: sizes positive, heads dividing d-model,
// dropout and label smoothing in range. vocab 0 means "from the shards" and
// passes only with vocab_from_data. Throws UsageError.
void validate_model(const ModelConfig& m, bool vocab_from_data = false);

}  // namespace mpiformer
