#include "src/io/declared_size.h"

namespace mpiformer {

using hdf5::Hid;

double stored_ratio_bound(hid_t dcpl) {
  // zlib's deflate never stores fewer than about 1 byte per 1032.
  constexpr double kDeflateRatio = 1032;
  const int n = H5Pget_nfilters(dcpl);
  for (int i = 0; i < n; ++i) {
    unsigned flags = 0, config = 0;
    size_t values = 0;
    char name[64];
    const H5Z_filter_t id = H5Pget_filter2(dcpl, static_cast<unsigned>(i), &flags, &values, nullptr,
                                           sizeof name, name, &config);
    if (id != H5Z_FILTER_FLETCHER32 && id != H5Z_FILTER_SHUFFLE) return kDeflateRatio;
  }
  return 1;
}

hsize_t checked_extent(hid_t dset, const std::string& where, const hdf5::Faults& faults) {
  Hid space(H5Dget_space(dset), H5Sclose);
  Hid type(H5Dget_type(dset), H5Tclose);
  Hid dcpl(H5Dget_create_plist(dset), H5Pclose);
  Hid file(H5Iget_file_id(dset), H5Fclose);
  hsize_t file_bytes = 0;
  if (!space.ok() || !type.ok() || !dcpl.ok() || !file.ok() ||
      H5Fget_filesize(file.get(), &file_bytes) < 0) {
    faults.fail_corrupt("read the size of " + where);
  }
  const hssize_t elements = H5Sget_simple_extent_npoints(space.get());
  if (elements < 0) faults.fail_corrupt("read the size of " + where);
  const size_t element_bytes = H5Tget_size(type.get());
  // In double: a declared 2^64 elements of 8 bytes must not wrap around.
  const double declared = static_cast<double>(elements) * static_cast<double>(element_bytes);
  if (declared > static_cast<double>(file_bytes) * stored_ratio_bound(dcpl.get())) {
    faults.fail(where + " declares " + std::to_string(elements) + " elements of " +
                std::to_string(element_bytes) + " bytes, more than the " +
                std::to_string(file_bytes) + " bytes of the file can hold");
  }
  return static_cast<hsize_t>(elements);
}

void check_declared_size(hid_t loc, const std::string& name, const hdf5::Faults& faults) {
  Hid dset(H5Dopen2(loc, name.c_str(), H5P_DEFAULT), H5Dclose);
  const std::string where = name.front() == '/' ? name : "/" + name;
  if (!dset.ok()) faults.fail_corrupt("open " + where);
  checked_extent(dset.get(), where, faults);
}

}  // namespace mpiformer
