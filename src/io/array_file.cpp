#include "src/io/array_file.h"

#include <hdf5.h>
#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>
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

// ---- .npy inside a zip archive (np.savez) ---------------------------------

struct ZipEntry {
  std::string name;
  uint16_t method = 0;  // 0 stored, 8 deflate
  uint64_t compressed = 0, size = 0, local_offset = 0;
};

// The central directory: the end record (the last 22 bytes, or earlier when
// a comment follows), and its Zip64 form when NumPy's force_zip64 left
// 0xFFFFFFFF in the 32-bit fields.
std::vector<ZipEntry> zip_directory(const std::string& path, const std::vector<uint8_t>& z) {
  if (z.size() < 22) fail(path, "not a zip (.npz) archive: too short");
  size_t end = std::string::npos;
  for (size_t at = z.size() - 22 + 1; at-- > 0 && z.size() - at <= 22 + 65535;) {
    if (le32(&z[at]) == 0x06054b50) {
      end = at;
      break;
    }
  }
  if (end == std::string::npos) fail(path, "not a zip (.npz) archive: no end of directory");
  uint64_t count = le16(&z[end + 10]);
  uint64_t offset = le32(&z[end + 16]);
  if ((count == 0xFFFF || offset == 0xFFFFFFFF) && end >= 20 && le32(&z[end - 20]) == 0x07064b50) {
    const uint64_t record = le64(&z[end - 20 + 8]);
    if (record + 56 > z.size() || le32(&z[record]) != 0x06064b50) fail(path, "bad Zip64 record");
    count = le64(&z[record + 32]);
    offset = le64(&z[record + 48]);
  }
  std::vector<ZipEntry> entries;
  uint64_t at = offset;
  for (uint64_t i = 0; i < count; ++i) {
    if (at + 46 > z.size() || le32(&z[at]) != 0x02014b50) fail(path, "damaged zip directory");
    ZipEntry e;
    e.method = le16(&z[at + 10]);
    e.compressed = le32(&z[at + 20]);
    e.size = le32(&z[at + 24]);
    const uint16_t name_len = le16(&z[at + 28]), extra_len = le16(&z[at + 30]),
                   comment_len = le16(&z[at + 32]);
    e.local_offset = le32(&z[at + 42]);
    if (at + 46 + name_len + extra_len > z.size()) fail(path, "damaged zip directory");
    e.name.assign(reinterpret_cast<const char*>(&z[at + 46]), name_len);
    // Zip64 extra field: the 64-bit values of the fields that hold 0xFFFFFFFF, in order.
    const uint8_t* extra = &z[at + 46 + name_len];
    for (size_t x = 0; x + 4 <= extra_len;) {
      const uint16_t id = le16(extra + x), len = le16(extra + x + 2);
      if (id == 0x0001) {
        const uint8_t* v = extra + x + 4;
        if (e.size == 0xFFFFFFFF) e.size = le64(v), v += 8;
        if (e.compressed == 0xFFFFFFFF) e.compressed = le64(v), v += 8;
        if (e.local_offset == 0xFFFFFFFF) e.local_offset = le64(v);
      }
      x += 4 + len;
    }
    entries.push_back(e);
    at += 46 + name_len + extra_len + comment_len;
  }
  return entries;
}

std::vector<uint8_t> zip_extract(const std::string& path, const std::vector<uint8_t>& z,
                                 const ZipEntry& e) {
  const uint64_t at = e.local_offset;
  if (at + 30 > z.size() || le32(&z[at]) != 0x04034b50) fail(path, "damaged entry " + e.name);
  const uint64_t data = at + 30 + le16(&z[at + 26]) + le16(&z[at + 28]);
  if (data + e.compressed > z.size()) fail(path, "truncated entry " + e.name);
  std::vector<uint8_t> out(e.size);
  if (e.method == 0) {
    if (e.compressed != e.size) fail(path, "damaged entry " + e.name);
    std::copy_n(z.begin() + static_cast<std::ptrdiff_t>(data), e.size, out.begin());
    return out;
  }
  if (e.method != 8)
    fail(path, e.name + " is compressed with zip method " + std::to_string(e.method) +
                   "; only deflate is read");
  z_stream s{};
  if (inflateInit2(&s, -MAX_WBITS) != Z_OK) fail(path, "zlib could not start");
  s.next_in = const_cast<Bytef*>(&z[data]);
  s.avail_in = static_cast<uInt>(e.compressed);
  s.next_out = out.data();
  s.avail_out = static_cast<uInt>(out.size());
  const int status = inflate(&s, Z_FINISH);
  inflateEnd(&s);
  if (status != Z_STREAM_END || s.total_out != e.size) fail(path, "damaged entry " + e.name);
  return out;
}

// A .npy file: magic, version, a header dict {'descr': '<i8', 'fortran_order':
// False, 'shape': (N, 8, 8), }, then the data.
ArrayData parse_npy(const std::string& where, const std::vector<uint8_t>& b) {
  if (b.size() < 10 || std::memcmp(b.data(), "\x93NUMPY", 6) != 0) fail(where, "not a .npy array");
  const int major = b[6];
  const size_t header_len = major == 1 ? le16(&b[8]) : le32(&b[8]);
  const size_t start = major == 1 ? 10 : 12;
  if (start + header_len > b.size()) fail(where, "truncated .npy header");
  const std::string header(reinterpret_cast<const char*>(&b[start]), header_len);
  const auto value_of = [&](const std::string& key) {
    const size_t k = header.find("'" + key + "'");
    if (k == std::string::npos) fail(where, "no '" + key + "' in the .npy header");
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
  a.itemsize = std::stoul(descr.substr(2));
  if (a.kind == 'U') a.itemsize *= 4;
  if (value_of("fortran_order").find("True") < value_of("fortran_order").find(',')) {
    fail(where, "Fortran-ordered arrays are not read; save with np.ascontiguousarray");
  }
  std::string shape = value_of("shape");
  shape = shape.substr(shape.find('(') + 1, shape.find(')') - shape.find('(') - 1);
  for (size_t at = 0; at < shape.size();) {
    const size_t comma = std::min(shape.find(',', at), shape.size());
    const std::string item = shape.substr(at, comma - at);
    if (item.find_first_not_of(' ') != std::string::npos) a.shape.push_back(std::stoll(item));
    at = comma + 1;
  }
  const size_t bytes = static_cast<size_t>(a.elements()) * a.itemsize;
  if (start + header_len + bytes > b.size()) fail(where, "truncated .npy data");
  a.bytes.assign(b.begin() + static_cast<std::ptrdiff_t>(start + header_len),
                 b.begin() + static_cast<std::ptrdiff_t>(start + header_len + bytes));
  return a;
}

std::map<std::string, ArrayData> read_npz(const std::string& path,
                                          const std::vector<NamedArray>& names) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "cannot open");
  const std::vector<uint8_t> z((std::istreambuf_iterator<char>(in)),
                               std::istreambuf_iterator<char>());
  std::map<std::string, ArrayData> out;
  for (const ZipEntry& e : zip_directory(path, z)) {
    const std::string name = e.name.size() > 4 ? e.name.substr(0, e.name.size() - 4) : e.name;
    if (std::none_of(names.begin(), names.end(),
                     [&](const NamedArray& n) { return n.name == name; }))
      continue;
    out[name] = parse_npy(path + ":" + e.name, zip_extract(path, z, e));
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
    a.bytes.resize(static_cast<size_t>(a.elements()) * a.itemsize);
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
  if (kind != 'u' && kind != 'i') {
    throw std::runtime_error(what + " holds " + std::string(1, kind) +
                             " values; expected integers");
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
  const size_t step = kind == 'U' ? 4 : 1;
  for (int64_t i = 0; i < elements(); ++i) {
    std::string s;
    for (size_t k = 0; k < itemsize; k += step) {
      const uint8_t c = bytes[static_cast<size_t>(i) * itemsize + k];
      if (c == 0) break;
      s += static_cast<char>(c);
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
