#include "src/app/flags.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <ostream>
#include <sstream>

namespace mpiformer {

namespace po = boost::program_options;

std::string quoted(const std::string& s) {
  return "'" + s + "'";
}

bool parse_bool(const std::string& flag, const std::string& text) {
  if (text == "true" || text == "yes" || text == "on" || text == "1") return true;
  if (text == "false" || text == "no" || text == "off" || text == "0") return false;
  usage_error(flag, "expected true or false; got " + quoted(text));
}

std::vector<int> parse_increasing_list(const std::string& flag, const std::string& text) {
  const auto refuse = [&] {
    usage_error(flag,
                "expected comma-separated increasing positive integers such as 8,16,32; got " +
                    quoted(text));
  };
  std::vector<int> values;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    std::string item = text.substr(at, comma - at);
    const size_t first = item.find_first_not_of(' '), last = item.find_last_not_of(' ');
    if (first == std::string::npos) refuse();
    item = item.substr(first, last - first + 1);
    int value = 0;
    const auto [ptr, ec] = std::from_chars(item.data(), item.data() + item.size(), value);
    if (ec != std::errc() || ptr != item.data() + item.size() || value <= 0) refuse();
    if (!values.empty() && value <= values.back()) refuse();
    values.push_back(value);
    at = comma + 1;
  }
  return values;
}

std::string list_choices(const std::vector<std::string>& names) {
  std::string s;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) s += (i + 1 == names.size()) ? " or " : ", ";
    s += names[i];
  }
  return s;
}

void FlagTable::add_increasing_list(const char* name, std::vector<int>* field,
                                    const char* value_name, const char* help) {
  const std::string flag = std::string("--") + name;
  Flag f{name, value_name, help, group_, {}, {}};
  f.parse = [field, flag](const std::string& s) { *field = parse_increasing_list(flag, s); };
  f.show = [field] {
    std::string text;
    for (int v : *field) {
      if (!text.empty()) text += ',';
      text += std::to_string(v);
    }
    return text;
  };
  flags_.push_back(std::move(f));
}

void FlagTable::add_switch(const char* name, bool* field, const char* help) {
  add(name, field, "[=true|false]", help);
  flags_.back().is_switch = true;
}

std::string FlagTable::list_choices_bar(const std::vector<std::string>& names) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "" : "|") + n;
  return s;
}

// ---- parsing ---------------------------------------------------------------

namespace {

constexpr unsigned kHelpWidth = 100;
// A config file is a page of flags: anything larger is not one.
constexpr uint64_t kConfigFileLimit = uint64_t{16} << 20;
constexpr char kUtf8Bom[] = "\xef\xbb\xbf";

// Builds Boost's view of the table; values stay text until Flag::parse.
po::options_description describe(const FlagTable& table) {
  po::options_description all;
  std::vector<std::pair<std::string, po::options_description>> groups;
  for (const Flag& f : table.flags()) {
    if (groups.empty() || groups.back().first != f.group) {
      groups.emplace_back(f.group, po::options_description(f.group, kHelpWidth, kHelpWidth / 2));
    }
    auto* value = po::value<std::string>()->value_name(f.value_name);
    const std::string shown = f.show();
    if (!shown.empty()) value->default_value(shown);
    // Empty implicit text keeps Boost from printing "[=arg(=true)]".
    if (f.is_switch) value->implicit_value("true", "");
    groups.back().second.add_options()(f.name.c_str(), value, f.help.c_str());
  }
  for (auto& [title, group] : groups) all.add(group);
  return all;
}

// Edit distance of two short names (a flag and a typo of it).
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::string trimmed(const std::string& s) {
  const size_t begin = s.find_first_not_of(" \t\r");
  if (begin == std::string::npos) return "";
  return s.substr(begin, s.find_last_not_of(" \t\r") - begin + 1);
}

// An INI key as Boost names it: "section.key" for a key under "[section]".
struct IniKey {
  std::string section;  // empty outside any [section]
  std::string name;
};

IniKey split_ini_key(const std::string& key) {
  const size_t dot = key.rfind('.');
  if (dot == std::string::npos) return {"", key};
  return {key.substr(0, dot), key.substr(dot + 1)};
}

// The line of `key` in the file (0: not found), with the sections as Boost
// reads them.
int line_of_key(const std::string& config_file, const IniKey& key) {
  int line_number = 0, current = 0;
  std::string current_section;
  std::ifstream in(config_file);
  for (std::string line; line_number == 0 && std::getline(in, line);) {
    ++current;
    const std::string t = trimmed(line);
    if (t.size() > 1 && t.front() == '[' && t.back() == ']') {
      current_section = trimmed(t.substr(1, t.size() - 2));
    } else if (const size_t eq = t.find('='); eq != std::string::npos) {
      if (current_section == key.section && trimmed(t.substr(0, eq)) == key.name) {
        line_number = current;
      }
    }
  }
  return line_number;
}

// The flag closest to `name`, at most 2 edits away; empty when none is.
std::string nearest_flag(const std::string& name, const po::options_description& flags) {
  std::string best;
  size_t best_distance = 3;
  for (const auto& option : flags.options()) {
    const std::string& candidate = option->long_name();
    const size_t d = edit_distance(name, candidate);
    if (d < best_distance) best = candidate, best_distance = d;
  }
  return best;
}

// The message for an unknown key of an INI file: where it is and what was
// probably meant. Boost names a key under "[section]" "section.key".
std::string unknown_key_message(const std::string& config_file, const std::string& key,
                                const po::options_description& flags) {
  const IniKey ini_key = split_ini_key(key);
  const std::string& section = ini_key.section;
  const std::string& name = ini_key.name;
  const auto known = [&](const std::string& n) { return flags.find_nothrow(n, false) != nullptr; };

  const int line_number = line_of_key(config_file, ini_key);
  std::string message = config_file;
  if (line_number > 0) message += " line " + std::to_string(line_number);
  message += ": unknown key " + quoted(name) + (section.empty() ? "" : " under [" + section + "]");

  std::string bare = name;
  bare.erase(0, bare.find_first_not_of('-'));
  if (!section.empty() && known(bare)) {
    return message + "; sections are not read: write '" + bare + " = ...' outside any [section]";
  }
  if (bare != name && known(bare)) {
    return message + "; keys are flag names without the dashes: '" + bare + " = ...'";
  }
  const std::string best = nearest_flag(bare, flags);
  if (!best.empty()) message += "; did you mean '" + best + "'?";
  if (!section.empty()) message += " (sections are not read; keys go outside any [section])";
  return message;
}

// Boost's messages repeat the option name; ours lead with it, once.
[[noreturn]] void rethrow_boost_error(const po::error& e, const std::string& config_file,
                                      const po::options_description* flags = nullptr) {
  const std::string where = config_file.empty() ? "" : " (in " + config_file + ")";
  const auto* named = dynamic_cast<const po::error_with_option_name*>(&e);
  std::string name = named ? named->get_option_name() : "";
  if (!config_file.empty() && !name.empty() && name.rfind("--", 0) != 0) name = "--" + name;
  if (dynamic_cast<const po::unknown_option*>(&e)) {
    // An INI file's key as written (store_ini passes the flags).
    if (!config_file.empty() && flags) {
      usage_error("--config", unknown_key_message(config_file, named->get_option_name(), *flags));
    }
    usage_error(name, "unknown flag (see --help)");
  }
  if (dynamic_cast<const po::multiple_occurrences*>(&e)) {
    usage_error(name, "given more than once" + where);
  }
  if (dynamic_cast<const po::invalid_command_line_syntax*>(&e) && !name.empty()) {
    usage_error(name, "needs a value" + where);
  }
  if (!config_file.empty()) usage_error("--config", config_file + ": " + e.what());
  if (!name.empty()) usage_error(name, e.what());
  throw UsageError(e.what());
}

void print_help(std::ostream& out, const char* synopsis, const po::options_description& flags) {
  out << "Usage: " << synopsis << "\n"
      << "Every flag may also come from --config FILE (INI, `name = value`); the command line "
         "wins.\n\n"
      << "General:\n"
      << "  --config FILE   read flags from an INI file\n"
      << "  --help          print this help\n"
      << flags;
}

// Whether `line` is UTF-8 text: no NUL or other control character but tab
// and CR, no malformed, overlong or surrogate sequence.
bool is_text_line(const std::string& line) {
  const auto* p = reinterpret_cast<const unsigned char*>(line.data());
  const auto* end = p + line.size();
  while (p < end) {
    const unsigned c = *p;
    if (c < 0x80) {
      if ((c < 0x20 && c != '\t' && c != '\r') || c == 0x7f) return false;
      ++p;
      continue;
    }
    const int extra = c >= 0xf0 ? 3 : c >= 0xe0 ? 2 : c >= 0xc0 ? 1 : -1;
    if (extra < 0 || c > 0xf4 || end - p <= extra) return false;
    uint32_t code = c & (0x3fu >> extra);
    for (int i = 1; i <= extra; ++i) {
      if ((p[i] & 0xc0) != 0x80) return false;
      code = (code << 6) | (p[i] & 0x3fu);
    }
    const uint32_t least[] = {0, 0x80, 0x800, 0x10000};
    if (code < least[extra] || code > 0x10ffff || (code >= 0xd800 && code <= 0xdfff)) return false;
    p += extra + 1;
  }
  return true;
}

// The text of a --config file. A directory would read as an empty file and
// be silently ignored; bytes that are not text would be echoed by the INI
// parser's messages, so the line is named instead.
std::string read_config_text(const std::string& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) == 0) {
    if (S_ISDIR(info.st_mode)) usage_error("--config", path + " is a directory");
    // A FIFO would block the reader, and a device (/dev/zero) never ends.
    if (!S_ISREG(info.st_mode))
      usage_error("--config", path + " is not a regular file (a FIFO, socket or device)");
    if (static_cast<uint64_t>(info.st_size) > kConfigFileLimit) {
      usage_error("--config",
                  path + " holds " + std::to_string(info.st_size) + " bytes, more than the " +
                      std::to_string(kConfigFileLimit >> 20) + " MiB a config file may");
    }
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) usage_error("--config", "cannot read " + quoted(path));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) usage_error("--config", "cannot read " + quoted(path));
  // Editors on some systems start UTF-8 text with a byte order mark.
  if (text.rfind(kUtf8Bom, 0) == 0) text.erase(0, sizeof(kUtf8Bom) - 1);
  size_t line = 1;
  for (size_t at = 0; at < text.size(); ++line) {
    const size_t end = std::min(text.find('\n', at), text.size());
    if (!is_text_line(text.substr(at, end - at))) {
      usage_error("--config", path + " line " + std::to_string(line) + " is not text");
    }
    at = end + 1;
  }
  return text;
}

// Adds the values of an INI text to `vm`. po::store keeps values already
// stored, so the command line wins.
void store_ini(std::istream& in, const po::options_description& flags, const std::string& source,
               po::variables_map* vm) {
  try {
    po::store(po::parse_config_file(in, flags), *vm);
  } catch (const po::error& e) {
    rethrow_boost_error(e, source, &flags);
  }
}

// Parses the stored values into the fields bound by `table`; returns the
// names given. A fault of a value from the INI text names `source`.
std::set<std::string> apply_flags(const FlagTable& table, const po::variables_map& vm,
                                  const std::set<std::string>& from_command_line,
                                  const std::string& source) {
  std::set<std::string> given;
  for (const Flag& f : table.flags()) {
    auto it = vm.find(f.name);
    if (it == vm.end() || it->second.defaulted()) continue;
    try {
      f.parse(it->second.as<std::string>());
    } catch (const UsageError& e) {
      if (from_command_line.count(f.name)) throw;
      throw UsageError(std::string(e.what()) + " (in " + source + ")");
    }
    given.insert(f.name);
  }
  return given;
}

}  // namespace

std::optional<std::set<std::string>> parse_flags(const std::vector<std::string>& args,
                                                 const FlagTable& table, const char* synopsis,
                                                 std::string* config_file, std::ostream& out) {
  po::options_description flags = describe(table);
  po::options_description command_line;
  command_line.add_options()("help", "")("config", po::value<std::string>(), "");
  command_line.add(flags);

  // Long options only: a value such as -3 is then a value, not a flag, and
  // no abbreviation guessing, because scripts rely on exact names.
  const int style = po::command_line_style::allow_long |
                    po::command_line_style::long_allow_adjacent |
                    po::command_line_style::long_allow_next;
  po::variables_map vm;
  try {
    po::parsed_options parsed =
        po::command_line_parser(args).options(command_line).style(style).run();
    for (const po::option& o : parsed.options) {
      if (o.string_key.empty()) {  // a positional token
        const std::string token = o.original_tokens.empty() ? "" : o.original_tokens.front();
        if (token == "-h") {
          print_help(out, synopsis, flags);
          return std::nullopt;
        }
        throw UsageError("unexpected argument " + quoted(token) +
                         " (flags are written --name VALUE; see --help)");
      }
    }
    po::store(parsed, vm);
  } catch (const po::error& e) {
    rethrow_boost_error(e, "");
  }
  if (vm.count("help")) {
    print_help(out, synopsis, flags);
    return std::nullopt;
  }

  std::set<std::string> from_command_line;
  for (const auto& [name, value] : vm) {
    if (!value.defaulted()) from_command_line.insert(name);
  }
  if (vm.count("config")) {
    *config_file = vm["config"].as<std::string>();
    std::istringstream in(read_config_text(*config_file));
    store_ini(in, flags, *config_file, &vm);
  }
  return apply_flags(table, vm, from_command_line, *config_file);
}

void read_ini(const FlagTable& table, const std::string& ini, const std::string& source) {
  po::options_description flags = describe(table);
  po::variables_map vm;
  std::istringstream in(ini);
  store_ini(in, flags, source, &vm);
  // A value's fault is the flag's own (as given on the command line): the
  // caller names the text it came from.
  std::set<std::string> every;
  for (const Flag& f : table.flags()) every.insert(f.name);
  apply_flags(table, vm, every, source);
}

std::string ini_value(const std::string& ini, const std::string& key) {
  std::istringstream in(ini);
  for (std::string line; std::getline(in, line);) {
    const size_t eq = line.find('=');
    if (eq != std::string::npos && trimmed(line.substr(0, eq)) == key) {
      return trimmed(line.substr(eq + 1));
    }
  }
  return "";
}

std::string write_ini(const FlagTable& table, const std::string& header) {
  std::ostringstream ini;
  ini << "# " << header << "\n";
  std::string group;
  for (const Flag& f : table.flags()) {
    const std::string value = f.show();
    if (value.empty()) continue;  // unset: --data without shards, --synthetic none
    if (f.group != group) {
      group = f.group;
      ini << "\n# " << group << "\n";
    }
    ini << f.name << " = " << value << "\n";
  }
  return ini.str();
}

std::string early_flag_value(const std::vector<std::string>& args, const std::string& name) {
  const std::string named = "--" + name;
  std::string value, config_file;
  for (size_t i = 0; i < args.size(); ++i) {
    for (auto [flag, field] : {std::pair{named.c_str(), &value}, {"--config", &config_file}}) {
      const std::string& arg = args[i];
      const std::string with_equals = std::string(flag) + "=";
      if (arg == flag && i + 1 < args.size()) *field = args[i + 1];
      if (arg.rfind(with_equals, 0) == 0) *field = arg.substr(with_equals.size());
    }
  }
  struct stat info {};
  const bool readable = ::stat(config_file.c_str(), &info) == 0 && S_ISREG(info.st_mode) &&
                        static_cast<uint64_t>(info.st_size) <= kConfigFileLimit;
  if (value.empty() && readable) {
    // Only this key; parsing proper reports what else is wrong with the file.
    po::options_description wanted;
    wanted.add_options()(name.c_str(), po::value<std::string>());
    po::variables_map vm;
    try {
      std::ifstream file(config_file, std::ios::binary);
      std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
      if (text.rfind(kUtf8Bom, 0) == 0) text.erase(0, sizeof(kUtf8Bom) - 1);
      std::istringstream in(text);
      po::store(po::parse_config_file(in, wanted, /*allow_unregistered=*/true), vm);
      if (vm.count(name)) value = vm[name].as<std::string>();
    } catch (const std::exception&) {  // a directory reads as an error
    }
  }
  return value;
}

// ---- validation ------------------------------------------------------------

void require_at_least(const char* flag, int64_t value, int64_t least) {
  if (value < least) {
    usage_error(flag, least == 1 ? "must be positive; got " + std::to_string(value)
                                 : "must be at least " + std::to_string(least) + "; got " +
                                       std::to_string(value));
  }
}

void require_between(const char* flag, int64_t value, int64_t least, int64_t most) {
  require_at_least(flag, value, least);
  if (value > most) {
    usage_error(flag, "must be at most " + std::to_string(most) + "; got " + std::to_string(value));
  }
}

void require_file(const char* flag, const std::string& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) usage_error(flag, path + ": no such file");
  if (!S_ISREG(info.st_mode)) usage_error(flag, path + ": not a file");
}

void require_directory(const char* flag, const std::string& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) usage_error(flag, path + ": no such directory");
  if (!S_ISDIR(info.st_mode)) usage_error(flag, path + ": not a directory");
}

void require_output_file(const char* flag, const std::string& path) {
  struct stat info {};
  const bool exists = ::stat(path.c_str(), &info) == 0;
  if (exists && S_ISDIR(info.st_mode)) usage_error(flag, path + ": is a directory");
  if (exists && ::access(path.c_str(), W_OK) != 0) {
    usage_error(flag, path + ": cannot be written (" + std::strerror(errno) + ")");
  }
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + (slash == 0));
  if (::stat(dir.c_str(), &info) != 0) {
    const int err = errno;
    const bool missing = err == ENOENT || err == ENOTDIR;
    usage_error(flag,
                path + ": its directory " + dir +
                    (missing ? " does not exist" : " (" + std::string(std::strerror(err)) + ")"));
  }
  if (!S_ISDIR(info.st_mode)) usage_error(flag, path + ": " + dir + " is not a directory");
  if (::access(dir.c_str(), W_OK) != 0) {
    usage_error(flag, path + ": cannot create files in " + dir + " (" + std::strerror(errno) + ")");
  }
}

void require_non_negative(const char* flag, double value) {
  if (value < 0) usage_error(flag, "must not be negative; got " + format_number(value));
}

void require_positive(const char* flag, double value) {
  if (!(value > 0)) usage_error(flag, "must be positive; got " + format_number(value));
}

void require_unit_interval(const char* flag, double value) {
  if (!(value >= 0 && value < 1))
    usage_error(flag, "must be in [0, 1); got " + format_number(value));
}

}  // namespace mpiformer
