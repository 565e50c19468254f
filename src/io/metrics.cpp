// metrics.h5 in SWMR mode; see metrics.h.
#include "src/io/metrics.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <utility>

#include "src/core/own_file.h"
#include "src/io/atomic_file.h"
#include "src/io/hdf5_file.h"

namespace mpiformer {

namespace {

namespace fs = std::filesystem;
using hdf5::Faults;
using hdf5::Hid;

constexpr hsize_t kRowsPerChunk = 256;

// (name, integer) in file order; both groups end with a multi-label
// classifier's figures (LabelFigures), which only its files hold.
using Columns = std::vector<std::pair<const char*, bool>>;
Columns with_label_columns(Columns columns) {
  for (const char* name : {"micro_precision", "micro_recall", "micro_f1", "macro_precision",
                           "macro_recall", "macro_f1"})
    columns.emplace_back(name, false);
  return columns;
}
// clang-format off
const Columns kTrainColumns = with_label_columns({
    {"step", true},          {"loss", false},         {"tokens", true},
    {"accuracy", false},     {"lr", false},           {"grad_norm", false},
    {"tokens_per_s", false}, {"step_ms", false},      {"padding_efficiency", false},
    {"loss_scale", false},   {"nll", false},          {"elapsed_s", false},
    {"epoch", false},        {"comm_wait_ms", false}, {"hidden_share", false}});
const Columns kEvalColumns = [] {
  Columns columns = with_label_columns({
      {"step", true},   {"loss", false}, {"perplexity", false}, {"accuracy", false},
      {"tokens", true}, {"nll", false},  {"elapsed_s", false}});
  columns.emplace_back("bleu", false);  // seq2seq --valid-bleu
  return columns;
}();
// clang-format on
bool is_label_column(const std::string& name) {
  return name.rfind("micro_", 0) == 0 || name.rfind("macro_", 0) == 0;
}
// Columns every version has; later ones read as NaN when a file lacks them.
constexpr size_t kVersion1TrainColumns = 10, kVersion1EvalColumns = 5;

// metrics.jsonl beside metrics.h5.
std::string json_path_of(const std::string& path) {
  const fs::path p(path);
  return (p.parent_path() / (p.stem().string() + ".jsonl")).string();
}

Faults faults_of(const std::string& path) {
  return Faults::of<MetricsError>(path);
}

hsize_t length_of(hid_t dset) {
  Hid space(H5Dget_space(dset), H5Sclose);
  hsize_t n = 0;
  if (space.ok()) H5Sget_simple_extent_dims(space.get(), &n, nullptr);
  return n;
}

}  // namespace

namespace {

// Whether a row of the old file is carried: one of a step up to the one resumed.
bool kept(const std::vector<double>& row, int64_t keep_through_step) {
  return row[0] <= static_cast<double>(keep_through_step);
}

// The metrics.h5 to resume must be one HDF5 can read before read_metrics tries.
void check_resumable(const std::string& path, const Faults& faults) {
  hdf5::Session session;
  std::error_code ec;
  // A FIFO would block H5Fis_hdf5 until a writer came.
  if (!fs::is_regular_file(path, ec)) {
    faults.fail("not a regular file; move it away or choose another --out");
  }
  if (H5Fis_hdf5(path.c_str()) <= 0) {
    faults.fail("not an HDF5 file; move it away or choose another --out");
  }
}

// The rows a resumed run carries: metrics.h5's (resume), else metrics.jsonl's
// (from_json), else none.
MetricsTable rows_to_carry(const std::string& path, const std::string& json_path, bool resume,
                           bool from_json, const Faults& faults) {
  MetricsTable old;
  if (resume) {
    check_resumable(path, faults);
    try {
      old = read_metrics(path);
    } catch (const MetricsError& e) {
      throw MetricsError(std::string(e.what()) +
                         "; move it away to resume without the rows it held");
    }
  } else if (from_json) {
    // The same rows as lines: a deleted metrics.h5 is rebuilt, not begun anew.
    old = read_metrics_jsonl(json_path);
  }
  return old;
}

// MetricsLog::note(): which file was rebuilt from the other, or that neither
// was there to carry; "" for a new run or when both were there.
std::string carry_note(const std::string& path, const std::string& json_path,
                       const MetricsTable& old, int64_t keep_through_step, bool resume,
                       bool json_exists) {
  if (keep_through_step <= 0 || (resume && json_exists)) return "";
  const auto count = [&](const std::vector<std::vector<double>>& rows) {
    return std::to_string(std::count_if(
        rows.begin(), rows.end(),
        [&](const std::vector<double>& row) { return kept(row, keep_through_step); }));
  };
  const std::string rows_kept = count(old.train_rows) + " train and " + count(old.eval_rows) +
                                " eval row(s) through step " + std::to_string(keep_through_step);
  const std::string h5_name = fs::path(path).filename().string();
  const std::string json_name = fs::path(json_path).filename().string();
  if (resume) return json_name + " was missing: rebuilt from " + h5_name + " (" + rows_kept + ")";
  if (json_exists) {
    return h5_name + " was missing: rebuilt from " + json_name + " (" + rows_kept + ")";
  }
  return "no " + h5_name + " or " + json_name + " to carry: the rows through step " +
         std::to_string(keep_through_step) + " are not in this directory";
}

void write_resumed_at_steps(hid_t root, const std::vector<int64_t>& resumed, const Faults& faults) {
  const hsize_t dims[1] = {resumed.size()};
  const char* name = "resumed_at_steps";
  Hid space = faults.checked(H5Screate_simple(1, dims, nullptr), H5Sclose, name);
  Hid attr = faults.checked(
      H5Acreate2(root, name, H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose, name);
  if (!resumed.empty()) faults.check(H5Awrite(attr.get(), H5T_NATIVE_INT64, resumed.data()), name);
}

// The root attributes of a new metrics file (see metrics.h).
void write_root_attrs(hid_t root, const RunAttributes& attrs, const std::vector<int64_t>& resumed,
                      const Faults& faults) {
  hdf5::write_string_attr(root, "format", kMetricsFormat, faults);
  const int version = kMetricsVersion;
  hdf5::write_int_attr(root, "version", H5T_STD_I32LE, H5T_NATIVE_INT, &version, faults);
  hdf5::write_int_attr(root, "world_size", H5T_STD_I32LE, H5T_NATIVE_INT, &attrs.world_size,
                       faults);
  hdf5::write_string_attr(root, "config", attrs.config, faults);
  hdf5::write_string_attr(root, "model", attrs.model, faults);
  hdf5::write_string_attr(root, "devices", attrs.devices, faults);
  hdf5::write_string_attr(root, "versions", attrs.versions, faults);
  hdf5::write_string_attr(root, "git_commit", attrs.git_commit, faults);
  if (!attrs.run_id.empty()) hdf5::write_string_attr(root, "run_id", attrs.run_id, faults);
  write_resumed_at_steps(root, resumed, faults);
}

}  // namespace

MetricsLog::MetricsLog(const std::string& path, const RunAttributes& attrs,
                       int64_t keep_through_step)
    : path_(path) {
  const Faults faults = faults_of(path);
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (fs::is_directory(status)) faults.fail("is a directory, not a metrics file");
  // Resuming: the rows up to the resumed step are carried into a new file.
  // Rewriting rather than reopening also recovers the file of a writer that
  // was killed, which HDF5 leaves marked as open for writing.
  const bool resume = keep_through_step >= 0 && fs::exists(status);
  const std::string json_path = json_path_of(path);
  const bool json_exists = fs::exists(json_path, ec);
  // Resuming without metrics.h5: it is rebuilt from metrics.jsonl's rows.
  const bool from_json = !resume && keep_through_step >= 0 && json_exists;
  const MetricsTable old = rows_to_carry(path, json_path, resume, from_json, faults);
  note_ = carry_note(path, json_path, old, keep_through_step, resume, json_exists);
  hdf5::Session session;
  const std::string target = resume ? temporary_name(path) : path;
  const std::string json_target = temporary_name(json_path);
  // The newest file format: SWMR needs it.
  Hid fapl = faults.checked(H5Pcreate(H5P_FILE_ACCESS), H5Pclose, "the file");
  faults.check(H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_LATEST, H5F_LIBVER_LATEST), "the file");
  Hid file = hdf5::create_anew(target, fapl.get(), faults);
  if (!file.ok()) faults.fail_corrupt("create " + target);
  std::vector<int64_t> resumed = old.resumed_at_steps;
  if (resume || from_json) resumed.push_back(keep_through_step);
  write_root_attrs(file.get(), attrs, resumed, faults);

  file_ = file.release();  // closed by close_all() from here on
  try {
    open_columns("train", kTrainColumns, attrs, &train_);
    open_columns("eval", kEvalColumns, attrs, &eval_);
    write_kept_rows(old, keep_through_step);
    rewrite_json(json_target, old, keep_through_step);
    faults.check(H5Fstart_swmr_write(file_), "the file (start SWMR writing)");
    if (resume && std::rename(target.c_str(), path.c_str()) != 0) {
      faults.fail_errno("cannot replace it with " + target);
    }
  } catch (...) {
    close_all();
    if (resume) fs::remove(target, ec);
    fs::remove(json_target, ec);
    throw;
  }
}

void MetricsLog::write_kept_rows(const MetricsTable& old, int64_t keep_through_step) {
  for (const std::vector<double>& row : old.train_rows)
    if (kept(row, keep_through_step)) write_row(train_, &train_rows_, row);
  for (const std::vector<double>& row : old.eval_rows)
    if (kept(row, keep_through_step)) write_row(eval_, &eval_rows_, row);
}

// metrics.jsonl is rewritten from the rows kept: it follows the branch. The
// lines go to json_target, renamed over metrics.jsonl once all are written.
void MetricsLog::rewrite_json(const std::string& json_target, const MetricsTable& old,
                              int64_t keep_through_step) {
  const Faults faults = faults_of(path_);
  const std::string json_path = json_path_of(path_);
  open_json(json_target);
  for (const std::vector<double>& row : old.train_rows) {
    if (!kept(row, keep_through_step)) continue;
    append_json("train", train_, row);
    const double elapsed = row[11];  // elapsed_s (kTrainColumns)
    if (std::isfinite(elapsed)) elapsed_before_ = elapsed;
  }
  for (const std::vector<double>& row : old.eval_rows)
    if (kept(row, keep_through_step)) append_json("eval", eval_, row);
  if (std::fflush(json_) != 0 || std::rename(json_target.c_str(), json_path.c_str()) != 0)
    faults.fail_errno("cannot write " + json_path);
}

// json_ on json_target, created anew (create_new_file: never through a link).
void MetricsLog::open_json(const std::string& json_target) {
  const Faults faults = faults_of(path_);
  std::string why;
  const int json_fd = create_new_file(json_target, &why);
  if (json_fd < 0) faults.fail("cannot create " + json_target + ": " + why);
  json_ = ::fdopen(json_fd, "w");
  if (json_ == nullptr) {
    ::close(json_fd);
    faults.fail_errno("cannot create " + json_target);
  }
}

MetricsLog::~MetricsLog() {
  hdf5::Session session;
  close_all();
}

void MetricsLog::close_all() noexcept {
  for (std::vector<Column>* columns : {&train_, &eval_}) {
    for (Column& c : *columns)
      if (c.id >= 0) H5Dclose(c.id);
    columns->clear();
  }
  if (file_ >= 0) H5Fclose(file_);
  file_ = H5I_INVALID_HID;
  if (json_ != nullptr) std::fclose(json_);
  json_ = nullptr;
}

void MetricsLog::append_json(const char* group, const std::vector<Column>& columns,
                             const std::vector<double>& values) {
  std::string line = std::string("{\"group\": \"") + group + "\"";
  char buf[64];
  for (size_t i = 0; i < columns.size(); ++i) {
    const std::string& name = columns[i].name;
    line += ", \"" + name.substr(name.find('/') + 1) + "\": ";
    const double value = values[columns[i].source];
    if (!std::isfinite(value)) {
      line += "null";
    } else if (columns[i].integer) {
      line += std::to_string(static_cast<long long>(value));
    } else {
      std::snprintf(buf, sizeof buf, "%.17g", value);
      line += buf;
    }
  }
  line += "}\n";
  if (std::fputs(line.c_str(), json_) < 0 || std::fflush(json_) != 0)
    faults_of(json_path_of(path_)).fail_errno("cannot append a row");
}

void MetricsLog::open_columns(const char* group,
                              const std::vector<std::pair<const char*, bool>>& names,
                              const RunAttributes& attrs, std::vector<Column>* columns) {
  const Faults faults = faults_of(path_);
  Hid g = faults.checked(H5Gcreate2(file_, group, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose,
                         std::string("group /") + group);
  for (size_t source = 0; source < names.size(); ++source) {
    const auto& [name, integer] = names[source];
    if (!attrs.label_figures && is_label_column(name)) continue;
    if (!attrs.valid_bleu && std::string(name) == "bleu") continue;
    Column c{std::string(group) + "/" + name, H5I_INVALID_HID, integer, source};
    const hsize_t dims[1] = {0}, maxdims[1] = {H5S_UNLIMITED};
    Hid space = faults.checked(H5Screate_simple(1, dims, maxdims), H5Sclose, c.name);
    // Fletcher32 on every chunk: a flipped loss is refused, never plotted.
    Hid dcpl = hdf5::checksummed_chunks({kRowsPerChunk}, faults, c.name);
    c.id = H5Dcreate2(g.get(), name, integer ? H5T_STD_I64LE : H5T_IEEE_F64LE, space.get(),
                      H5P_DEFAULT, dcpl.get(), H5P_DEFAULT);
    if (c.id < 0) faults.fail_corrupt("create /" + c.name);
    columns->push_back(c);
  }
}

void MetricsLog::append_row(std::vector<Column>& columns, hsize_t* rows,
                            const std::vector<double>& values) {
  hdf5::Session session;
  write_row(columns, rows, values);
  faults_of(path_).check(H5Fflush(file_, H5F_SCOPE_LOCAL), "the file");
  append_json(&columns == &train_ ? "train" : "eval", columns, values);
}

void MetricsLog::write_row(std::vector<Column>& columns, hsize_t* rows,
                           const std::vector<double>& values) {
  const Faults faults = faults_of(path_);
  const hsize_t at[1] = {*rows}, one[1] = {1}, grown[1] = {*rows + 1};
  Hid memory = faults.checked(H5Screate_simple(1, one, nullptr), H5Sclose, "a row");
  for (size_t i = 0; i < columns.size(); ++i) {
    const Column& c = columns[i];
    faults.check(H5Dset_extent(c.id, grown), "/" + c.name);
    Hid space = faults.checked(H5Dget_space(c.id), H5Sclose, "/" + c.name);
    faults.check(H5Sselect_hyperslab(space.get(), H5S_SELECT_SET, at, nullptr, one, nullptr),
                 "/" + c.name);
    const int64_t as_int = static_cast<int64_t>(values[c.source]);
    faults.check(H5Dwrite(c.id, c.integer ? H5T_NATIVE_INT64 : H5T_NATIVE_DOUBLE, memory.get(),
                          space.get(), H5P_DEFAULT,
                          c.integer ? static_cast<const void*>(&as_int)
                                    : static_cast<const void*>(&values[c.source])),
                 "/" + c.name);
  }
  ++*rows;
}

namespace {

// `values` followed by the label figures, in the columns' order.
std::vector<double> with_labels(std::vector<double> values, const LabelFigures& l) {
  values.insert(values.end(), {l.micro_precision, l.micro_recall, l.micro_f1, l.macro_precision,
                               l.macro_recall, l.macro_f1});
  return values;
}

}  // namespace

void MetricsLog::append(const TrainRow& r) {
  append_row(
      train_, &train_rows_,
      with_labels({static_cast<double>(r.step), r.loss, static_cast<double>(r.tokens), r.accuracy,
                   r.lr, r.grad_norm, r.tokens_per_s, r.step_ms, r.padding_efficiency, r.loss_scale,
                   r.nll, r.elapsed_s, r.epoch, r.comm_wait_ms, r.hidden_share},
                  r.labels));
}

void MetricsLog::append(const EvalRow& r) {
  std::vector<double> values =
      with_labels({static_cast<double>(r.step), r.loss, r.perplexity, r.accuracy,
                   static_cast<double>(r.tokens), r.nll, r.elapsed_s},
                  r.labels);
  values.push_back(r.bleu);
  append_row(eval_, &eval_rows_, values);
}

namespace {

// Reads every column of `group` into rows of the shortest column's length.
// The first `required` columns must exist; a later one that a file of an
// older version lacks reads as NaN.
void read_group(hid_t file, const char* group,
                const std::vector<std::pair<const char*, bool>>& names, size_t required,
                const Faults& faults, std::vector<std::string>* columns,
                std::vector<std::vector<double>>* rows) {
  std::vector<std::vector<double>> data;
  std::vector<size_t> missing;
  size_t n = SIZE_MAX;
  for (const auto& [name, integer] : names) {
    const std::string where = std::string("/") + group + "/" + name;
    if (!hdf5::link_exists(file, where, faults)) {
      if (data.size() < required) faults.fail("missing dataset " + where);
      missing.push_back(data.size());
      columns->push_back(name);
      data.emplace_back();
      continue;
    }
    Hid dset(H5Dopen2(file, where.c_str(), H5P_DEFAULT), H5Dclose);
    if (!dset.ok()) faults.fail_corrupt("open " + where);
    std::vector<double> values(length_of(dset.get()));
    if (!values.empty() &&
        H5Dread(dset.get(), H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()) < 0) {
      faults.fail_corrupt("read " + where);
    }
    n = std::min(n, values.size());
    columns->push_back(name);
    data.push_back(std::move(values));
  }
  if (n == SIZE_MAX) n = 0;
  for (size_t c : missing) data[c].assign(n, std::nan(""));
  rows->assign(n, std::vector<double>(data.size()));
  for (size_t r = 0; r < rows->size(); ++r)
    for (size_t c = 0; c < data.size(); ++c) (*rows)[r][c] = data[c][r];
}

}  // namespace

MetricsTable read_metrics(const std::string& path) {
  const Faults faults = faults_of(path);
  hdf5::Session session;
  // Also while a run writes it, or after one was killed writing it.
  Hid file = hdf5::open_for_reading(faults, "metrics file", /*beside_writer=*/true);
  const hid_t root = file.get();
  if (hdf5::read_format(root, faults) != kMetricsFormat)
    faults.fail("not an mpiformer metrics file");
  MetricsTable t;
  t.attrs.config = hdf5::read_string_attr(root, "config", faults);
  t.attrs.model = hdf5::read_string_attr(root, "model", faults);
  t.attrs.world_size = hdf5::read_int_attr<int>(root, "world_size", faults);
  t.attrs.devices = hdf5::read_string_attr(root, "devices", faults);
  t.attrs.versions = hdf5::read_string_attr(root, "versions", faults);
  t.attrs.git_commit = hdf5::read_string_attr(root, "git_commit", faults);
  if (hdf5::attr_exists(root, "run_id", faults)) {
    t.attrs.run_id = hdf5::read_string_attr(root, "run_id", faults);
  }
  t.attrs.label_figures = hdf5::link_exists(root, "/train/micro_f1", faults);
  t.attrs.valid_bleu = hdf5::link_exists(root, "/eval/bleu", faults);
  if (hdf5::attr_exists(root, "resumed_at_steps", faults)) {
    Hid attr(H5Aopen(root, "resumed_at_steps", H5P_DEFAULT), H5Aclose);
    Hid space(attr.ok() ? H5Aget_space(attr.get()) : H5I_INVALID_HID, H5Sclose);
    const hssize_t n = space.ok() ? H5Sget_simple_extent_npoints(space.get()) : -1;
    if (n < 0) faults.fail_corrupt("read attribute 'resumed_at_steps'");
    t.resumed_at_steps.resize(static_cast<size_t>(n));
    if (n > 0 && H5Aread(attr.get(), H5T_NATIVE_INT64, t.resumed_at_steps.data()) < 0) {
      faults.fail_corrupt("read attribute 'resumed_at_steps'");
    }
  }
  read_group(root, "train", kTrainColumns, kVersion1TrainColumns, faults, &t.train_columns,
             &t.train_rows);
  read_group(root, "eval", kEvalColumns, kVersion1EvalColumns, faults, &t.eval_columns,
             &t.eval_rows);
  return t;
}

namespace {

enum class JsonField { kRead, kEnd, kMalformed };

// The next "key": value of a metrics.jsonl line from *at, which moves past
// it; kEnd at the closing brace.
JsonField next_json_field(const std::string& line, size_t* at, std::string* key,
                          std::string* value) {
  *at = line.find_first_not_of(" ,", *at);
  if (*at == std::string::npos || line[*at] == '}') return JsonField::kEnd;
  if (line[*at] != '"') return JsonField::kMalformed;
  const size_t key_end = line.find('"', *at + 1);
  const size_t colon = key_end == std::string::npos ? key_end : line.find(':', key_end);
  if (colon == std::string::npos) return JsonField::kMalformed;
  *key = line.substr(*at + 1, key_end - *at - 1);
  const size_t value_at = line.find_first_not_of(' ', colon + 1);
  if (value_at == std::string::npos) return JsonField::kMalformed;
  const size_t value_end = line.find_first_of(",}", value_at);
  if (value_end == std::string::npos) return JsonField::kMalformed;
  *value = line.substr(value_at, value_end - value_at);
  *at = value_end;
  return JsonField::kRead;
}

// A number as append_json writes it, null as NaN; false for anything else.
bool parse_json_number(const std::string& value, double* number) {
  *number = std::nan("");
  if (value == "null") return true;
  char* end = nullptr;
  *number = std::strtod(value.c_str(), &end);
  return end != value.c_str() && *end == '\0';
}

// Puts `number` in every column named `key`; true when that gives the row a
// step (column 0, finite).
bool store_json_value(const Columns& columns, const std::string& key, double number,
                      std::vector<double>* row) {
  bool step = false;
  for (size_t c = 0; c < columns.size(); ++c) {
    if (key != columns[c].first) continue;
    (*row)[c] = number;
    step = step || (c == 0 && std::isfinite(number));
  }
  return step;
}

// One line of metrics.jsonl, {"group": "train", "step": 5, "loss": 3.4, ...}
// as append_json writes it, into `columns`' order; false when it is not one.
bool parse_json_row(const std::string& line, const Columns& columns, const char* group,
                    std::vector<double>* row) {
  row->assign(columns.size(), std::nan(""));
  bool has_step = false, in_group = false;
  size_t at = line.find('{');
  if (at == std::string::npos || line.find_last_not_of(" \t\r") != line.rfind('}')) return false;
  std::string key, value;
  for (++at;;) {
    const JsonField field = next_json_field(line, &at, &key, &value);
    if (field == JsonField::kEnd) break;
    if (field == JsonField::kMalformed) return false;
    if (key == "group") {
      if (value.size() < 2 || value.front() != '"' || value.back() != '"') return false;
      in_group = value.substr(1, value.size() - 2) == group;
      continue;
    }
    double number;
    if (!parse_json_number(value, &number)) return false;
    if (store_json_value(columns, key, number, row)) has_step = true;
  }
  return has_step && in_group;
}

}  // namespace

MetricsTable read_metrics_jsonl(const std::string& path) {
  const Faults faults = faults_of(path);
  std::ifstream in(path);
  if (!in) faults.fail_errno("cannot read");
  MetricsTable t;
  for (const auto& [name, integer] : kTrainColumns) t.train_columns.push_back(name);
  for (const auto& [name, integer] : kEvalColumns) t.eval_columns.push_back(name);
  std::string line;
  std::vector<double> row;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.empty()) continue;
    if (parse_json_row(line, kTrainColumns, "train", &row)) {
      t.train_rows.push_back(row);
    } else if (parse_json_row(line, kEvalColumns, "eval", &row)) {
      t.eval_rows.push_back(row);
    } else if (!in.eof()) {  // an unfinished last line is a writer killed mid-row
      faults.fail("line " + std::to_string(number) + " is not a metrics row");
    }
  }
  if (in.bad()) faults.fail_errno("cannot read");
  return t;
}

bool is_metrics_file(const std::string& path) {
  return hdf5::has_format(path, kMetricsFormat, /*beside_writer=*/true);
}

}  // namespace mpiformer
