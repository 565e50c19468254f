// Command-line parsing for every sub-command (Boost.Program_options). Every
// flag may also come from --config FILE (INI); the command line wins. Bad
// flags or values throw UsageError naming the flag and what is allowed.
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

#include "src/core/config.h"

namespace mpiformer {

// Returns false (after printing help to `out`) when --help was given.
bool parse_train_options(const std::vector<std::string>& args, TrainConfig* cfg, std::ostream& out);
bool parse_bench_options(const std::vector<std::string>& args, BenchConfig* cfg, std::ostream& out);

// The effective configuration as INI, re-usable with --config.
std::string train_config_ini(const TrainConfig& cfg);

// Checks that hold for any model: sizes positive, heads dividing d-model,
// dropout and label smoothing in range. Throws UsageError.
void validate_model(const ModelConfig& m);

}  // namespace mpiformer
