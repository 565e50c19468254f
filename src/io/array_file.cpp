#include "src/io/array_file.h"

#include <hdf5.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <stdexcept>

#include "src/io/hdf5_file.h"

namespace mpiformer {
namespace {

[[noreturn]] void fail(const std::string& path, const std::string& why) {
  throw std::runtime_error(path + ": " + why);
}

uint32_t le32(const uint8_t* p) {
  return p[0] | (p[1] << 8) | (p[2] << 16) | (static_cast<uint32_t>(p[3]) << 24);
}
uint16_t le16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | (p[1] << 8));
}
uint64_t le64(const uint8_t* p) {
  return le32(p) | (static_cast<uint64_t>(le32(p + 4)) << 32);
}

// Whether n bytes at `at` lie within `size` (no overflow: `at` and `n`
// come from the file).
bool within(uint64_t at, uint64_t n, uint64_t size) {
  return at <= size && n <= size - at;
}

// ---- sizes the file claims ---------------------------------------------------

// Deflate makes at most 1032 bytes of one compressed byte (zlib's
// documented limit), so a member's array cannot be larger than this.
constexpr uint64_t kDeflateRatio = 1032;
// Bytes a member may hold past its array (NumPy writes none).
constexpr uint64_t kSlack = 64 * 1024;
// NumPy writes headers of a few hundred bytes and reads none over 10,000.
constexpr uint64_t kLongestNpyHeader = 64 * 1024;

uint64_t machine_memory() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return std::numeric_limits<uint64_t>::max();
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page);
}

std::string gib(uint64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f GiB", static_cast<double>(bytes) / (1ull << 30));
  return text;
}

// "(100, 8, 8) uint8"
std::string describe(const ArrayData& a) {
  std::string shape = "(";
  for (size_t i = 0; i < a.shape.size(); ++i) {
    shape += (i ? ", " : "") + std::to_string(a.shape[i]);
  }
  return shape + (a.shape.size() == 1 ? ",) " : ") ") + a.type;
}

// The bytes of the array `a` declares, refused before anything is allocated
// when a dimension is negative or the array is larger than this machine's
// memory.
uint64_t declared_bytes(const std::string& where, const ArrayData& a) {
  uint64_t bytes = a.itemsize;
  bool overflow = false;
  for (int64_t d : a.shape) {
    if (d < 0) fail(where, "declares a negative dimension: shape " + describe(a));
    if (d == 0) return 0;
    overflow = overflow || bytes > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(d);
    if (!overflow) bytes *= static_cast<uint64_t>(d);
  }
  const uint64_t memory = machine_memory();
  if (overflow || bytes > memory) {
    fail(where, "declares a " + describe(a) + " array of " +
                    (overflow ? "more than 2^64 bytes" : gib(bytes)) + ", more than the " +
                    gib(memory) + " of memory this machine has");
  }
  return bytes;
}

// NumPy's dtype in words: "uint8", "float64", "strings of 8 characters".
std::string type_words(char kind, size_t itemsize) {
  const std::string bits = std::to_string(8 * itemsize);
  switch (kind) {
    case 'u':
      return "uint" + bits;
    case 'i':
      return "int" + bits;
    case 'f':
      return "float" + bits;
    case 'c':
      return "complex" + bits;
    case 'b':
      return "bool";
    case 'S':
      return "byte strings of " + std::to_string(itemsize) + " bytes";
    case 'U':
      return "strings of " + std::to_string(itemsize / 4) + " characters";
    default:
      return std::string("dtype kind '") + kind + "'";
  }
}

// ---- .npy inside a zip archive (np.savez) ---------------------------------

struct ZipEntry {
  std::string name;
  uint16_t method = 0;  // 0 stored, 8 deflate
  uint64_t compressed = 0, size = 0, local_offset = 0;
};

// Where the end-of-directory record starts: the last 22 bytes, or earlier
// when a comment (at most 65535 bytes) follows it.
size_t find_end_record(const std::string& path, const std::vector<uint8_t>& z) {
  if (z.size() < 22) fail(path, "not a zip (.npz) archive: too short");
  for (size_t at = z.size() - 22 + 1; at-- > 0 && z.size() - at <= 22 + 65535;) {
    if (le32(&z[at]) == 0x06054b50) return at;
  }
  fail(path, "not a zip (.npz) archive: no end of directory");
}

struct ZipDirectoryPlace {
  uint64_t count = 0;   // entries
  uint64_t offset = 0;  // of the first entry
};

// The directory's entry count and offset, from the end record, or from the
// Zip64 one when NumPy's force_zip64 left 0xFFFFFFFF in the 32-bit fields.
ZipDirectoryPlace directory_place(const std::string& path, const std::vector<uint8_t>& z,
                                  size_t end) {
  const ZipDirectoryPlace place{le16(&z[end + 10]), le32(&z[end + 16])};
  const bool zip64 = (place.count == 0xFFFF || place.offset == 0xFFFFFFFF) && end >= 20 &&
                     le32(&z[end - 20]) == 0x07064b50;
  if (!zip64) return place;
  const uint64_t record = le64(&z[end - 20 + 8]);
  if (!within(record, 56, z.size()) || le32(&z[record]) != 0x06064b50) {
    fail(path, "bad Zip64 record");
  }
  return {le64(&z[record + 32]), le64(&z[record + 48])};
}

// An entry's Zip64 extra field: the 64-bit values of the fields that hold
// 0xFFFFFFFF, in order.
void read_zip64_extra(const uint8_t* extra, uint16_t extra_len, ZipEntry* e) {
  for (size_t x = 0; x + 4 <= extra_len;) {
    const uint16_t id = le16(extra + x), len = le16(extra + x + 2);
    if (id == 0x0001 && x + 4 + len <= extra_len) {
      const uint8_t* v = extra + x + 4;
      const uint8_t* v_end = v + len;
      for (uint64_t* field : {&e->size, &e->compressed, &e->local_offset}) {
        if (*field == 0xFFFFFFFF && v + 8 <= v_end) *field = le64(v), v += 8;
      }
    }
    x += 4 + len;
  }
}

// The directory entry at `at`; *next: where the one after it starts.
ZipEntry read_directory_entry(const std::string& path, const std::vector<uint8_t>& z, uint64_t at,
                              uint64_t* next) {
  if (!within(at, 46, z.size()) || le32(&z[at]) != 0x02014b50) fail(path, "damaged zip directory");
  ZipEntry e;
  e.method = le16(&z[at + 10]);
  e.compressed = le32(&z[at + 20]);
  e.size = le32(&z[at + 24]);
  const uint16_t name_len = le16(&z[at + 28]), extra_len = le16(&z[at + 30]),
                 comment_len = le16(&z[at + 32]);
  e.local_offset = le32(&z[at + 42]);
  if (!within(at + 46, name_len + extra_len, z.size())) fail(path, "damaged zip directory");
  e.name.assign(reinterpret_cast<const char*>(&z[at + 46]), name_len);
  read_zip64_extra(&z[at + 46 + name_len], extra_len, &e);
  *next = at + 46 + name_len + extra_len + comment_len;
  return e;
}

// The central directory, found through its end record.
std::vector<ZipEntry> zip_directory(const std::string& path, const std::vector<uint8_t>& z) {
  const ZipDirectoryPlace place = directory_place(path, z, find_end_record(path, z));
  std::vector<ZipEntry> entries;
  uint64_t at = place.offset;
  for (uint64_t i = 0; i < place.count; ++i)
    entries.push_back(read_directory_entry(path, z, at, &at));
  return entries;
}

// One member's bytes, front to back: stored ones as they are, deflated ones
// inflated only as far as they are read, so a member that inflates to far
// more than its array is refused without making the rest.
class MemberReader {
 public:
  MemberReader(const std::string& path, const std::vector<uint8_t>& z, const ZipEntry& e)
      : path_(path), entry_(e) {
    const uint64_t at = e.local_offset;
    if (!within(at, 30, z.size()) || le32(&z[at]) != 0x04034b50) damaged();
    const uint64_t data = at + 30 + le16(&z[at + 26]) + le16(&z[at + 28]);
    if (!within(data, e.compressed, z.size())) fail(path, "truncated entry " + e.name);
    in_ = &z[0] + data;
    in_left_ = e.compressed;
    if (e.method == 0) {
      if (e.compressed != e.size) damaged();
      return;
    }
    if (e.method != 8) {
      fail(path, e.name + " is compressed with zip method " + std::to_string(e.method) +
                     "; only deflate is read");
    }
    if (inflateInit2(&stream_, -MAX_WBITS) != Z_OK) fail(path, "zlib could not start");
    inflating_ = true;
  }
  ~MemberReader() {
    if (inflating_) inflateEnd(&stream_);
  }
  MemberReader(const MemberReader&) = delete;
  MemberReader& operator=(const MemberReader&) = delete;

  bool deflated() const { return inflating_; }

  // Up to n bytes into `out`; fewer only at the member's end.
  uint64_t read(uint8_t* out, uint64_t n) {
    if (!inflating_) {
      const uint64_t got = std::min(n, in_left_);
      std::copy_n(in_, got, out);
      in_ += got, in_left_ -= got;
      return got;
    }
    // zlib counts in 32 bits: at most 1 GiB in and out at a time.
    constexpr uint64_t kStep = uint64_t{1} << 30;
    uint64_t got = 0;
    while (got < n && !ended_) {
      if (stream_.avail_in == 0 && in_left_ > 0) {
        const uint64_t step = std::min(in_left_, kStep);
        stream_.next_in = const_cast<Bytef*>(in_);
        stream_.avail_in = static_cast<uInt>(step);
        in_ += step, in_left_ -= step;
      }
      const uint64_t room = std::min(n - got, kStep);
      stream_.next_out = out + got;
      stream_.avail_out = static_cast<uInt>(room);
      const int status = inflate(&stream_, Z_NO_FLUSH);
      got += room - stream_.avail_out;
      if (status == Z_STREAM_END) {
        ended_ = true;
        if (stream_.total_out != entry_.size) damaged();
      } else if (status == Z_BUF_ERROR && stream_.avail_in == 0 && in_left_ == 0) {
        fail(path_, "truncated entry " + entry_.name);
      } else if (status != Z_OK && status != Z_BUF_ERROR) {
        damaged();
      }
    }
    return got;
  }

 private:
  [[noreturn]] void damaged() const { fail(path_, "damaged entry " + entry_.name); }

  const std::string& path_;
  const ZipEntry& entry_;
  const uint8_t* in_ = nullptr;
  uint64_t in_left_ = 0;
  z_stream stream_{};
  bool inflating_ = false, ended_ = false;
};

// A non-negative decimal integer, or -1.
int64_t parse_count(const std::string& text) {
  const size_t first = text.find_first_not_of(' ');
  const size_t last = text.find_last_not_of(' ');
  if (first == std::string::npos || last - first + 1 > 18) return -1;
  int64_t n = 0;
  for (size_t i = first; i <= last; ++i) {
    if (text[i] < '0' || text[i] > '9') return -1;
    n = n * 10 + (text[i] - '0');
  }
  return n;
}

// A .npy header dict: {'descr': '<i8', 'fortran_order': False, 'shape':
// (N, 8, 8), }; the array's type and shape, without its bytes.
ArrayData parse_npy_header(const std::string& where, const std::string& header) {
  const auto value_of = [&](const std::string& key) {
    const size_t k = header.find("'" + key + "'");
    if (k == std::string::npos || header.find(':', k) == std::string::npos) {
      fail(where, "no '" + key + "' in the .npy header");
    }
    return header.substr(header.find(':', k) + 1);
  };
  ArrayData a;
  std::string descr = value_of("descr");
  descr = descr.substr(descr.find('\'') + 1);
  descr = descr.substr(0, descr.find('\''));
  if (descr.size() < 3 || (descr[0] != '<' && descr[0] != '|' && descr[0] != '=')) {
    fail(where, "dtype '" + descr + "' is not a little-endian number or string");
  }
  a.kind = descr[1];
  const int64_t itemsize = parse_count(descr.substr(2, descr.find('[') - 2));
  // A size of 0 would let any shape fit in no bytes.
  if (itemsize <= 0 || itemsize > (int64_t{1} << 30)) {
    fail(where, "dtype '" + descr + "' is not read");
  }
  a.itemsize = static_cast<size_t>(itemsize);
  if (a.kind == 'U') a.itemsize *= 4;
  a.type = type_words(a.kind, a.itemsize);
  const std::string order = value_of("fortran_order");
  if (order.find("True") < order.find(',')) {
    fail(where, "Fortran-ordered arrays are not read; save with np.ascontiguousarray");
  }
  std::string shape = value_of("shape");
  const size_t open = shape.find('('), close = shape.find(')');
  if (open == std::string::npos || close == std::string::npos || close < open) {
    fail(where, "no shape in the .npy header");
  }
  shape = shape.substr(open + 1, close - open - 1);
  for (size_t at = 0; at < shape.size();) {
    const size_t comma = std::min(shape.find(',', at), shape.size());
    const std::string item = shape.substr(at, comma - at);
    if (item.find_first_not_of(' ') != std::string::npos) {
      const int64_t d = parse_count(item);
      if (d < 0) fail(where, "shape (" + shape + ") in the .npy header is not a list of sizes");
      a.shape.push_back(d);
    }
    at = comma + 1;
  }
  return a;
}

// A .npy file: magic, version, header length, the header, then the data.
// Its size is checked against the member before the data is read, and a
// member that goes on past its array is refused before the rest is made.
ArrayData read_npy(const std::string& where, MemberReader& member, const ZipEntry& e) {
  uint8_t start[12] = {};
  if (member.read(start, 10) < 10 || std::memcmp(start, "\x93NUMPY", 6) != 0) {
    fail(where, "not a .npy array");
  }
  const int major = start[6];
  if (major < 1 || major > 3) fail(where, ".npy version " + std::to_string(major) + " is not read");
  if (major > 1 && member.read(start + 10, 2) < 2) fail(where, "truncated .npy header");
  const uint64_t header_len = major == 1 ? le16(&start[8]) : le32(&start[8]);
  if (header_len > kLongestNpyHeader) {
    fail(where, "a .npy header of " + std::to_string(header_len) + " bytes; at most " +
                    std::to_string(kLongestNpyHeader) + " are read");
  }
  std::string header(header_len, '\0');
  if (member.read(reinterpret_cast<uint8_t*>(header.data()), header_len) < header_len) {
    fail(where, "truncated .npy header");
  }
  ArrayData a = parse_npy_header(where, header);
  const uint64_t bytes = declared_bytes(where, a);
  // Before allocating: could the member hold this much at all?
  const uint64_t data_start = (major == 1 ? 10 : 12) + header_len;
  if (member.deflated() && bytes / kDeflateRatio > e.compressed) {
    fail(where, "declares a " + describe(a) + " array of " + std::to_string(bytes) +
                    " bytes, more than its " + std::to_string(e.compressed) +
                    " compressed bytes can inflate to");
  }
  if (!member.deflated() && bytes > e.size - std::min(e.size, data_start)) {
    fail(where, "truncated .npy data");
  }
  a.bytes.resize(bytes);
  if (member.read(a.bytes.data(), bytes) < bytes) fail(where, "truncated .npy data");
  std::vector<uint8_t> rest(kSlack + 1);
  if (member.read(rest.data(), rest.size()) > kSlack) {
    fail(where, std::string(member.deflated() ? "inflates" : "amounts") + " to more than the " +
                    std::to_string(bytes) + " bytes of the " + describe(a) +
                    " array its .npy header declares" +
                    (member.deflated() ? "; not inflated further" : ""));
  }
  return a;
}

// The whole file, refused when larger than this machine's memory.
std::vector<uint8_t> read_whole(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) fail(path, "cannot open");
  const std::streamoff size = in.tellg();
  if (size < 0) fail(path, "cannot read");
  if (static_cast<uint64_t>(size) > machine_memory()) {
    fail(path, "holds " + gib(static_cast<uint64_t>(size)) + ", more than the " +
                   gib(machine_memory()) + " of memory this machine has");
  }
  std::vector<uint8_t> z(static_cast<size_t>(size));
  in.seekg(0);
  if (!in.read(reinterpret_cast<char*>(z.data()), size)) fail(path, "read error");
  return z;
}

std::map<std::string, ArrayData> read_npz(const std::string& path,
                                          const std::vector<NamedArray>& names) {
  const std::vector<uint8_t> z = read_whole(path);
  std::map<std::string, ArrayData> out;
  for (const ZipEntry& e : zip_directory(path, z)) {
    const std::string name = e.name.size() > 4 ? e.name.substr(0, e.name.size() - 4) : e.name;
    if (std::none_of(names.begin(), names.end(),
                     [&](const NamedArray& n) { return n.name == name; }))
      continue;
    MemberReader member(path, z, e);
    out[name] = read_npy(path + ":" + e.name, member, e);
  }
  return out;
}
// ---- HDF5 --------------------------------------------------------------------

std::map<std::string, ArrayData> read_h5(const std::string& path,
                                         const std::vector<NamedArray>& names) {
  const hdf5::Faults faults = hdf5::Faults::of<std::runtime_error>(path);
  hdf5::Session session;
  hdf5::Hid file = hdf5::open_for_reading(faults, "HDF5 file");
  std::map<std::string, ArrayData> out;
  for (const NamedArray& n : names) {
    if (!hdf5::link_exists(file.get(), n.name, faults)) continue;
    hdf5::Hid dset(H5Dopen2(file.get(), n.name.c_str(), H5P_DEFAULT), H5Dclose);
    if (!dset.ok()) faults.fail_corrupt("open " + n.name);
    hdf5::Hid space(H5Dget_space(dset.get()), H5Sclose);
    hdf5::Hid type(H5Dget_type(dset.get()), H5Tclose);
    const int rank = H5Sget_simple_extent_ndims(space.get());
    std::vector<hsize_t> dims(static_cast<size_t>(std::max(rank, 0)));
    H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
    ArrayData a;
    for (hsize_t d : dims) a.shape.push_back(static_cast<int64_t>(d));
    const H5T_class_t cls = H5Tget_class(type.get());
    const size_t stored_size = H5Tget_size(type.get());
    if (cls == H5T_INTEGER) {
      a.type = type_words(H5Tget_sign(type.get()) == H5T_SGN_NONE ? 'u' : 'i', stored_size);
    } else if (cls == H5T_FLOAT) {
      a.type = type_words('f', stored_size);
    } else if (cls == H5T_STRING) {
      a.type = type_words('S', stored_size);
    }
    hid_t mem = -1;
    hdf5::Hid string_type;
    const bool bytes = cls == H5T_INTEGER && H5Tget_size(type.get()) == 1 &&
                       H5Tget_sign(type.get()) == H5T_SGN_NONE;
    if (bytes) {
      a.kind = 'u', a.itemsize = 1, mem = H5T_NATIVE_UINT8;  // pixels, a byte each as in an .npy
    } else if (cls == H5T_INTEGER) {
      a.kind = 'i', a.itemsize = 8, mem = H5T_NATIVE_INT64;
    } else if (cls == H5T_FLOAT) {
      a.kind = 'f', a.itemsize = 8, mem = H5T_NATIVE_DOUBLE;
    } else if (cls == H5T_STRING && !H5Tis_variable_str(type.get())) {
      a.kind = 'S', a.itemsize = H5Tget_size(type.get());
      string_type = hdf5::Hid(H5Tcopy(type.get()), H5Tclose);
      mem = string_type.get();
    } else {
      faults.fail("/" + n.name + " holds " + hdf5::type_name(type.get()) +
                  " values; expected numbers or fixed-length strings");
    }
    if (a.itemsize == 0) faults.fail("/" + n.name + " holds strings of 0 bytes");
    a.bytes.resize(declared_bytes(path + ":/" + n.name, a));
    if (!a.bytes.empty() &&
        H5Dread(dset.get(), mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, a.bytes.data()) < 0) {
      faults.fail_corrupt("read " + n.name);
    }
    out[n.name] = std::move(a);
  }
  return out;
}

bool is_npz(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  in.read(magic, 4);
  return in && std::memcmp(magic, "PK\x03\x04", 4) == 0;
}

}  // namespace

int64_t ArrayData::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<int64_t> ArrayData::integers(const std::string& what) const {
  if ((kind != 'u' && kind != 'i') || itemsize > 8) {
    throw std::runtime_error(what + " holds " + type + " values; expected integers");
  }
  std::vector<int64_t> out(static_cast<size_t>(elements()));
  for (size_t i = 0; i < out.size(); ++i) {
    const uint8_t* p = &bytes[i * itemsize];
    uint64_t raw = 0;
    for (size_t k = 0; k < itemsize; ++k) raw |= static_cast<uint64_t>(p[k]) << (8 * k);
    if (kind == 'i' && itemsize < 8 && (raw >> (8 * itemsize - 1)) & 1) {
      raw |= ~uint64_t{0} << (8 * itemsize);  // sign-extend
    }
    out[i] = static_cast<int64_t>(raw);
  }
  return out;
}

std::vector<std::string> ArrayData::strings(const std::string& what) const {
  if (kind != 'S' && kind != 'U') {
    throw std::runtime_error(what + " holds numbers; expected strings");
  }
  std::vector<std::string> out;
  for (int64_t i = 0; i < elements(); ++i) {
    const uint8_t* p = &bytes[static_cast<size_t>(i) * itemsize];
    std::string s;
    if (kind == 'S') {
      s.assign(reinterpret_cast<const char*>(p), itemsize);
      s.erase(s.find_last_not_of('\0') + 1);
    } else {
      size_t end = itemsize;
      while (end >= 4 && le32(p + end - 4) == 0) end -= 4;
      for (size_t k = 0; k < end; k += 4) {
        // UTF-32 to UTF-8
        const uint32_t c = le32(p + k);
        if (c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff)) {
          throw std::runtime_error(what + " holds code point " + std::to_string(c) +
                                   ", not a Unicode character");
        }
        if (c < 0x80) {
          s += static_cast<char>(c);
        } else if (c < 0x800) {
          s += static_cast<char>(0xc0 | (c >> 6));
          s += static_cast<char>(0x80 | (c & 0x3f));
        } else if (c < 0x10000) {
          s += static_cast<char>(0xe0 | (c >> 12));
          s += static_cast<char>(0x80 | ((c >> 6) & 0x3f));
          s += static_cast<char>(0x80 | (c & 0x3f));
        } else {
          s += static_cast<char>(0xf0 | (c >> 18));
          s += static_cast<char>(0x80 | ((c >> 12) & 0x3f));
          s += static_cast<char>(0x80 | ((c >> 6) & 0x3f));
          s += static_cast<char>(0x80 | (c & 0x3f));
        }
      }
    }
    out.push_back(s);
  }
  return out;
}

std::vector<std::pair<std::string, ArrayData>> read_arrays(const std::string& path,
                                                           const std::vector<NamedArray>& names) {
  std::map<std::string, ArrayData> found =
      is_npz(path) ? read_npz(path, names) : read_h5(path, names);
  std::vector<std::pair<std::string, ArrayData>> out;
  for (const NamedArray& n : names) {
    const auto it = found.find(n.name);
    if (it == found.end()) {
      if (n.required) fail(path, "no array '" + n.name + "'");
      continue;
    }
    out.emplace_back(n.name, std::move(it->second));
  }
  return out;
}

}  // namespace mpiformer
