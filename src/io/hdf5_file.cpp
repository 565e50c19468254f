// HDF5 plumbing shared by shards and checkpoints; see hdf5_file.h.
#include "src/io/hdf5_file.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <stdexcept>

namespace mpiformer {

std::mutex& hdf5_mutex() {
  static std::mutex m;
  return m;
}

namespace hdf5 {
namespace {

namespace fs = std::filesystem;

// The innermost message of HDF5's current error stack: where the fault was
// detected ("truncated file: eof = ...", "data error detected by fletcher32
// checksum"). Must be called right after the failing call, before any other
// HDF5 call clears the stack.
std::string reason() {
  std::string reason;
  auto walk = [](unsigned n, const H5E_error2_t* err, void* data) -> herr_t {
    if (n == 0 && err->desc) *static_cast<std::string*>(data) = err->desc;
    return 0;
  };
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, walk, &reason);
  std::replace(reason.begin(), reason.end(), '\n', ' ');
  // A failed system call is described at length ("file write failed: time
  // = ..., errno = 28, error message = 'No space left on device', ..."):
  // the system's message is what a user needs.
  const std::string marker = "error message = '";
  const size_t at = reason.find(marker);
  if (at != std::string::npos) {
    const size_t begin = at + marker.size(), end = reason.find('\'', begin);
    if (end != std::string::npos) return reason.substr(begin, end - begin);
  }
  return reason;
}

std::string attr_what(const char* name) {
  return std::string("attribute ") + name;
}

std::string read_attr_what(const char* name) {
  return std::string("read attribute '") + name + "'";
}

// Opens attribute `name` of `loc`, which must hold a single value.
Hid open_attr(hid_t loc, const char* name, const Faults& faults) {
  if (!attr_exists(loc, name, faults)) faults.fail(std::string("missing attribute '") + name + "'");
  Hid attr(H5Aopen(loc, name, H5P_DEFAULT), H5Aclose);
  if (!attr.ok()) faults.fail_corrupt(read_attr_what(name));
  Hid space(H5Aget_space(attr.get()), H5Sclose);
  if (!space.ok() || H5Sget_simple_extent_npoints(space.get()) != 1) {
    faults.fail(std::string("attribute '") + name + "' is not a single value");
  }
  return attr;
}

// The type of attribute `attr`, which must be of `cls`; `expected` names it
// ("a string").
Hid attr_type(hid_t attr, const char* name, H5T_class_t cls, const char* expected,
              const Faults& faults) {
  Hid type(H5Aget_type(attr), H5Tclose);
  if (!type.ok() || H5Tget_class(type.get()) != cls) {
    faults.fail(std::string("attribute '") + name + "' is " +
                (type.ok() ? type_name(type.get()) : "unreadable") + ", expected " + expected);
  }
  return type;
}

}  // namespace

// ---------------------------------------------------------------- library

void initialize_library() {
  H5dont_atexit();
  H5open();
}

// ---------------------------------------------------------------- sessions

Session::Session() : lock_(hdf5_mutex()) {
  H5Eget_auto2(H5E_DEFAULT, &saved_func_, &saved_data_);
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}

Session::~Session() {
  H5Eset_auto2(H5E_DEFAULT, saved_func_, saved_data_);
}

// ---------------------------------------------------------------- faults

void Faults::fail(const std::string& what) const {
  std::rethrow_exception(make_error_(path_ + ": " + what));
}

void Faults::fail_corrupt(const std::string& what) const {
  const std::string detail = reason();
  fail("truncated or corrupt (HDF5 could not " + what + (detail.empty() ? "" : ": " + detail) +
       ")");
}

void Faults::fail_errno(const std::string& what) const {
  fail(what + " (" + std::strerror(errno) + ")");
}

void Faults::check(herr_t status, const std::string& what) const {
  if (status < 0) {
    const int system_error = errno;
    std::string detail = reason();
    // Through MPI-IO, ROMIO reports a failed write as its generic
    // MPI_ERR_IO, or HDF5 its collective write's failure without a reason,
    // and not the system's; the failed write() left it in errno (writers
    // through MPI-IO clear errno before the call).
    if ((detail.empty() || detail.find("MPI_ERR_IO") != std::string::npos) && system_error != 0)
      detail = std::strerror(system_error);
    fail("cannot write " + what + (detail.empty() ? "" : " (" + detail + ")"));
  }
}

Hid Faults::checked(hid_t id, herr_t (*close)(hid_t), const std::string& what) const {
  if (id < 0) check(-1, what);
  return Hid(id, close);
}

// ---------------------------------------------------------------- files

std::string library_version() {
  unsigned major = 0, minor = 0, release = 0;
  H5get_libversion(&major, &minor, &release);
  return "HDF5 " + std::to_string(major) + "." + std::to_string(minor) + "." +
         std::to_string(release);
}

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

Hid open_read_only(const std::string& path, std::string* detail, bool beside_writer) {
  Hid fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  if (fapl.ok()) H5Pset_file_locking(fapl.get(), 0, 1);
  const hid_t access = fapl.ok() ? fapl.get() : H5P_DEFAULT;
  Hid file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, access), H5Fclose);
  // Before fapl closes: closing it clears HDF5's error stack.
  std::string why = file.ok() ? "" : reason();
  // HDF5 refuses a plain reader a file its superblock marks as open for
  // writing; an SWMR reader may follow a writer that started SWMR writing.
  if (!file.ok() && beside_writer && fapl.ok() &&
      why.find("already open for write") != std::string::npos &&
      H5Pset_metadata_read_attempts(fapl.get(), kSwmrReadAttempts) >= 0) {
    file = Hid(H5Fopen(path.c_str(), H5F_ACC_RDONLY | H5F_ACC_SWMR_READ, fapl.get()), H5Fclose);
    if (!file.ok()) why = reason();
  }
  if (!file.ok() && detail) *detail = why;
  return file;
}

Hid open_for_reading(const Faults& faults, const std::string& noun, bool beside_writer) {
  const std::string& path = faults.path();
  std::error_code ec;
  if (!fs::exists(path, ec)) faults.fail("no such file");
  if (fs::is_directory(path, ec)) faults.fail("is a directory, not a " + noun);
  // A pipe would block the reader until a writer came, and a device is no file.
  if (!fs::is_regular_file(path, ec)) faults.fail("not a regular file");
  if (::access(path.c_str(), R_OK) != 0) faults.fail_errno("cannot open for reading");
  if (H5Fis_hdf5(path.c_str()) <= 0) faults.fail("not an HDF5 file");
  std::string detail;
  Hid file = open_read_only(path, &detail, beside_writer);
  if (!file.ok()) {
    // A short file is the common case (an interrupted copy): say so plainly.
    unsigned long long eof = 0, base = 0, stored = 0;
    if (std::sscanf(detail.c_str(),
                    "truncated file: eof = %llu, sblock->base_addr = %llu, stored_eof = %llu", &eof,
                    &base, &stored) == 3) {
      faults.fail("truncated or corrupt (the file holds " + std::to_string(eof) +
                  " bytes but its HDF5 superblock says " + std::to_string(stored) + ")");
    }
    faults.fail("truncated or corrupt (HDF5 could not open the file" +
                (detail.empty() ? "" : ": " + detail) + ")");
  }
  return file;
}

namespace {

struct ForeignStorage {
  std::string object, what;  // the first object refused, and why
  std::string damage;        // or what HDF5 could not read, with its reason
};

// Records in `found` what is wrong with the dataset at `name`, if anything.
void check_dataset(hid_t group, const char* name, ForeignStorage* found) {
  Hid dset(H5Dopen2(group, name, H5P_DEFAULT), H5Dclose);
  Hid dcpl(dset.ok() ? H5Dget_create_plist(dset.get()) : H5I_INVALID_HID, H5Pclose);
  if (!dcpl.ok()) {
    found->damage = std::string("open /") + name + ": " + reason();
  } else if (H5Pget_layout(dcpl.get()) == H5D_VIRTUAL) {
    found->what = "is a virtual dataset (its data lies in other files)";
  } else if (H5Pget_external_count(dcpl.get()) != 0) {
    found->what = "is stored in external files";
  }
  const int filters = dcpl.ok() ? H5Pget_nfilters(dcpl.get()) : 0;
  for (int i = 0; i < filters && found->what.empty(); ++i) {
    unsigned flags = 0, config = 0;
    size_t values = 0;
    const H5Z_filter_t id = H5Pget_filter2(dcpl.get(), static_cast<unsigned>(i), &flags, &values,
                                           nullptr, 0, nullptr, &config);
    if (id != H5Z_FILTER_FLETCHER32 && id != H5Z_FILTER_DEFLATE && id != H5Z_FILTER_SHUFFLE) {
      found->what =
          "is filtered by HDF5 filter " + std::to_string(id) + ", which mpiformer never writes";
    }
  }
}

herr_t check_link(hid_t group, const char* name, const H5L_info_t* link, void* data) {
  auto* found = static_cast<ForeignStorage*>(data);
  if (link->type == H5L_TYPE_SOFT) {
    found->what = "is a soft link, which mpiformer never writes";
  } else if (link->type == H5L_TYPE_EXTERNAL) {
    found->what = "is an external link (to another file)";
  } else if (link->type != H5L_TYPE_HARD) {
    found->what = "is a user-defined link, which mpiformer never writes";
  } else {
    H5O_info_t info;
    if (H5Oget_info_by_name2(group, name, &info, H5O_INFO_BASIC, H5P_DEFAULT) < 0) {
      found->damage = std::string("read /") + name + ": " + reason();
    } else if (info.type == H5O_TYPE_DATASET) {
      check_dataset(group, name, found);
    }
  }
  if (found->what.empty() && found->damage.empty()) return 0;
  found->object = std::string("/") + name;
  return 1;  // stop: the first is enough
}

}  // namespace

void refuse_foreign_storage(hid_t file, const Faults& faults) {
  ForeignStorage found;
  // H5Lvisit visits a group reached twice (a loop of hard links) once.
  if (H5Lvisit(file, H5_INDEX_NAME, H5_ITER_INC, check_link, &found) < 0 && found.damage.empty())
    faults.fail_corrupt("list the file's objects");
  if (!found.damage.empty())
    faults.fail("truncated or corrupt (HDF5 could not " + found.damage + ")");
  if (!found.what.empty()) {
    faults.fail(found.object + " " + found.what + "; refusing a file that reaches outside itself");
  }
}

bool link_exists(hid_t loc, const std::string& path, const Faults& faults) {
  for (size_t slash = path.find('/', 1);; slash = path.find('/', slash + 1)) {
    const std::string prefix = path.substr(0, slash);
    const htri_t exists = H5Lexists(loc, prefix.c_str(), H5P_DEFAULT);
    if (exists < 0) faults.fail_corrupt("look up " + prefix);
    if (exists == 0) return false;
    if (slash == std::string::npos) return true;
  }
}

bool attr_exists(hid_t loc, const char* name, const Faults& faults) {
  const htri_t exists = H5Aexists(loc, name);
  if (exists < 0) faults.fail_corrupt(read_attr_what(name));
  return exists > 0;
}

std::string read_format(hid_t file, const Faults& faults) {
  if (!attr_exists(file, "format", faults)) return "";
  std::string format = read_string_attr(file, "format", faults);
  // After the root's attributes read: HDF5 1.10 crashes walking the links
  // of a damaged file that they would have found damaged first.
  refuse_foreign_storage(file, faults);
  // Strings written by other tools may be space-padded.
  while (!format.empty() && format.back() == ' ') format.pop_back();
  return format;
}

std::string file_format(const Faults& faults, const std::string& noun, bool beside_writer) {
  Session session;
  Hid file = open_for_reading(faults, noun, beside_writer);
  return read_format(file.get(), faults);
}

Hid create_anew(const std::string& path, hid_t fapl, const Faults& faults) {
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) faults.fail_errno("cannot replace " + path);
  return Hid(H5Fcreate(path.c_str(), H5F_ACC_EXCL, H5P_DEFAULT, fapl), H5Fclose);
}

bool has_format(const std::string& path, const std::string& format, bool beside_writer) {
  try {
    return file_format(Faults::of<std::runtime_error>(path), "HDF5 file", beside_writer) == format;
  } catch (const std::exception&) {
    return false;
  }
}

// ---------------------------------------------------------------- writing

void write_int_attr(hid_t loc, const char* name, hid_t file_type, hid_t mem_type, const void* value,
                    const Faults& faults) {
  const std::string what = attr_what(name);
  Hid space = faults.checked(H5Screate(H5S_SCALAR), H5Sclose, what);
  Hid attr = faults.checked(H5Acreate2(loc, name, file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT),
                            H5Aclose, what);
  faults.check(H5Awrite(attr.get(), mem_type, value), what);
}

void write_string_attr(hid_t loc, const char* name, const std::string& value,
                       const Faults& faults) {
  // Fixed-length, NUL-terminated ASCII: readable by every HDF5 tool.
  const std::string what = attr_what(name);
  Hid type = faults.checked(H5Tcopy(H5T_C_S1), H5Tclose, what);
  faults.check(H5Tset_size(type.get(), value.size() + 1), what);
  faults.check(H5Tset_strpad(type.get(), H5T_STR_NULLTERM), what);
  Hid space = faults.checked(H5Screate(H5S_SCALAR), H5Sclose, what);
  Hid attr = faults.checked(
      H5Acreate2(loc, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose, what);
  faults.check(H5Awrite(attr.get(), type.get(), value.c_str()), what);
}

Hid checksummed_chunks(const std::vector<hsize_t>& chunk, const Faults& faults,
                       const std::string& what) {
  Hid dcpl = faults.checked(H5Pcreate(H5P_DATASET_CREATE), H5Pclose, what);
  faults.check(H5Pset_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data()), what);
  faults.check(H5Pset_fletcher32(dcpl.get()), what);
  return dcpl;
}

void write_double_attr(hid_t loc, const char* name, double value, const Faults& faults) {
  write_int_attr(loc, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &value, faults);
}

void write_special_token_attrs(hid_t loc, const SpecialTokens& special, const Faults& faults) {
  const std::pair<const char*, int> ids[] = {{"pad_id", special.pad},   {"bos_id", special.bos},
                                             {"eos_id", special.eos},   {"unk_id", special.unk},
                                             {"mask_id", special.mask}, {"sep_id", special.sep}};
  for (const auto& [name, value] : ids) {
    write_int_attr(loc, name, H5T_STD_I32LE, H5T_NATIVE_INT, &value, faults);
  }
}

// ---------------------------------------------------------------- reading

std::string read_string_attr(hid_t loc, const char* name, const Faults& faults) {
  Hid attr = open_attr(loc, name, faults);
  Hid type = attr_type(attr.get(), name, H5T_STRING, "a string", faults);
  std::string value;
  const htri_t variable = H5Tis_variable_str(type.get());
  if (variable < 0) faults.fail_corrupt(read_attr_what(name));
  if (variable > 0) {
    // The memory type must keep the stored character set: HDF5 converts
    // neither way between ASCII and UTF-8 (h5py writes UTF-8).
    Hid mem(H5Tcopy(H5T_C_S1), H5Tclose);
    if (!mem.ok() || H5Tset_size(mem.get(), H5T_VARIABLE) < 0 ||
        H5Tset_cset(mem.get(), H5Tget_cset(type.get())) < 0) {
      faults.fail_corrupt(read_attr_what(name));
    }
    char* s = nullptr;
    if (H5Aread(attr.get(), mem.get(), &s) < 0) faults.fail_corrupt(read_attr_what(name));
    if (s) value = s;
    H5free_memory(s);  // HDF5 allocated the one string of a scalar attribute
  } else {
    const size_t size = H5Tget_size(type.get());
    std::vector<char> buf(size + 1, '\0');  // (size) plus a terminator
    if (H5Aread(attr.get(), type.get(), buf.data()) < 0) faults.fail_corrupt(read_attr_what(name));
    value.assign(buf.data(), strnlen(buf.data(), size));
  }
  return value;
}

template <class T>
T read_int_attr(hid_t loc, const char* name, const Faults& faults) {
  Hid attr = open_attr(loc, name, faults);
  Hid type = attr_type(attr.get(), name, H5T_INTEGER, "an integer", faults);
  const auto out_of_range = [&](const std::string& v) {
    faults.fail(std::string("attribute '") + name + "' = " + v + " is out of range");
  };
  // Read wide, then range-check: HDF5 would silently clamp a narrowing read.
  if (H5Tget_sign(type.get()) == H5T_SGN_2) {
    int64_t v = 0;
    if (H5Aread(attr.get(), H5T_NATIVE_INT64, &v) < 0) faults.fail_corrupt(read_attr_what(name));
    if (v < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
        (v > 0 && static_cast<uint64_t>(v) > std::numeric_limits<T>::max())) {
      out_of_range(std::to_string(v));
    }
    return static_cast<T>(v);
  }
  uint64_t v = 0;
  if (H5Aread(attr.get(), H5T_NATIVE_UINT64, &v) < 0) faults.fail_corrupt(read_attr_what(name));
  if (v > static_cast<uint64_t>(std::numeric_limits<T>::max())) out_of_range(std::to_string(v));
  return static_cast<T>(v);
}

double read_double_attr(hid_t loc, const char* name, const Faults& faults) {
  Hid attr = open_attr(loc, name, faults);
  Hid type(H5Aget_type(attr.get()), H5Tclose);
  const H5T_class_t cls = type.ok() ? H5Tget_class(type.get()) : H5T_NO_CLASS;
  if (cls != H5T_FLOAT && cls != H5T_INTEGER) {
    faults.fail(std::string("attribute '") + name + "' is " +
                (type.ok() ? type_name(type.get()) : "unreadable") + ", expected a number");
  }
  double v = 0;
  if (H5Aread(attr.get(), H5T_NATIVE_DOUBLE, &v) < 0) faults.fail_corrupt(read_attr_what(name));
  return v;
}

SpecialTokens read_special_token_attrs(hid_t loc, int vocab_size, const Faults& faults) {
  SpecialTokens special;
  const std::pair<const char*, int*> ids[] = {{"pad_id", &special.pad},   {"bos_id", &special.bos},
                                              {"eos_id", &special.eos},   {"unk_id", &special.unk},
                                              {"mask_id", &special.mask}, {"sep_id", &special.sep}};
  for (const auto& [name, value] : ids) {
    *value = read_int_attr<int>(loc, name, faults);
    if (*value < 0 || *value >= vocab_size) {
      faults.fail(std::string(name) + " " + std::to_string(*value) + " is not in [0, vocab_size " +
                  std::to_string(vocab_size) + ")");
    }
  }
  return special;
}

template int read_int_attr<int>(hid_t, const char*, const Faults&);
template int64_t read_int_attr<int64_t>(hid_t, const char*, const Faults&);
template uint32_t read_int_attr<uint32_t>(hid_t, const char*, const Faults&);
template uint64_t read_int_attr<uint64_t>(hid_t, const char*, const Faults&);

}  // namespace hdf5
}  // namespace mpiformer
