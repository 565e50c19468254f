// HDF5 checkpoints: the atomic writer, the run directory's checkpoints/
// (naming, `latest`, pruning) and the readers. Every fault becomes one
// CheckpointError line "PATH: reason"; HDF5's own error stack is never printed.
#include "src/io/checkpoint.h"

#include <fcntl.h>
#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <mutex>
#include <utility>

#include "src/io/shard.h"

namespace mpiformer {

namespace {

namespace fs = std::filesystem;

constexpr const char* kFormatName = "mpiformer-checkpoint";
// 4 MiB chunks: large enough for streaming, small enough that a checksum
// fault names a small region and no chunk nears HDF5's 4 GiB limit.
constexpr hsize_t kChunkElements = hsize_t{1} << 20;

// Owns one HDF5 identifier and closes it with the matching H5?close.
class Hid {
 public:
  Hid() = default;
  Hid(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  Hid(const Hid&) = delete;
  Hid& operator=(const Hid&) = delete;
  Hid(Hid&& o) noexcept : id_(o.id_), close_(o.close_) { o.id_ = H5I_INVALID_HID; }
  ~Hid() {
    if (id_ >= 0 && close_) close_(id_);
  }
  hid_t get() const { return id_; }
  bool ok() const { return id_ >= 0; }
  // Closes now and reports the status (a file's close writes its metadata).
  herr_t close() {
    const herr_t status = id_ >= 0 && close_ ? close_(id_) : 0;
    id_ = H5I_INVALID_HID;
    return status;
  }

 private:
  hid_t id_ = H5I_INVALID_HID;
  herr_t (*close_)(hid_t) = nullptr;
};

// Serialises HDF5 (this build is not thread-safe) and silences its automatic
// error printing for one HDF5 call sequence, restoring the caller's handler.
class Hdf5Session {
 public:
  Hdf5Session() : lock_(hdf5_mutex()) {
    H5Eget_auto2(H5E_DEFAULT, &saved_func_, &saved_data_);
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }
  ~Hdf5Session() { H5Eset_auto2(H5E_DEFAULT, saved_func_, saved_data_); }
  Hdf5Session(const Hdf5Session&) = delete;
  Hdf5Session& operator=(const Hdf5Session&) = delete;

 private:
  std::lock_guard<std::mutex> lock_;
  H5E_auto2_t saved_func_ = nullptr;
  void* saved_data_ = nullptr;
};

// The innermost message of HDF5's current error stack; call right after the
// failing call, before another HDF5 call clears the stack.
std::string hdf5_reason() {
  std::string reason;
  auto walk = [](unsigned n, const H5E_error2_t* err, void* data) -> herr_t {
    if (n == 0 && err->desc) *static_cast<std::string*>(data) = err->desc;
    return 0;
  };
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, walk, &reason);
  std::replace(reason.begin(), reason.end(), '\n', ' ');
  return reason;
}

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw CheckpointError(path + ": " + what);
}

// "truncated or corrupt (HDF5 could not WHAT: detail)".
[[noreturn]] void fail_corrupt(const std::string& path, const std::string& what) {
  const std::string detail = hdf5_reason();
  fail(path, "truncated or corrupt (HDF5 could not " + what +
                 (detail.empty() ? "" : ": " + detail) + ")");
}

[[noreturn]] void fail_errno(const std::string& path, const std::string& what) {
  fail(path, what + " (" + std::strerror(errno) + ")");
}

std::string shape_string(const std::vector<int>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + ")";
}

// ---------------------------------------------------------------- durability

// Flushes a written file's data to stable storage.
void fsync_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail_errno(path, "cannot open to fsync");
  const int rc = ::fsync(fd);
  const int saved = errno;
  ::close(fd);
  errno = saved;
  if (rc != 0) fail_errno(path, "cannot fsync");
}

// Makes a rename in `dir` durable. File systems that cannot fsync a
// directory (EINVAL) order renames themselves, so that is not a fault.
void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail_errno(dir, "cannot open the directory to fsync");
  const int rc = ::fsync(fd);
  const int saved = errno;
  ::close(fd);
  if (rc != 0 && saved != EINVAL) {
    errno = saved;
    fail_errno(dir, "cannot fsync the directory");
  }
}

std::string parent_dir(const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? "." : parent.string();
}

// Moves a complete, fsync'ed `tmp` onto `path` and makes the move durable;
// removes `tmp` when the move fails.
void commit(const std::string& tmp, const std::string& path) {
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int saved = errno;
    std::error_code ec;
    fs::remove(tmp, ec);
    errno = saved;
    fail_errno(path, "cannot rename the temporary file into place");
  }
  fsync_dir(parent_dir(path));
}

// Writes `text` to `path` atomically: PATH.tmp, fsync, rename.
void write_text_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail_errno(tmp, "cannot create");
  size_t done = 0;
  bool ok = true;
  while (ok && done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    if (ok) done += static_cast<size_t>(n);
  }
  ok = ok && ::fsync(fd) == 0;
  const int saved = errno;
  ok = ::close(fd) == 0 && ok;
  if (!ok) {
    std::error_code ec;
    fs::remove(tmp, ec);
    errno = saved;
    fail_errno(tmp, "cannot write");
  }
  commit(tmp, path);
}

// ---------------------------------------------------------------- writing

void check(herr_t status, const std::string& path, const std::string& what) {
  if (status < 0) {
    const std::string detail = hdf5_reason();
    fail(path, "cannot write " + what + (detail.empty() ? "" : " (" + detail + ")"));
  }
}

Hid checked(hid_t id, herr_t (*close)(hid_t), const std::string& path, const std::string& what) {
  if (id < 0) check(-1, path, what);
  return Hid(id, close);
}

void write_int_attr(hid_t loc, const char* name, hid_t file_type, hid_t mem_type, const void* value,
                    const std::string& path) {
  const std::string what = std::string("attribute ") + name;
  Hid space = checked(H5Screate(H5S_SCALAR), H5Sclose, path, what);
  Hid attr = checked(H5Acreate2(loc, name, file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT),
                     H5Aclose, path, what);
  check(H5Awrite(attr.get(), mem_type, value), path, what);
}

void write_string_attr(hid_t loc, const char* name, const std::string& value,
                       const std::string& path) {
  // Fixed-length, NUL-terminated ASCII: readable by every HDF5 tool.
  const std::string what = std::string("attribute ") + name;
  Hid type = checked(H5Tcopy(H5T_C_S1), H5Tclose, path, what);
  check(H5Tset_size(type.get(), value.size() + 1), path, what);
  check(H5Tset_strpad(type.get(), H5T_STR_NULLTERM), path, what);
  Hid space = checked(H5Screate(H5S_SCALAR), H5Sclose, path, what);
  Hid attr = checked(H5Acreate2(loc, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT),
                     H5Aclose, path, what);
  check(H5Awrite(attr.get(), type.get(), value.c_str()), path, what);
}

// Chunk dimensions of at most kChunkElements elements, shrinking the
// outermost dimensions first so a chunk is a run of whole rows.
std::vector<hsize_t> chunk_dims(const std::vector<hsize_t>& dims) {
  std::vector<hsize_t> chunk = dims;
  for (size_t i = 0; i < chunk.size(); ++i) {
    hsize_t rest = 1;
    for (size_t j = 0; j < chunk.size(); ++j) rest *= j == i ? 1 : chunk[j];
    chunk[i] = std::clamp<hsize_t>(kChunkElements / rest, 1, chunk[i]);
  }
  return chunk;
}

// One float32 tensor, chunked and Fletcher32-checksummed so a damaged
// checkpoint is refused at resume instead of training from garbage.
// data: host (product of shape)
void write_tensor(hid_t group, const std::string& name, const std::vector<int>& shape,
                  const float* data, const std::string& path, const std::string& what) {
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  Hid space = checked(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
                      H5Sclose, path, what);
  Hid dcpl = checked(H5Pcreate(H5P_DATASET_CREATE), H5Pclose, path, what);
  const std::vector<hsize_t> chunk = chunk_dims(dims);
  check(H5Pset_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data()), path, what);
  check(H5Pset_fletcher32(dcpl.get()), path, what);
  Hid dset = checked(H5Dcreate2(group, name.c_str(), H5T_IEEE_F32LE, space.get(), H5P_DEFAULT,
                                dcpl.get(), H5P_DEFAULT),
                     H5Dclose, path, what);
  check(H5Dwrite(dset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), path, what);
}

Hid create_group(hid_t loc, const char* name, const std::string& path) {
  return checked(H5Gcreate2(loc, name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose, path,
                 std::string("group /") + name);
}

// Everything write_checkpoint can check before touching the disk.
void validate_for_write(const std::string& path, const ParameterSet& params, const float* adam_m,
                        const float* adam_v, const CheckpointState& state) {
  if (!params.params()) fail(path, "cannot write: the parameters are not allocated");
  if (!adam_m || !adam_v) fail(path, "cannot write: the optimizer moments are missing");
  if (state.step < 0) fail(path, "cannot write: step " + std::to_string(state.step) + " < 0");
  if (state.world_size < 1) {
    fail(path, "cannot write: world size " + std::to_string(state.world_size) + " < 1");
  }
  for (const ParamInfo& info : params.info()) {
    // "." is the group itself and "/" would nest groups; dots elsewhere are fine.
    if (info.name.empty() || info.name == "." || info.name.find('/') != std::string::npos) {
      fail(path, "cannot write: tensor name '" + info.name + "' is not a valid dataset name");
    }
    size_t size = 1;
    for (int d : info.shape) size *= d > 0 ? static_cast<size_t>(d) : 0;
    if (info.shape.empty() || size != info.size || info.offset + info.size > params.count()) {
      fail(path, "cannot write: tensor '" + info.name + "' of shape " + shape_string(info.shape) +
                     " does not match its place in the parameter buffer");
    }
  }
}

void write_checkpoint_file(const std::string& tmp, const std::string& path,
                           const ParameterSet& params, const float* adam_m, const float* adam_v,
                           const CheckpointState& state) {
  Ops& ops = params.ops();
  ops.synchronize();  // the last update must have landed before it is copied

  Hdf5Session session;
  // File format 1.8 or later: the config attribute may outgrow the 64 KiB
  // an attribute gets in the oldest format. No file locking: only this
  // process ever opens the temporary name, and parallel file systems often
  // lack flock().
  Hid fapl = checked(H5Pcreate(H5P_FILE_ACCESS), H5Pclose, path, "the file");
  check(H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V18, H5F_LIBVER_LATEST), path, "the file");
  check(H5Pset_file_locking(fapl.get(), 0, 1), path, "the file");
  Hid file = checked(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()), H5Fclose, path,
                     "the file");
  const hid_t root = file.get();

  write_string_attr(root, "format", kFormatName, path);
  const int version = kCheckpointVersion;
  write_int_attr(root, "version", H5T_STD_I32LE, H5T_NATIVE_INT, &version, path);
  write_int_attr(root, "step", H5T_STD_I64LE, H5T_NATIVE_INT64, &state.step, path);
  write_int_attr(root, "world_size", H5T_STD_I32LE, H5T_NATIVE_INT, &state.world_size, path);
  write_string_attr(root, "config", state.config_ini, path);

  Hid params_group = create_group(root, "params", path);
  Hid optimizer = create_group(root, "optimizer", path);
  Hid m_group = create_group(optimizer.get(), "m", path);
  Hid v_group = create_group(optimizer.get(), "v", path);
  const std::pair<const char*, std::pair<hid_t, const float*>> groups[] = {
      {"/params/", {params_group.get(), params.params()}},
      {"/optimizer/m/", {m_group.get(), adam_m}},
      {"/optimizer/v/", {v_group.get(), adam_v}}};

  std::vector<float> host;  // staging, reused: (largest tensor)
  for (const auto& [prefix, target] : groups) {
    const auto [group, base] = target;  // base: backend (params.count())
    for (const ParamInfo& info : params.info()) {
      host.resize(info.size);
      ops.copy_to_host(host.data(), base + info.offset, info.size * sizeof(float));
      write_tensor(group, info.name, info.shape, host.data(), path,
                   "dataset " + std::string(prefix) + info.name);
    }
  }
  check(H5Fflush(root, H5F_SCOPE_LOCAL), path, "the file");
  params_group.close();
  m_group.close();
  v_group.close();
  optimizer.close();
  check(file.close(), path, "the file");
}

// ---------------------------------------------------------------- reading

std::string type_name(hid_t type) {
  switch (H5Tget_class(type)) {
    case H5T_INTEGER:
      return "integer";
    case H5T_FLOAT:
      return "float";
    case H5T_STRING:
      return "string";
    case H5T_COMPOUND:
      return "compound";
    case H5T_ARRAY:
      return "array";
    default:
      return "non-numeric";
  }
}

// Opens for reading with file locking off: checkpoints are immutable once
// renamed into place, and parallel file systems often lack flock().
Hid open_for_reading(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) fail(path, "no such file");
  if (fs::is_directory(path, ec)) fail(path, "is a directory, not a checkpoint file");
  if (::access(path.c_str(), R_OK) != 0) fail_errno(path, "cannot open for reading");
  if (H5Fis_hdf5(path.c_str()) <= 0) fail(path, "not an HDF5 file");
  Hid fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  if (fapl.ok()) H5Pset_file_locking(fapl.get(), 0, 1);
  Hid file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.ok() ? fapl.get() : H5P_DEFAULT), H5Fclose);
  if (!file.ok()) {
    // A short file is the common case (an interrupted copy): say so plainly.
    const std::string detail = hdf5_reason();
    unsigned long long eof = 0, base = 0, stored = 0;
    if (std::sscanf(detail.c_str(),
                    "truncated file: eof = %llu, sblock->base_addr = %llu, stored_eof = %llu", &eof,
                    &base, &stored) == 3) {
      fail(path, "truncated or corrupt (the file holds " + std::to_string(eof) +
                     " bytes but its HDF5 superblock says " + std::to_string(stored) + ")");
    }
    fail(path, "truncated or corrupt (HDF5 could not open the file" +
                   (detail.empty() ? "" : ": " + detail) + ")");
  }
  return file;
}

Hid open_attr(hid_t loc, const char* name, const std::string& path) {
  const htri_t exists = H5Aexists(loc, name);
  if (exists < 0) fail_corrupt(path, std::string("read attribute '") + name + "'");
  if (exists == 0) fail(path, std::string("missing attribute '") + name + "'");
  Hid attr(H5Aopen(loc, name, H5P_DEFAULT), H5Aclose);
  if (!attr.ok()) fail_corrupt(path, std::string("read attribute '") + name + "'");
  Hid space(H5Aget_space(attr.get()), H5Sclose);
  if (!space.ok() || H5Sget_simple_extent_npoints(space.get()) != 1) {
    fail(path, std::string("attribute '") + name + "' is not a single value");
  }
  return attr;
}

// Fixed- or variable-length string attribute (h5py writes the latter).
std::string read_string_attr(hid_t loc, const char* name, const std::string& path) {
  Hid attr = open_attr(loc, name, path);
  Hid type(H5Aget_type(attr.get()), H5Tclose);
  if (!type.ok() || H5Tget_class(type.get()) != H5T_STRING) {
    fail(path, std::string("attribute '") + name + "' is " +
                   (type.ok() ? type_name(type.get()) : "unreadable") + ", expected a string");
  }
  std::string value;
  if (H5Tis_variable_str(type.get()) > 0) {
    Hid mem(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(mem.get(), H5T_VARIABLE);
    char* s = nullptr;
    if (H5Aread(attr.get(), mem.get(), &s) < 0) {
      fail_corrupt(path, std::string("read attribute '") + name + "'");
    }
    if (s) value = s;
    H5free_memory(s);
  } else {
    const size_t size = H5Tget_size(type.get());
    std::vector<char> buf(size + 1, '\0');  // (size) plus a terminator
    if (H5Aread(attr.get(), type.get(), buf.data()) < 0) {
      fail_corrupt(path, std::string("read attribute '") + name + "'");
    }
    value.assign(buf.data(), strnlen(buf.data(), size));
  }
  return value;
}

// An integer attribute of any stored width, range-checked into T.
template <class T>
T read_int_attr(hid_t loc, const char* name, const std::string& path) {
  Hid attr = open_attr(loc, name, path);
  Hid type(H5Aget_type(attr.get()), H5Tclose);
  if (!type.ok() || H5Tget_class(type.get()) != H5T_INTEGER) {
    fail(path, std::string("attribute '") + name + "' is " +
                   (type.ok() ? type_name(type.get()) : "unreadable") + ", expected an integer");
  }
  // Read wide, then range-check: HDF5 would silently clamp a narrowing read.
  if (H5Tget_sign(type.get()) == H5T_SGN_2) {
    int64_t v = 0;
    if (H5Aread(attr.get(), H5T_NATIVE_INT64, &v) < 0) {
      fail_corrupt(path, std::string("read attribute '") + name + "'");
    }
    if (v < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
        (v > 0 && static_cast<uint64_t>(v) > std::numeric_limits<T>::max())) {
      fail(path,
           std::string("attribute '") + name + "' = " + std::to_string(v) + " is out of range");
    }
    return static_cast<T>(v);
  }
  uint64_t v = 0;
  if (H5Aread(attr.get(), H5T_NATIVE_UINT64, &v) < 0) {
    fail_corrupt(path, std::string("read attribute '") + name + "'");
  }
  if (v > static_cast<uint64_t>(std::numeric_limits<T>::max())) {
    fail(path, std::string("attribute '") + name + "' = " + std::to_string(v) + " is out of range");
  }
  return static_cast<T>(v);
}

// Opens `path` and checks the format and version attributes.
Hid open_checkpoint(const std::string& path) {
  Hid file = open_for_reading(path);
  const hid_t root = file.get();
  if (H5Aexists(root, "format") <= 0) {
    fail(path, "not an mpiformer checkpoint (no 'format' attribute)");
  }
  const std::string format = read_string_attr(root, "format", path);
  if (format != kFormatName) fail(path, "not an mpiformer checkpoint (format is '" + format + "')");
  const int version = read_int_attr<int>(root, "version", path);
  if (version != kCheckpointVersion) {
    fail(path, "unsupported checkpoint version " + std::to_string(version) +
                   " (this build reads version " + std::to_string(kCheckpointVersion) + ")");
  }
  return file;
}

// "optimizer/m" -> "/optimizer/m"; refuses empty components.
std::string group_path(const std::string& group, const std::string& path) {
  std::string g = group;
  while (!g.empty() && g.front() == '/') g.erase(g.begin());
  while (!g.empty() && g.back() == '/') g.pop_back();
  if (g.empty() || g.find("//") != std::string::npos) fail(path, "bad group name '" + group + "'");
  return "/" + g;
}

// Reads one member of `group` named `name`; `where` is "/group/name".
CheckpointTensor read_tensor(hid_t group, const std::string& name, const std::string& where,
                             const std::string& path) {
  Hid object(H5Oopen(group, name.c_str(), H5P_DEFAULT), H5Oclose);
  if (!object.ok()) fail_corrupt(path, "open " + where);
  if (H5Iget_type(object.get()) != H5I_DATASET) fail(path, where + " is not a dataset");
  Hid type(H5Dget_type(object.get()), H5Tclose);
  if (!type.ok() || H5Tget_class(type.get()) != H5T_FLOAT || H5Tget_size(type.get()) != 4) {
    fail(path, where + " holds " + (type.ok() ? type_name(type.get()) : "unreadable") + " values" +
                   (type.ok() ? " of " + std::to_string(H5Tget_size(type.get())) + " bytes" : "") +
                   ", expected float32");
  }
  Hid space(H5Dget_space(object.get()), H5Sclose);
  const int ndims = space.ok() ? H5Sget_simple_extent_ndims(space.get()) : -1;
  if (ndims < 0) fail_corrupt(path, "read the shape of " + where);
  std::vector<hsize_t> dims(static_cast<size_t>(ndims));
  if (ndims > 0 && H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr) < 0) {
    fail_corrupt(path, "read the shape of " + where);
  }
  CheckpointTensor t;
  t.name = name;
  size_t count = 1;
  for (hsize_t d : dims) {
    if (d > static_cast<hsize_t>(INT_MAX) ||
        (d > 0 && count > std::numeric_limits<size_t>::max() / sizeof(float) / d)) {
      fail(path, where + " has an implausible shape");
    }
    t.shape.push_back(static_cast<int>(d));
    count *= static_cast<size_t>(d);
  }
  t.data.resize(count);  // (product of shape)
  if (count > 0 &&
      H5Dread(object.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, t.data.data()) < 0) {
    fail_corrupt(path, "read " + where);
  }
  return t;
}

}  // namespace

void write_checkpoint(const std::string& path, const ParameterSet& params, const float* adam_m,
                      const float* adam_v, const CheckpointState& state) {
  validate_for_write(path, params, adam_m, adam_v, state);
  const std::string tmp = path + ".tmp";
  try {
    write_checkpoint_file(tmp, path, params, adam_m, adam_v, state);
    fsync_file(tmp);
  } catch (...) {
    std::error_code ec;
    fs::remove(tmp, ec);  // leave no half-written file behind
    throw;
  }
  commit(tmp, path);
}

std::string save_checkpoint(const std::string& rundir, const ParameterSet& params,
                            const float* adam_m, const float* adam_v, const CheckpointState& state,
                            int keep_last) {
  const fs::path dir = fs::path(rundir) / "checkpoints";
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail(dir.string(), "cannot create the directory (" + ec.message() + ")");
  if (state.step < 0) {
    fail(dir.string(), "cannot write a checkpoint of step " + std::to_string(state.step));
  }
  char name[32];
  std::snprintf(name, sizeof name, "step_%08lld.h5", static_cast<long long>(state.step));
  const std::string path = (dir / name).string();
  write_checkpoint(path, params, adam_m, adam_v, state);
  write_text_atomically((dir / "latest").string(), std::string(name) + "\n");

  if (keep_last <= 0) return path;
  // Older step_*.h5 by step number (names past 8 digits still sort right);
  // pruning is best effort, a file that will not go is left for the next save.
  std::vector<std::pair<uint64_t, fs::path>> others;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string file = it->path().filename().string();
    if (file == name || file.size() <= 8 || file.compare(0, 5, "step_") != 0 ||
        file.compare(file.size() - 3, 3, ".h5") != 0) {
      continue;
    }
    const std::string digits = file.substr(5, file.size() - 8);
    if (digits.empty() || digits.size() > 18 ||
        !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      continue;
    }
    others.emplace_back(std::stoull(digits), it->path());
  }
  std::sort(others.begin(), others.end(), std::greater<>());
  for (size_t i = static_cast<size_t>(keep_last) - 1; i < others.size(); ++i) {
    fs::remove(others[i].second, ec);
  }
  return path;
}

std::vector<CheckpointTensor> read_checkpoint_tensors(const std::string& path,
                                                      const std::string& group) {
  Hdf5Session session;
  Hid file = open_checkpoint(path);
  const std::string where = group_path(group, path);
  // Walk down one link at a time: H5Lexists faults on a missing parent.
  for (size_t slash = where.find('/', 1);; slash = where.find('/', slash + 1)) {
    const std::string prefix = where.substr(0, slash);
    if (H5Lexists(file.get(), prefix.c_str(), H5P_DEFAULT) <= 0) {
      fail(path, "missing group " + where);
    }
    if (slash == std::string::npos) break;
  }
  Hid g(H5Gopen2(file.get(), where.c_str(), H5P_DEFAULT), H5Gclose);
  if (!g.ok()) fail(path, where + " is not a group");
  H5G_info_t info;
  if (H5Gget_info(g.get(), &info) < 0) fail_corrupt(path, "list " + where);

  std::vector<CheckpointTensor> tensors;
  tensors.reserve(info.nlinks);
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    // By name, ascending: the order is the same whatever wrote the file.
    const ssize_t len =
        H5Lget_name_by_idx(g.get(), ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
    if (len < 0) fail_corrupt(path, "list " + where);
    std::string name(static_cast<size_t>(len) + 1, '\0');
    if (H5Lget_name_by_idx(g.get(), ".", H5_INDEX_NAME, H5_ITER_INC, i, name.data(), name.size(),
                           H5P_DEFAULT) < 0) {
      fail_corrupt(path, "list " + where);
    }
    name.resize(static_cast<size_t>(len));
    tensors.push_back(read_tensor(g.get(), name, where + "/" + name, path));
  }
  return tensors;
}

CheckpointState read_checkpoint_state(const std::string& path) {
  Hdf5Session session;
  Hid file = open_checkpoint(path);
  CheckpointState state;
  state.step = read_int_attr<int64_t>(file.get(), "step", path);
  if (state.step < 0) fail(path, "attribute 'step' = " + std::to_string(state.step) + " is < 0");
  state.world_size = read_int_attr<int>(file.get(), "world_size", path);
  if (state.world_size < 1) {
    fail(path, "attribute 'world_size' = " + std::to_string(state.world_size) + " is < 1");
  }
  state.config_ini = read_string_attr(file.get(), "config", path);
  return state;
}

bool is_checkpoint(const std::string& path) {
  try {
    std::error_code ec;
    if (!fs::is_regular_file(path, ec)) return false;
    Hdf5Session session;
    if (H5Fis_hdf5(path.c_str()) <= 0) return false;
    Hid fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
    if (fapl.ok()) H5Pset_file_locking(fapl.get(), 0, 1);
    Hid file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.ok() ? fapl.get() : H5P_DEFAULT), H5Fclose);
    if (!file.ok() || H5Aexists(file.get(), "format") <= 0) return false;
    return read_string_attr(file.get(), "format", path) == kFormatName;
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace mpiformer
