// `train --arch NAME`: named sets of train flags (model kind and shape,
// dropout, norm position, activation, positions, output bias, label
// smoothing, and the optimizer and schedule where the reference recipe sets
// them). A preset only fills in: a flag given on the command line or in
// --config wins over it, except --model, which must agree with a preset
// that names a kind. config.ini records `arch = NAME` and every effective
// value, so a run resumed or repeated from its config.ini gets the same
// model whatever the preset later becomes.
#pragma once

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "src/app/flags.h"

namespace mpiformer {

struct ArchPreset {
  const char* name;
  const char* origin;  // the model and the recipe its values come from
  // Flag names (no dashes) and values, each as config.ini writes it.
  std::vector<std::pair<const char*, const char*>> flags;
};

// Every preset, in the order --help lists them.
const std::vector<ArchPreset>& arch_presets();

// The preset called `name`; nullptr for any other name.
const ArchPreset* find_arch_preset(const std::string& name);

// The presets and their flags as --help and `--arch list` print them.
std::string arch_preset_table();

// Parses preset `arch`'s flags ("" : none) into the fields `table` binds,
// each where `given` does not name it. Returns `given` with the preset's
// flags added: for the defaults that depend on what was given (--layers for
// both seq2seq stacks, label smoothing by kind), a preset's value counts as
// given. Throws UsageError for an unknown name (listing the presets) and
// for a --model given against a preset of another kind.
std::set<std::string> apply_arch_preset(const FlagTable& table, const std::set<std::string>& given,
                                        const std::string& arch);

}  // namespace mpiformer
