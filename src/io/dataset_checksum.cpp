#include "src/io/dataset_checksum.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include "src/core/escape.h"
#include "src/io/crc32c.h"

namespace mpiformer::hdf5 {

namespace {

constexpr const char* kPromiseAttr = "checksum";
constexpr const char* kPromised = "crc32c";
constexpr const char* kSumAttr = "crc32c";

bool same_type(hid_t a, hid_t b) {
  return H5Tequal(a, b) > 0;
}

std::string hex(uint32_t x) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%08x", x);
  return text;
}

// Whether the file holding `object` promises a sum on every dataset.
bool promised(hid_t object, const Faults& faults) {
  Hid file(H5Iget_file_id(object), H5Fclose);
  if (!file.ok()) faults.fail_corrupt("find the file of a dataset");
  if (!attr_exists(file.get(), kPromiseAttr, faults)) return false;
  const std::string kind = read_string_attr(file.get(), kPromiseAttr, faults);
  if (kind != kPromised) {
    faults.fail("attribute 'checksum' is '" + escaped(kind) + "'; this build checks '" + kPromised +
                "'");
  }
  return true;
}

}  // namespace

void promise_checksums(hid_t root, const Faults& faults) {
  write_string_attr(root, kPromiseAttr, kPromised, faults);
}

uint32_t stored_crc32c(const void* data, hid_t mem_type, hid_t file_type, size_t n,
                       const Faults& faults, const std::string& what) {
  const size_t file_size = H5Tget_size(file_type);
  if (same_type(mem_type, file_type)) return crc32c(data, n * file_size);
  const size_t mem_size = H5Tget_size(mem_type);
  std::vector<unsigned char> converted(n * std::max(mem_size, file_size));  // (n) widest
  if (n > 0) std::memcpy(converted.data(), data, n * mem_size);
  faults.check(H5Tconvert(mem_type, file_type, n, converted.data(), nullptr, H5P_DEFAULT), what);
  return crc32c(converted.data(), n * file_size);
}

void write_crc32c(hid_t dset, uint32_t crc, const Faults& faults) {
  write_int_attr(dset, kSumAttr, H5T_STD_U32LE, H5T_NATIVE_UINT32, &crc, faults);
}

bool stored_sum(hid_t dset, const std::string& where, const Faults& faults, uint32_t* crc) {
  if (!attr_exists(dset, kSumAttr, faults)) {
    if (promised(dset, faults)) {
      faults.fail(where +
                  " has no 'crc32c' attribute, which its file's 'checksum' attribute "
                  "promises on every dataset");
    }
    return false;
  }
  *crc = read_int_attr<uint32_t>(dset, kSumAttr, faults);
  return true;
}

void check_sum(uint32_t stored, uint32_t computed, const std::string& where, const Faults& faults) {
  if (stored == computed) return;
  faults.fail(where + " is damaged: its CRC-32C checksum is " + hex(stored) +
              " but its values sum to " + hex(computed));
}

void verify_read(hid_t dset, const void* data, hid_t mem_type, size_t n, const std::string& where,
                 const Faults& faults) {
  uint32_t stored = 0;
  if (!stored_sum(dset, where, faults, &stored)) return;
  Hid file_type(H5Dget_type(dset), H5Tclose);
  if (!file_type.ok()) faults.fail_corrupt("read the type of " + where);
  if (same_type(mem_type, file_type.get())) {
    return check_sum(stored, crc32c(data, n * H5Tget_size(mem_type)), where, faults);
  }
  // Read as converted: the stored values again, in the stored type made
  // little-endian (the sum's byte order, whatever the file's).
  Hid stored_type(H5Tcopy(file_type.get()), H5Tclose);
  if (!stored_type.ok()) faults.fail_corrupt("read the type of " + where);
  const H5T_class_t cls = H5Tget_class(stored_type.get());
  if ((cls == H5T_INTEGER || cls == H5T_FLOAT) && H5Tget_size(stored_type.get()) > 1)
    H5Tset_order(stored_type.get(), H5T_ORDER_LE);
  std::vector<unsigned char> raw(n * H5Tget_size(stored_type.get()));  // (n) as stored
  if (n > 0 && H5Dread(dset, stored_type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, raw.data()) < 0) {
    faults.fail_corrupt("read " + where);
  }
  check_sum(stored, crc32c(raw.data(), raw.size()), where, faults);
}

void write_vector_dataset(hid_t loc, const std::string& name, hid_t file_type, hid_t mem_type,
                          const void* data, hsize_t n, hsize_t chunk, const Faults& faults) {
  const std::string what = "dataset /" + name;
  // A chunk must fit within the maximum extent, so an empty dataset gets an
  // unlimited one; otherwise the extent is fixed.
  const hsize_t dims[1] = {n};
  const hsize_t maxdims[1] = {n == 0 ? H5S_UNLIMITED : n};
  Hid space = faults.checked(H5Screate_simple(1, dims, maxdims), H5Sclose, what);
  Hid dcpl = checksummed_chunks({std::clamp<hsize_t>(n, 1, chunk)}, faults, what);
  Hid lcpl = faults.checked(H5Pcreate(H5P_LINK_CREATE), H5Pclose, what);
  faults.check(H5Pset_create_intermediate_group(lcpl.get(), 1), what);
  Hid dset = faults.checked(
      H5Dcreate2(loc, name.c_str(), file_type, space.get(), lcpl.get(), dcpl.get(), H5P_DEFAULT),
      H5Dclose, what);
  if (n > 0) {
    faults.check(H5Dwrite(dset.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), what);
  }
  write_crc32c(dset.get(), stored_crc32c(data, mem_type, file_type, n, faults, what), faults);
}

void write_bytes_dataset(hid_t loc, const char* name, const std::string& bytes,
                         const Faults& faults) {
  write_vector_dataset(loc, name, H5T_STD_U8LE, H5T_NATIVE_UINT8, bytes.data(), bytes.size(),
                       hsize_t{64} << 10, faults);
}

std::string read_bytes_dataset(hid_t loc, const char* name, const Faults& faults) {
  const std::string where = std::string("/") + name;
  if (!link_exists(loc, name, faults)) faults.fail("missing dataset " + where);
  Hid dset(H5Dopen2(loc, name, H5P_DEFAULT), H5Dclose);
  if (!dset.ok()) faults.fail_corrupt("open " + where);
  Hid space(H5Dget_space(dset.get()), H5Sclose);
  if (!space.ok() || H5Sget_simple_extent_ndims(space.get()) != 1) {
    faults.fail(where + " is not a 1-D dataset");
  }
  const hssize_t n = H5Sget_simple_extent_npoints(space.get());
  std::string bytes(static_cast<size_t>(n), '\0');
  if (n > 0 &&
      H5Dread(dset.get(), H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, bytes.data()) < 0) {
    faults.fail_corrupt("read " + where);
  }
  verify_read(dset.get(), bytes.data(), H5T_NATIVE_UINT8, bytes.size(), where, faults);
  return bytes;
}

}  // namespace mpiformer::hdf5
