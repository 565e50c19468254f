// Arrays of images and labels from the files people already have: NumPy's
// .npz (np.savez, compressed or not) and HDF5 (h5py). For `prepare --kind
// image`; every fault is one std::runtime_error line naming the file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mpiformer {

// One n-dimensional array, row-major, as the file stored it.
struct ArrayData {
  std::vector<int64_t> shape;
  char kind = 'u';      // NumPy's kind: 'u', 'i', 'f' (numbers), 'S' (bytes), 'U' (UTF-32)
  size_t itemsize = 1;  // bytes per element
  std::vector<uint8_t> bytes;

  int64_t elements() const;
  // The elements as integers; refuses floats and strings.
  std::vector<int64_t> integers(const std::string& what) const;
  // 'S' or 'U' elements as strings (ASCII), trailing NULs dropped.
  std::vector<std::string> strings(const std::string& what) const;
};

// The arrays of an .npz file, or the datasets of an HDF5 file, by name;
// `names` lists what to read, and a name missing from the file is left out
// of the result when `required` is false.
struct NamedArray {
  std::string name;
  bool required = true;
};
std::vector<std::pair<std::string, ArrayData>> read_arrays(const std::string& path,
                                                           const std::vector<NamedArray>& names);

}  // namespace mpiformer
