// metrics.h5 in SWMR mode; see metrics.h.
#include "src/io/metrics.h"

#include <algorithm>
#include <filesystem>
#include <utility>

#include "src/io/hdf5_file.h"

namespace mpiformer {

namespace {

namespace fs = std::filesystem;
using hdf5::Faults;
using hdf5::Hid;

constexpr const char* kFormatName = "mpiformer-metrics";
constexpr hsize_t kRowsPerChunk = 256;

// (name, integer) in file order.
const std::vector<std::pair<const char*, bool>> kTrainColumns = {
    {"step", true},          {"loss", false},    {"tokens", true},
    {"accuracy", false},     {"lr", false},      {"grad_norm", false},
    {"tokens_per_s", false}, {"step_ms", false}, {"padding_efficiency", false},
    {"loss_scale", false}};
const std::vector<std::pair<const char*, bool>> kEvalColumns = {
    {"step", true}, {"loss", false}, {"perplexity", false}, {"accuracy", false}, {"tokens", true}};

Faults faults_of(const std::string& path) {
  return Faults::of<MetricsError>(path);
}

void replace_string_attr(hid_t loc, const char* name, const std::string& value,
                         const Faults& faults) {
  if (H5Aexists(loc, name) > 0)
    faults.check(H5Adelete(loc, name), std::string("attribute ") + name);
  hdf5::write_string_attr(loc, name, value, faults);
}

// The steps at which the run was resumed, one more each time.
void append_resume_step(hid_t root, int64_t step, const Faults& faults) {
  const char* name = "resumed_at_steps";
  std::vector<int64_t> steps;
  if (H5Aexists(root, name) > 0) {
    Hid attr(H5Aopen(root, name, H5P_DEFAULT), H5Aclose);
    Hid space(attr.ok() ? H5Aget_space(attr.get()) : H5I_INVALID_HID, H5Sclose);
    const hssize_t n = space.ok() ? H5Sget_simple_extent_npoints(space.get()) : -1;
    if (n < 0) faults.fail_corrupt("read attribute 'resumed_at_steps'");
    steps.resize(static_cast<size_t>(n));
    if (n > 0 && H5Aread(attr.get(), H5T_NATIVE_INT64, steps.data()) < 0) {
      faults.fail_corrupt("read attribute 'resumed_at_steps'");
    }
    attr.close();
    faults.check(H5Adelete(root, name), "attribute resumed_at_steps");
  }
  steps.push_back(step);
  const hsize_t dims[1] = {steps.size()};
  Hid space = faults.checked(H5Screate_simple(1, dims, nullptr), H5Sclose, name);
  Hid attr = faults.checked(
      H5Acreate2(root, name, H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose, name);
  faults.check(H5Awrite(attr.get(), H5T_NATIVE_INT64, steps.data()), name);
}

hsize_t length_of(hid_t dset) {
  Hid space(H5Dget_space(dset), H5Sclose);
  hsize_t n = 0;
  if (space.ok()) H5Sget_simple_extent_dims(space.get(), &n, nullptr);
  return n;
}

}  // namespace

MetricsLog::MetricsLog(const std::string& path, const RunAttributes& attrs,
                       int64_t keep_through_step)
    : path_(path) {
  const Faults faults = faults_of(path);
  hdf5::Session session;
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (fs::is_directory(status)) faults.fail("is a directory, not a metrics file");
  const bool exists = fs::exists(status);
  const bool create = keep_through_step < 0 || !exists;
  if (!create && H5Fis_hdf5(path.c_str()) <= 0) {
    faults.fail("not an HDF5 file; move it away or choose another --out");
  }

  // The newest file format: SWMR needs it.
  Hid fapl = faults.checked(H5Pcreate(H5P_FILE_ACCESS), H5Pclose, "the file");
  faults.check(H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_LATEST, H5F_LIBVER_LATEST), "the file");
  Hid file;
  if (create) {
    file = Hid(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()), H5Fclose);
    if (!file.ok()) faults.fail_corrupt("create the file");
  } else {
    file = Hid(H5Fopen(path.c_str(), H5F_ACC_RDWR, fapl.get()), H5Fclose);
    if (!file.ok()) faults.fail_corrupt("open the file for writing (is another run writing it?)");
    const bool ours = H5Aexists(file.get(), "format") > 0 &&
                      hdf5::read_string_attr(file.get(), "format", faults) == kFormatName;
    if (!ours) faults.fail("not an mpiformer metrics file; move it away or choose another --out");
  }
  const hid_t root = file.get();
  replace_string_attr(root, "format", kFormatName, faults);
  if (H5Aexists(root, "version") > 0) faults.check(H5Adelete(root, "version"), "attribute version");
  const int version = kMetricsVersion;
  hdf5::write_int_attr(root, "version", H5T_STD_I32LE, H5T_NATIVE_INT, &version, faults);
  if (H5Aexists(root, "world_size") > 0) {
    faults.check(H5Adelete(root, "world_size"), "attribute world_size");
  }
  hdf5::write_int_attr(root, "world_size", H5T_STD_I32LE, H5T_NATIVE_INT, &attrs.world_size,
                       faults);
  replace_string_attr(root, "config", attrs.config, faults);
  replace_string_attr(root, "model", attrs.model, faults);
  replace_string_attr(root, "devices", attrs.devices, faults);
  replace_string_attr(root, "versions", attrs.versions, faults);
  replace_string_attr(root, "git_commit", attrs.git_commit, faults);
  if (!create) append_resume_step(root, keep_through_step, faults);

  file_ = file.release();  // closed by close_all() from here on
  try {
    open_columns("train", kTrainColumns, create, &train_);
    open_columns("eval", kEvalColumns, create, &eval_);
    // Rows past the resumed step are redone by this run: drop them.
    const auto keep_rows = [&](std::vector<Column>& columns, hsize_t* rows) {
      hsize_t n = length_of(columns[0].id);
      for (const Column& c : columns) n = std::min(n, length_of(c.id));
      std::vector<int64_t> steps(n);
      if (n > 0 && H5Dread(columns[0].id, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT,
                           steps.data()) < 0) {
        faults.fail_corrupt("read /" + columns[0].name);
      }
      hsize_t keep = 0;
      while (keep < n && steps[keep] <= keep_through_step) ++keep;
      for (const Column& c : columns) faults.check(H5Dset_extent(c.id, &keep), "/" + c.name);
      *rows = keep;
    };
    keep_rows(train_, &train_rows_);
    keep_rows(eval_, &eval_rows_);
    faults.check(H5Fstart_swmr_write(file_), "the file (start SWMR writing)");
  } catch (...) {
    close_all();
    throw;
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
}

void MetricsLog::open_columns(const char* group,
                              const std::vector<std::pair<const char*, bool>>& names, bool create,
                              std::vector<Column>* columns) {
  const Faults faults = faults_of(path_);
  const std::string where = std::string("/") + group;
  Hid g;
  if (create) {
    g = faults.checked(H5Gcreate2(file_, group, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose,
                       "group " + where);
  } else {
    if (H5Lexists(file_, group, H5P_DEFAULT) <= 0) faults.fail("missing group " + where);
    g = Hid(H5Gopen2(file_, group, H5P_DEFAULT), H5Gclose);
    if (!g.ok()) faults.fail_corrupt("open " + where);
  }
  for (const auto& [name, integer] : names) {
    Column c{where.substr(1) + "/" + name, H5I_INVALID_HID, integer};
    if (create) {
      const hsize_t dims[1] = {0}, maxdims[1] = {H5S_UNLIMITED}, chunk[1] = {kRowsPerChunk};
      Hid space = faults.checked(H5Screate_simple(1, dims, maxdims), H5Sclose, c.name);
      Hid dcpl = faults.checked(H5Pcreate(H5P_DATASET_CREATE), H5Pclose, c.name);
      faults.check(H5Pset_chunk(dcpl.get(), 1, chunk), c.name);
      c.id = H5Dcreate2(g.get(), name, integer ? H5T_STD_I64LE : H5T_IEEE_F64LE, space.get(),
                        H5P_DEFAULT, dcpl.get(), H5P_DEFAULT);
      if (c.id < 0) faults.fail_corrupt("create /" + c.name);
    } else {
      if (H5Lexists(g.get(), name, H5P_DEFAULT) <= 0) faults.fail("missing dataset /" + c.name);
      c.id = H5Dopen2(g.get(), name, H5P_DEFAULT);
      if (c.id < 0) faults.fail_corrupt("open /" + c.name);
    }
    columns->push_back(c);
  }
}

void MetricsLog::append_row(std::vector<Column>& columns, hsize_t* rows,
                            const std::vector<double>& values) {
  const Faults faults = faults_of(path_);
  hdf5::Session session;
  const hsize_t at[1] = {*rows}, one[1] = {1}, grown[1] = {*rows + 1};
  Hid memory = faults.checked(H5Screate_simple(1, one, nullptr), H5Sclose, "a row");
  for (size_t i = 0; i < columns.size(); ++i) {
    const Column& c = columns[i];
    faults.check(H5Dset_extent(c.id, grown), "/" + c.name);
    Hid space = faults.checked(H5Dget_space(c.id), H5Sclose, "/" + c.name);
    faults.check(H5Sselect_hyperslab(space.get(), H5S_SELECT_SET, at, nullptr, one, nullptr),
                 "/" + c.name);
    const int64_t as_int = static_cast<int64_t>(values[i]);
    faults.check(H5Dwrite(c.id, c.integer ? H5T_NATIVE_INT64 : H5T_NATIVE_DOUBLE, memory.get(),
                          space.get(), H5P_DEFAULT,
                          c.integer ? static_cast<const void*>(&as_int)
                                    : static_cast<const void*>(&values[i])),
                 "/" + c.name);
  }
  faults.check(H5Fflush(file_, H5F_SCOPE_LOCAL), "the file");
  ++*rows;
}

void MetricsLog::append(const TrainRow& r) {
  append_row(train_, &train_rows_,
             {static_cast<double>(r.step), r.loss, static_cast<double>(r.tokens), r.accuracy, r.lr,
              r.grad_norm, r.tokens_per_s, r.step_ms, r.padding_efficiency, r.loss_scale});
}

void MetricsLog::append(const EvalRow& r) {
  append_row(eval_, &eval_rows_,
             {static_cast<double>(r.step), r.loss, r.perplexity, r.accuracy,
              static_cast<double>(r.tokens)});
}

}  // namespace mpiformer
