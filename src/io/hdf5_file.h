// HDF5 plumbing shared by the shard and checkpoint files: identifier
// ownership, the process-wide lock, silenced error printing, and attribute
// and file helpers. Every fault becomes one line "PATH: what is wrong",
// thrown as the caller's own exception type (ShardError, CheckpointError).
#pragma once

#include <hdf5.h>

#include <exception>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "src/core/config.h"

namespace mpiformer {

// The HDF5 library of this build is not thread-safe: every HDF5 call in the
// process (shards, checkpoints, metrics) must hold this lock. hdf5::Session
// takes it.
std::mutex& hdf5_mutex();

namespace hdf5 {

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
  // Gives up ownership: the caller closes the identifier.
  hid_t release() {
    const hid_t id = id_;
    id_ = H5I_INVALID_HID;
    return id;
  }
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

// Starts the HDF5 library for the whole process; call before MPI starts.
// HDF5 1.10 crashes when it shuts down holding a file whose close failed
// (a full disk), and it shuts down at exit and, when started after MPI, in
// MPI's finalisation. Started first and told not to shut down at exit, it never
// does: every file that matters is closed explicitly, and a failed one is
// left to the operating system.
void initialize_library();

// Holds hdf5_mutex() and silences HDF5's automatic error printing for the
// duration of one public call, restoring the caller's handler afterwards.
class Session {
 public:
  Session();
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

 private:
  std::lock_guard<std::mutex> lock_;
  H5E_auto2_t saved_func_ = nullptr;
  void* saved_data_ = nullptr;
};

// Reports the faults of one file as "PATH: what is wrong", thrown as the
// exception type chosen at construction, so that one set of helpers serves
// files whose callers catch different types.
class Faults {
 public:
  // Error: constructible from the message, e.g. ShardError.
  template <class Error>
  static Faults of(std::string path) {
    return Faults(std::move(path), [](const std::string& message) {
      return std::make_exception_ptr(Error(message));
    });
  }

  const std::string& path() const { return path_; }

  [[noreturn]] void fail(const std::string& what) const;
  // "truncated or corrupt (HDF5 could not WHAT: detail)". Call right after
  // the failing HDF5 call, before another one clears HDF5's error stack.
  [[noreturn]] void fail_corrupt(const std::string& what) const;
  // "WHAT (strerror(errno))".
  [[noreturn]] void fail_errno(const std::string& what) const;

  // Writing: a negative status fails with "cannot write WHAT (detail)".
  void check(herr_t status, const std::string& what) const;
  // Writing: owns `id`, or fails like check() when it is negative.
  Hid checked(hid_t id, herr_t (*close)(hid_t), const std::string& what) const;

 private:
  using MakeError = std::exception_ptr (*)(const std::string& message);
  Faults(std::string path, MakeError make_error)
      : path_(std::move(path)), make_error_(make_error) {}

  std::string path_;
  MakeError make_error_;
};

// "HDF5 1.10.8" for the library linked in.
std::string library_version();

// The class of `type` in words: "integer", "float", "string", ...
std::string type_name(hid_t type);

// Opens `path` read-only with file locking off (the files are immutable once
// renamed into place, a metrics file has one SWMR writer that needs no locks
// from readers, and parallel file systems often lack flock()). A file that
// HDF5 marks as open for writing (a run writing its metrics.h5 in SWMR mode,
// or one killed while it did) opens only when `beside_writer`, and then as an
// SWMR reader whose metadata checksum retries are bounded
// (kSwmrReadAttempts): HDF5's own 100 attempts sleep 1 ns, 2 ns, 4 ns, ...
// between them and never end on a damaged file. Every other file opens as a
// plain reader, which does not retry. Returns an invalid Hid on failure, with
// HDF5's reason in `detail` when given.
Hid open_read_only(const std::string& path, std::string* detail = nullptr,
                   bool beside_writer = false);

// Attempts at a checksummed metadata read of a file open beside its SWMR
// writer: the sleeps between them add up to 2^N ns, about 0.27 s for 28.
// Enough for a writer to finish the write a reader caught half done.
constexpr unsigned kSwmrReadAttempts = 28;

// open_read_only after checking that the file exists, is a regular file
// (never a pipe, which would block), is readable and is HDF5; names a
// truncated file plainly. `noun` completes
// "is a directory, not a NOUN" ("shard file").
Hid open_for_reading(const Faults& faults, const std::string& noun, bool beside_writer = false);

// Refuses ("truncated or corrupt" aside, one line naming the object) a file
// that reaches outside itself or holds what mpiformer never writes: soft,
// external or user-defined links, virtual datasets, external storage, and
// filters other than Fletcher32, deflate and shuffle. A file from
// elsewhere could otherwise pull any local file's bytes into a checkpoint.
// read_format checks every file whose format it reads: every reader's.
void refuse_foreign_storage(hid_t file, const Faults& faults);

// Whether `path` ("a/b", "/a/b", relative to `loc`) names a link, each group
// on the way looked up in turn (H5Lexists faults on a missing parent). Links
// or attributes that cannot be read are a damaged file: truncated or corrupt,
// never taken for missing ones.
bool link_exists(hid_t loc, const std::string& path, const Faults& faults);
// Whether `loc` has attribute `name`, as link_exists.
bool attr_exists(hid_t loc, const char* name, const Faults& faults);

// The root attribute `format` of an open file ("" when it has none), and
// refuse_foreign_storage; a file whose attributes cannot be read is
// reported truncated or corrupt.
std::string read_format(hid_t file, const Faults& faults);

// The root attribute `format` of the file open_for_reading opens ("" when it
// has none); every fault as `faults` reports it.
std::string file_format(const Faults& faults, const std::string& noun, bool beside_writer = false);

// Creates the HDF5 file `path` with file access `fapl`. Whatever stood at
// the name goes first and the name must then be new (H5F_ACC_EXCL): a
// symbolic link planted there is removed, never written through. Returns
// an invalid Hid when HDF5 fails (its reason on its error stack).
Hid create_anew(const std::string& path, hid_t fapl, const Faults& faults);

// True when `path` is an HDF5 file whose root attribute `format` is
// `format`; false for anything else, never throws.
bool has_format(const std::string& path, const std::string& format, bool beside_writer = false);

// A scalar integer attribute: `value` in mem_type, stored as file_type.
void write_int_attr(hid_t loc, const char* name, hid_t file_type, hid_t mem_type, const void* value,
                    const Faults& faults);

// A fixed-length, NUL-terminated ASCII string attribute.
void write_string_attr(hid_t loc, const char* name, const std::string& value, const Faults& faults);

// Dataset creation properties: chunks of `chunk` elements (one entry per
// dimension), each Fletcher32-checksummed so damage is refused on reading.
Hid checksummed_chunks(const std::vector<hsize_t>& chunk, const Faults& faults,
                       const std::string& what);

// A scalar float64 attribute.
void write_double_attr(hid_t loc, const char* name, double value, const Faults& faults);

// The special token ids as the int32 attributes pad_id, bos_id, eos_id,
// unk_id, mask_id and sep_id.
void write_special_token_attrs(hid_t loc, const SpecialTokens& special, const Faults& faults);

// A fixed- or variable-length string attribute (h5py writes the latter), as
// stored: padding is the caller's business.
std::string read_string_attr(hid_t loc, const char* name, const Faults& faults);

// An integer attribute of any stored width, range-checked into T (int,
// uint32_t, int64_t or uint64_t).
template <class T>
T read_int_attr(hid_t loc, const char* name, const Faults& faults);

// A scalar attribute of any float or integer type, as float64.
double read_double_attr(hid_t loc, const char* name, const Faults& faults);

// The attributes write_special_token_attrs wrote, each checked to lie in
// [0, vocab_size).
SpecialTokens read_special_token_attrs(hid_t loc, int vocab_size, const Faults& faults);

}  // namespace hdf5
}  // namespace mpiformer
