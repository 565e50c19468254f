// Damage for the readers' tests: HDF5 metadata blocks of the newer file
// formats begin with a four-letter signature ("OHDR" an object header,
// "FRHP" a fractal heap, ...) and end in a checksum, so one byte changed
// inside a block makes HDF5 refuse it as it would a block of a damaged disk.
#pragma once

#include <fstream>
#include <iterator>
#include <string>

namespace mpiformer {

// Inverts the byte `offset` bytes after every occurrence of `signature` in
// the file at `path`, from occurrence `first` (0-based) on; returns how many
// blocks it damaged.
inline int damage_blocks(const std::string& path, const std::string& signature, size_t offset,
                         int first = 0) {
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  int seen = 0, damaged = 0;
  for (size_t at = bytes.find(signature); at != std::string::npos;
       at = bytes.find(signature, at + 1)) {
    if (seen++ < first || at + offset >= bytes.size()) continue;
    bytes[at + offset] = static_cast<char>(~bytes[at + offset]);
    ++damaged;
  }
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  return damaged;
}

}  // namespace mpiformer
