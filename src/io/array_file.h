// Arrays of images and labels from the files people already have: NumPy's
// .npz (np.savez, compressed or not) and HDF5 (h5py). For `prepare --kind
// image`; every fault is one std::runtime_error line naming the file.
//
// Nothing is allocated at a size the file merely claims: an array larger
// than this machine's memory is refused, and so is an .npz member whose
// array could not fit in its compressed bytes (deflate makes at most 1032
// bytes of one) or that inflates to more than the array its .npy header
// declares (a zip bomb: it is not inflated past the array).
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
  std::string type;     // the elements' type as the file stores it: "uint8", "float64"
  std::vector<uint8_t> bytes;

  int64_t elements() const;
  // The elements as integers; refuses floats and strings.
  std::vector<int64_t> integers(const std::string& what) const;
  // 'S' elements as their bytes, 'U' elements as UTF-8, trailing NULs
  // dropped; refuses a 'U' element that is no Unicode character.
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
