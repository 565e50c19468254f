// The machinery every command's flags share: a table binds each flag to a
// field of the command's configuration; one call parses the command line and
// --config FILE (INI) into it, prints --help, and refuses unknown, repeated or
// bad flags with a UsageError naming the flag. A command's own file
// (train_options.cpp, ...) holds only its table and its checks.
#pragma once

#include <charconv>
#include <cmath>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <optional>
#include <ostream>
#include <set>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include "src/core/error.h"

namespace mpiformer {

// 's' in single quotes, as messages show a value. Files that call it leave
// <filesystem> out: its std::quoted would be found by argument-dependent
// lookup beside this one.
std::string quoted(const std::string& s);

// Shortest text that reads back to the same value, so config.ini round-trips.
template <class T>
std::string format_number(T value) {
  char buf[64];
  const auto result = std::to_chars(buf, buf + sizeof(buf), value);
  return std::string(buf, result.ptr);
}

// ---- value parsers: every value arrives as text, so we own the messages ----

template <class T>
T parse_integer(const std::string& flag, const std::string& text) {
  T value{};
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec == std::errc::result_out_of_range) usage_error(flag, "out of range; got " + quoted(text));
  if (ec != std::errc() || ptr != end || text.empty()) {
    usage_error(flag, std::string(std::is_signed_v<T> ? "expected an integer"
                                                      : "expected a non-negative integer") +
                          "; got " + quoted(text));
  }
  return value;
}

template <class T>
T parse_real(const std::string& flag, const std::string& text) {
  T value{};
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end || text.empty() || !std::isfinite(value)) {
    usage_error(flag, "expected a finite number; got " + quoted(text));
  }
  return value;
}

bool parse_bool(const std::string& flag, const std::string& text);

std::vector<int> parse_increasing_list(const std::string& flag, const std::string& text);

// "a, b or c"
std::string list_choices(const std::vector<std::string>& names);

// ---- the flag table --------------------------------------------------------

// One flag bound to a field of the configuration being parsed: how to read a
// value into it and how to write the field back out (help defaults and
// config.ini). One table drives parsing, help and the INI writer, so the three
// cannot drift apart.
struct Flag {
  std::string name;  // without dashes
  std::string value_name;
  std::string help;
  std::string group;
  std::function<void(const std::string&)> parse;  // throws UsageError
  // The field as text; empty when unset (no default shown, not written).
  std::function<std::string()> show;
  bool is_switch = false;  // "--name" alone means true
};

class FlagTable {
 public:
  void group(std::string title) { group_ = std::move(title); }

  template <class T>
  void add(const char* name, T* field, const char* value_name, const char* help) {
    const std::string flag = std::string("--") + name;
    Flag f{name, value_name, help, group_, {}, {}};
    if constexpr (std::is_same_v<T, bool>) {
      f.parse = [field, flag](const std::string& s) { *field = parse_bool(flag, s); };
      f.show = [field] { return std::string(*field ? "true" : "false"); };
    } else if constexpr (std::is_same_v<T, std::string>) {
      f.parse = [field](const std::string& s) { *field = s; };
      f.show = [field] { return *field; };
    } else if constexpr (std::is_integral_v<T>) {
      f.parse = [field, flag](const std::string& s) { *field = parse_integer<T>(flag, s); };
      f.show = [field] { return std::to_string(*field); };
    } else {
      static_assert(std::is_floating_point_v<T>);
      f.parse = [field, flag](const std::string& s) { *field = parse_real<T>(flag, s); };
      f.show = [field] { return format_number(*field); };
    }
    flags_.push_back(std::move(f));
  }

  // Comma-separated increasing positive integers ("8,16,32"); empty: unset.
  void add_increasing_list(const char* name, std::vector<int>* field, const char* value_name,
                           const char* help);

  void add_switch(const char* name, bool* field, const char* help);

  // An enumerated value written as one of `choices`; a value outside them
  // (such as SyntheticTask::kNone) shows as unset.
  template <class E>
  void add_choice(const char* name, E* field, std::vector<std::pair<std::string, E>> choices,
                  const char* help) {
    const std::string flag = std::string("--") + name;
    std::vector<std::string> names;
    for (const auto& c : choices) names.push_back(c.first);
    Flag f{name, list_choices_bar(names), help, group_, {}, {}};
    f.parse = [field, flag, choices, names](const std::string& s) {
      for (const auto& [text, value] : choices) {
        if (s == text) {
          *field = value;
          return;
        }
      }
      usage_error(flag, "expected " + list_choices(names) + "; got " + quoted(s));
    };
    f.show = [field, choices] {
      for (const auto& [text, value] : choices) {
        if (*field == value) return text;
      }
      return std::string();
    };
    flags_.push_back(std::move(f));
  }

  const std::vector<Flag>& flags() const { return flags_; }

 private:
  static std::string list_choices_bar(const std::vector<std::string>& names);

  std::vector<Flag> flags_;
  std::string group_;
};

// ---- parsing ---------------------------------------------------------------

// Parses the command line and --config into the fields bound by `table`;
// --help (or -h) prints `synopsis` and the table's help to `out`. Returns the
// names of the flags given explicitly, or nullopt after --help.
std::optional<std::set<std::string>> parse_flags(const std::vector<std::string>& args,
                                                 const FlagTable& table, const char* synopsis,
                                                 std::string* config_file, std::ostream& out);

// What a command's parse needs besides its arguments.
template <class Config>
struct CommandFlags {
  const char* synopsis;  // --help's "Usage: " lines
  // The configuration before any flag is read; its values are the defaults
  // --help shows.
  Config (*initial)() = [] { return Config{}; };
  // Binds the command's flags to the fields of `cfg`.
  void (*add)(FlagTable& table, Config* cfg) = nullptr;
  // Once the flags are read: values that depend on others, then the checks
  // (throwing UsageError). `given` names the flags given explicitly.
  void (*finish)(const std::set<std::string>& given, Config* cfg) = nullptr;
  // Where the configuration keeps --config's path (nullptr: nowhere).
  std::string Config::*config_file = nullptr;
  // Text --help prints after the flags (nullptr: none).
  std::string (*epilog)() = nullptr;
};

// The parse of every command: `command.initial()` into *cfg, its flags from
// `args` and --config, then `command.finish`. Returns false (after printing
// help to `out`) when --help was given.
template <class Config>
bool parse_command(const std::vector<std::string>& args, const CommandFlags<Config>& command,
                   Config* cfg, std::ostream& out) {
  *cfg = command.initial();
  FlagTable table;
  command.add(table, cfg);
  std::string config_file;
  const auto given =
      parse_flags(args, table, command.synopsis,
                  command.config_file ? &(cfg->*command.config_file) : &config_file, out);
  if (!given) {
    if (command.epilog) out << command.epilog();
    return false;
  }
  command.finish(*given, cfg);
  return true;
}

// Reads an INI text like --config into the fields bound by `table`; `source`
// names it in the errors of its form (an unknown key), while a bad value is
// the flag's own UsageError (flag() and reason() set), for the caller to
// name its source. Throws UsageError.
void read_ini(const FlagTable& table, const std::string& ini, const std::string& source);

// The text of `key`'s value in an INI text, as written; "" when absent.
std::string ini_value(const std::string& ini, const std::string& key);

// The fields bound by `table` as INI text: the comment line `header`, then
// each group under a comment naming it; unset fields are left out.
std::string write_ini(const FlagTable& table, const std::string& header);

// A flag's value (`name` without dashes) from the command line or from its
// --config file, read before anything else; empty when not given. Parsing
// proper reports whatever else is wrong with either.
std::string early_flag_value(const std::vector<std::string>& args, const std::string& name);

// ---- validation ------------------------------------------------------------

void require_at_least(const char* flag, int64_t value, int64_t least);

// [least, most].
void require_between(const char* flag, int64_t value, int64_t least, int64_t most);

// `path` names an existing regular file.
void require_file(const char* flag, const std::string& path);

void require_directory(const char* flag, const std::string& path);

// `path` can be written: its directory exists and takes new files (outputs
// are written beside under a temporary name), and it is not a directory
// nor a file the user may not write.
void require_output_file(const char* flag, const std::string& path);

void require_non_negative(const char* flag, double value);

void require_positive(const char* flag, double value);

// [0, 1): probabilities that may be zero but must leave something.
void require_unit_interval(const char* flag, double value);

}  // namespace mpiformer
