// HDF5 token shards: writer, validating reader, directory listing. The
// layout is specified in data/FORMAT.md; every fault becomes one ShardError
// line "PATH: reason" and HDF5's own error stack is never printed.
#include "src/io/shard.h"

#include <hdf5.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <sstream>

namespace mpiformer {

std::mutex& hdf5_mutex() {
  static std::mutex m;
  return m;
}

namespace {

namespace fs = std::filesystem;

constexpr const char* kFormatName = "mpiformer-shard";
constexpr hsize_t kChunkElements = 64 * 1024;
constexpr int64_t kUint16Vocab = 65536;  // ids up to 65535 fit uint16

// Owns one HDF5 identifier and closes it with the matching H5?close.
class Hid {
 public:
  Hid() = default;
  Hid(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  Hid(const Hid&) = delete;
  Hid& operator=(const Hid&) = delete;
  Hid(Hid&& o) noexcept : id_(o.id_), close_(o.close_) { o.id_ = H5I_INVALID_HID; }
  Hid& operator=(Hid&& o) noexcept {
    std::swap(id_, o.id_);
    std::swap(close_, o.close_);
    return *this;
  }
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
// error printing for the duration of one public call, restoring the caller's
// handler afterwards.
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

// The innermost message of HDF5's current error stack: where the fault was
// detected ("truncated file: eof = ...", "data error detected by fletcher32
// checksum"). Must be called right after the failing call, before any other
// HDF5 call clears the stack.
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
  throw ShardError(path + ": " + what);
}

// "truncated or corrupt (HDF5 could not WHAT: detail)".
[[noreturn]] void fail_corrupt(const std::string& path, const std::string& what) {
  const std::string detail = hdf5_reason();
  fail(path, "truncated or corrupt (HDF5 could not " + what +
                 (detail.empty() ? "" : ": " + detail) + ")");
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
  Hid space = checked(H5Screate(H5S_SCALAR), H5Sclose, path, name);
  Hid attr = checked(H5Acreate2(loc, name, file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT),
                     H5Aclose, path, std::string("attribute ") + name);
  check(H5Awrite(attr.get(), mem_type, value), path, std::string("attribute ") + name);
}

void write_string_attr(hid_t loc, const char* name, const std::string& value,
                       const std::string& path) {
  // Fixed-length, NUL-terminated ASCII: readable by every HDF5 tool.
  Hid type = checked(H5Tcopy(H5T_C_S1), H5Tclose, path, name);
  check(H5Tset_size(type.get(), value.size() + 1), path, name);
  check(H5Tset_strpad(type.get(), H5T_STR_NULLTERM), path, name);
  Hid space = checked(H5Screate(H5S_SCALAR), H5Sclose, path, name);
  Hid attr = checked(H5Acreate2(loc, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT),
                     H5Aclose, path, std::string("attribute ") + name);
  check(H5Awrite(attr.get(), type.get(), value.c_str()), path, std::string("attribute ") + name);
}

// A 1-D chunked, Fletcher32-checksummed dataset of n elements.
void write_dataset(hid_t loc, const std::string& name, hid_t file_type, hid_t mem_type,
                   const void* data, hsize_t n, const std::string& path) {
  const std::string what = "dataset /" + name;
  // A chunk must fit within the maximum extent, so an empty dataset gets an
  // unlimited one; otherwise the extent is fixed.
  const hsize_t dims[1] = {n};
  const hsize_t maxdims[1] = {n == 0 ? H5S_UNLIMITED : n};
  const hsize_t chunk[1] = {std::clamp<hsize_t>(n, 1, kChunkElements)};
  Hid space = checked(H5Screate_simple(1, dims, maxdims), H5Sclose, path, what);
  Hid dcpl = checked(H5Pcreate(H5P_DATASET_CREATE), H5Pclose, path, what);
  check(H5Pset_chunk(dcpl.get(), 1, chunk), path, what);
  check(H5Pset_fletcher32(dcpl.get()), path, what);
  Hid lcpl = checked(H5Pcreate(H5P_LINK_CREATE), H5Pclose, path, what);
  check(H5Pset_create_intermediate_group(lcpl.get(), 1), path, what);
  Hid dset = checked(
      H5Dcreate2(loc, name.c_str(), file_type, space.get(), lcpl.get(), dcpl.get(), H5P_DEFAULT),
      H5Dclose, path, what);
  if (n > 0) check(H5Dwrite(dset.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), path, what);
}

// Checks one side before anything is written, so a bad shard never reaches disk.
// `name` is "" (lm) or "source "/"target ".
void validate_for_write(const TokenSequences& seq, const std::string& name, int vocab_size,
                        const std::string& path) {
  if (seq.offsets.empty() || seq.offsets.front() != 0) {
    fail(path, "cannot write: " + name + "offsets must start with 0");
  }
  for (size_t i = 0; i + 1 < seq.offsets.size(); ++i) {
    if (seq.offsets[i + 1] < seq.offsets[i]) {
      fail(path, "cannot write: " + name + "offsets are not non-decreasing at sequence " +
                     std::to_string(i));
    }
  }
  if (seq.offsets.back() != seq.tokens.size()) {
    fail(path, "cannot write: " + name + "offsets end at " + std::to_string(seq.offsets.back()) +
                   " but there are " + std::to_string(seq.tokens.size()) + " tokens");
  }
  for (size_t i = 0; i < seq.tokens.size(); ++i) {
    const int32_t t = seq.tokens[i];
    if (t < 0 || t >= vocab_size) {
      fail(path, "cannot write: " + name + "token id " + std::to_string(t) + " at position " +
                     std::to_string(i) + " is not in [0, vocab_size " + std::to_string(vocab_size) +
                     ")");
    }
  }
}

void write_side(hid_t file, const std::string& prefix, const TokenSequences& seq, int vocab_size,
                const std::string& path) {
  if (vocab_size <= kUint16Vocab) {
    std::vector<uint16_t> narrow(seq.tokens.begin(), seq.tokens.end());  // (tokens)
    write_dataset(file, prefix + "tokens", H5T_STD_U16LE, H5T_NATIVE_UINT16, narrow.data(),
                  narrow.size(), path);
  } else {
    write_dataset(file, prefix + "tokens", H5T_STD_I32LE, H5T_NATIVE_INT32, seq.tokens.data(),
                  seq.tokens.size(), path);
  }
  write_dataset(file, prefix + "offsets", H5T_STD_U64LE, H5T_NATIVE_UINT64, seq.offsets.data(),
                seq.offsets.size(), path);
}

void write_shard_file(const std::string& path, const Shard& shard) {
  const ShardHeader& h = shard.header;
  Hid file = checked(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose,
                     path, "the file");
  const hid_t root = file.get();
  write_string_attr(root, "format", kFormatName, path);
  const int version = kShardVersion;
  write_int_attr(root, "version", H5T_STD_I32LE, H5T_NATIVE_INT, &version, path);
  write_string_attr(root, "kind", h.kind, path);
  const std::pair<const char*, int> ints[] = {
      {"vocab_size", h.vocab_size}, {"pad_id", h.special.pad}, {"bos_id", h.special.bos},
      {"eos_id", h.special.eos},    {"unk_id", h.special.unk}, {"mask_id", h.special.mask},
      {"sep_id", h.special.sep}};
  for (const auto& [name, value] : ints) {
    write_int_attr(root, name, H5T_STD_I32LE, H5T_NATIVE_INT, &value, path);
  }
  const bool seq2seq = h.kind == "seq2seq";
  const uint64_t sequences = shard.target.count();
  const uint64_t tokens = shard.target.tokens.size() + (seq2seq ? shard.source.tokens.size() : 0);
  write_int_attr(root, "sequences", H5T_STD_U64LE, H5T_NATIVE_UINT64, &sequences, path);
  write_int_attr(root, "tokens", H5T_STD_U64LE, H5T_NATIVE_UINT64, &tokens, path);

  write_dataset(root, "tokenizer", H5T_STD_U8LE, H5T_NATIVE_UINT8, h.tokenizer.data(),
                h.tokenizer.size(), path);
  if (seq2seq) {
    write_side(root, "src/", shard.source, h.vocab_size, path);
    write_side(root, "tgt/", shard.target, h.vocab_size, path);
  } else {
    write_side(root, "", shard.target, h.vocab_size, path);
  }
  check(H5Fflush(root, H5F_SCOPE_LOCAL), path, "the file");
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

// Opens for reading with file locking off: shards are immutable once
// renamed into place, and parallel file systems often lack flock().
Hid open_for_reading(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) fail(path, "no such file");
  if (fs::is_directory(path, ec)) fail(path, "is a directory, not a shard file");
  {
    std::ifstream probe(path, std::ios::binary);
    if (!probe) fail(path, std::string("cannot open for reading (") + std::strerror(errno) + ")");
  }
  const htri_t is_hdf5 = H5Fis_hdf5(path.c_str());
  if (is_hdf5 <= 0) fail(path, "not an HDF5 file");
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

bool has_attr(hid_t loc, const char* name) {
  return H5Aexists(loc, name) > 0;
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
  while (!value.empty() && value.back() == ' ') value.pop_back();  // space-padded strings
  return value;
}

template <class T>
T read_int_attr(hid_t loc, const char* name, const std::string& path) {
  Hid attr = open_attr(loc, name, path);
  Hid type(H5Aget_type(attr.get()), H5Tclose);
  if (!type.ok() || H5Tget_class(type.get()) != H5T_INTEGER) {
    fail(path, std::string("attribute '") + name + "' is " +
                   (type.ok() ? type_name(type.get()) : "unreadable") + ", expected an integer");
  }
  // Read wide, then range-check: HDF5 would silently clamp a narrowing read.
  const bool is_signed = H5Tget_sign(type.get()) == H5T_SGN_2;
  if (is_signed) {
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

// Header attributes plus /tokenizer; `sequences`/`tokens` receive the
// count attributes.
ShardHeader read_header(hid_t file, const std::string& path, uint64_t* sequences,
                        uint64_t* tokens) {
  if (!has_attr(file, "format")) fail(path, "not an mpiformer shard (no 'format' attribute)");
  const std::string format = read_string_attr(file, "format", path);
  if (format != kFormatName) fail(path, "not an mpiformer shard (format is '" + format + "')");
  ShardHeader h;
  h.version = read_int_attr<int>(file, "version", path);
  if (h.version != kShardVersion) {
    fail(path, "unsupported shard version " + std::to_string(h.version) +
                   " (this build reads version " + std::to_string(kShardVersion) + ")");
  }
  h.kind = read_string_attr(file, "kind", path);
  if (h.kind != "lm" && h.kind != "seq2seq") {
    fail(path, "kind '" + h.kind + "' is not lm or seq2seq");
  }
  h.vocab_size = read_int_attr<int>(file, "vocab_size", path);
  if (h.vocab_size <= 0)
    fail(path, "vocab_size " + std::to_string(h.vocab_size) + " is not positive");
  const std::pair<const char*, int*> ids[] = {
      {"pad_id", &h.special.pad}, {"bos_id", &h.special.bos},   {"eos_id", &h.special.eos},
      {"unk_id", &h.special.unk}, {"mask_id", &h.special.mask}, {"sep_id", &h.special.sep}};
  for (const auto& [name, value] : ids) {
    *value = read_int_attr<int>(file, name, path);
    if (*value < 0 || *value >= h.vocab_size) {
      fail(path, std::string(name) + " " + std::to_string(*value) + " is not in [0, vocab_size " +
                     std::to_string(h.vocab_size) + ")");
    }
  }
  *sequences = read_int_attr<uint64_t>(file, "sequences", path);
  *tokens = read_int_attr<uint64_t>(file, "tokens", path);

  // /tokenizer: uint8 bytes of the SentencePiece model.
  if (H5Lexists(file, "tokenizer", H5P_DEFAULT) <= 0) fail(path, "missing dataset /tokenizer");
  Hid dset(H5Dopen2(file, "tokenizer", H5P_DEFAULT), H5Dclose);
  if (!dset.ok()) fail_corrupt(path, "open /tokenizer");
  Hid space(H5Dget_space(dset.get()), H5Sclose);
  if (!space.ok() || H5Sget_simple_extent_ndims(space.get()) != 1) {
    fail(path, "/tokenizer is not a 1-D dataset");
  }
  const hssize_t n = H5Sget_simple_extent_npoints(space.get());
  h.tokenizer.resize(static_cast<size_t>(n));
  if (n > 0 && H5Dread(dset.get(), H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT,
                       h.tokenizer.data()) < 0) {
    fail_corrupt(path, "read /tokenizer");
  }
  return h;
}

// Opens a 1-D integer dataset; returns its length in `n`.
Hid open_int_dataset(hid_t file, const std::string& name, const std::string& path, hsize_t* n) {
  if (H5Lexists(file, name.c_str(), H5P_DEFAULT) <= 0) fail(path, "missing dataset " + name);
  Hid dset(H5Dopen2(file, name.c_str(), H5P_DEFAULT), H5Dclose);
  if (!dset.ok()) fail_corrupt(path, "open " + name);
  Hid space(H5Dget_space(dset.get()), H5Sclose);
  if (!space.ok() || H5Sget_simple_extent_ndims(space.get()) != 1) {
    fail(path, name + " is not a 1-D dataset");
  }
  Hid type(H5Dget_type(dset.get()), H5Tclose);
  if (!type.ok() || H5Tget_class(type.get()) != H5T_INTEGER) {
    fail(path, name + " holds " + (type.ok() ? type_name(type.get()) : "unreadable") +
                   " values, expected integers");
  }
  *n = static_cast<hsize_t>(H5Sget_simple_extent_npoints(space.get()));
  return dset;
}

// Reads one side: `prefix` is "/" (lm) or "/src/", "/tgt/".
void read_side(hid_t file, const std::string& prefix, int vocab_size, const std::string& path,
               TokenSequences* out) {
  const std::string offsets_name = prefix + "offsets";
  const std::string tokens_name = prefix + "tokens";

  hsize_t n_offsets = 0;
  Hid offsets = open_int_dataset(file, offsets_name, path, &n_offsets);
  if (n_offsets == 0) fail(path, offsets_name + " is empty (it needs sequences + 1 entries)");
  out->offsets.resize(n_offsets);  // (n+1)
  if (H5Dread(offsets.get(), H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT,
              out->offsets.data()) < 0) {
    fail_corrupt(path, "read " + offsets_name);
  }

  hsize_t n_tokens = 0;
  Hid tokens = open_int_dataset(file, tokens_name, path, &n_tokens);
  out->tokens.resize(n_tokens);  // (tokens)
  if (n_tokens > 0) {
    Hid type(H5Dget_type(tokens.get()), H5Tclose);
    const bool is_u16 = H5Tget_size(type.get()) == 2 && H5Tget_sign(type.get()) == H5T_SGN_NONE;
    if (is_u16) {
      // The common case: read narrow in one call, widen in a tight loop.
      std::vector<uint16_t> narrow(n_tokens);  // (tokens)
      if (H5Dread(tokens.get(), H5T_NATIVE_UINT16, H5S_ALL, H5S_ALL, H5P_DEFAULT, narrow.data()) <
          0) {
        fail_corrupt(path, "read " + tokens_name);
      }
      const uint16_t* src = narrow.data();
      int32_t* dst = out->tokens.data();
      for (hsize_t i = 0; i < n_tokens; ++i) dst[i] = src[i];
    } else if (H5Dread(tokens.get(), H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT,
                       out->tokens.data()) < 0) {
      fail_corrupt(path, "read " + tokens_name);
    }
  }

  const std::vector<uint64_t>& off = out->offsets;
  if (off[0] != 0) fail(path, offsets_name + " start at " + std::to_string(off[0]) + ", not 0");
  for (size_t i = 0; i + 1 < off.size(); ++i) {
    if (off[i + 1] < off[i]) {
      fail(path, offsets_name + " are not non-decreasing at sequence " + std::to_string(i) + " (" +
                     std::to_string(off[i]) + " then " + std::to_string(off[i + 1]) + ")");
    }
  }
  if (off.back() != n_tokens) {
    fail(path, offsets_name + " end at " + std::to_string(off.back()) + " but " + tokens_name +
                   " holds " + std::to_string(n_tokens));
  }

  // Range check as a branch-free min/max pass; locate the culprit only on failure.
  const int32_t* t = out->tokens.data();
  int32_t lo = 0, hi = 0;
  for (hsize_t i = 0; i < n_tokens; ++i) {
    lo = std::min(lo, t[i]);
    hi = std::max(hi, t[i]);
  }
  if (lo < 0 || hi >= vocab_size) {
    for (hsize_t i = 0; i < n_tokens; ++i) {
      if (t[i] < 0) {
        fail(path, "token id " + std::to_string(t[i]) + " at position " + std::to_string(i) +
                       " of " + tokens_name + " is negative");
      }
      if (t[i] >= vocab_size) {
        fail(path, "token id " + std::to_string(t[i]) + " at position " + std::to_string(i) +
                       " of " + tokens_name + " is not below vocab_size " +
                       std::to_string(vocab_size));
      }
    }
  }
}

}  // namespace

void TokenSequences::append(const int32_t* ids, size_t n) {
  tokens.insert(tokens.end(), ids, ids + n);
  offsets.push_back(tokens.size());
}

void write_shard(const std::string& path, const Shard& shard) {
  const ShardHeader& h = shard.header;
  if (h.kind != "lm" && h.kind != "seq2seq") {
    fail(path, "cannot write: kind '" + h.kind + "' is not lm or seq2seq");
  }
  if (h.vocab_size <= 0) fail(path, "cannot write: vocab_size must be positive");
  const bool seq2seq = h.kind == "seq2seq";
  validate_for_write(shard.target, seq2seq ? "target " : "", h.vocab_size, path);
  if (seq2seq) {
    validate_for_write(shard.source, "source ", h.vocab_size, path);
    if (shard.source.count() != shard.target.count()) {
      fail(path, "cannot write: " + std::to_string(shard.source.count()) + " source but " +
                     std::to_string(shard.target.count()) + " target sequences");
    }
  } else if (shard.source.count() != 0 || !shard.source.tokens.empty()) {
    fail(path, "cannot write: an lm shard has no source side");
  }

  Hdf5Session session;
  try {
    write_shard_file(path, shard);
  } catch (const ShardError&) {
    std::error_code ec;
    fs::remove(path, ec);  // leave no half-written file behind
    throw;
  }
}

Shard read_shard(const std::string& path) {
  Hdf5Session session;
  Hid file = open_for_reading(path);
  Shard shard;
  uint64_t sequences = 0, tokens = 0;
  shard.header = read_header(file.get(), path, &sequences, &tokens);
  const int vocab = shard.header.vocab_size;
  uint64_t stored_tokens = 0;
  if (shard.header.kind == "seq2seq") {
    read_side(file.get(), "/src/", vocab, path, &shard.source);
    read_side(file.get(), "/tgt/", vocab, path, &shard.target);
    if (shard.source.count() != shard.target.count()) {
      fail(path, "/src holds " + std::to_string(shard.source.count()) +
                     " sequences but /tgt holds " + std::to_string(shard.target.count()));
    }
    stored_tokens = shard.source.tokens.size() + shard.target.tokens.size();
  } else {
    read_side(file.get(), "/", vocab, path, &shard.target);
    stored_tokens = shard.target.tokens.size();
  }
  if (sequences != shard.target.count()) {
    fail(path, "attribute 'sequences' says " + std::to_string(sequences) + " but the file holds " +
                   std::to_string(shard.target.count()));
  }
  if (tokens != stored_tokens) {
    fail(path, "attribute 'tokens' says " + std::to_string(tokens) + " but the file holds " +
                   std::to_string(stored_tokens));
  }
  if (shard.target.count() == 0) fail(path, "empty shard (0 sequences)");
  return shard;
}

ShardHeader read_shard_header(const std::string& path) {
  Hdf5Session session;
  Hid file = open_for_reading(path);
  uint64_t sequences = 0, tokens = 0;
  return read_header(file.get(), path, &sequences, &tokens);
}

std::vector<std::string> list_shards(const std::string& dir, const std::string& prefix) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    throw ShardError(dir + (fs::exists(dir, ec) ? ": not a directory" : ": no such directory"));
  }
  // Names are PREFIX-DIGITS.h5; sorted by number so a set past 99999 files
  // (six digits) still comes out in order.
  const std::string head = prefix + "-";
  std::vector<std::pair<uint64_t, std::string>> found;
  try {
    for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
      const std::string name = e.path().filename().string();
      if (name.size() <= head.size() + 3 || name.compare(0, head.size(), head) != 0) continue;
      if (name.compare(name.size() - 3, 3, ".h5") != 0) continue;
      const std::string digits = name.substr(head.size(), name.size() - head.size() - 3);
      if (digits.empty() || digits.size() > 18 ||
          !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        continue;
      }
      found.emplace_back(std::stoull(digits), (fs::path(dir) / name).string());
    }
  } catch (const fs::filesystem_error& e) {
    throw ShardError(dir + ": cannot list (" + e.code().message() + ")");
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> paths;
  paths.reserve(found.size());
  for (auto& f : found) paths.push_back(std::move(f.second));
  return paths;
}

}  // namespace mpiformer
