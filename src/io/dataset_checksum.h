// A CRC-32C (src/io/crc32c.h) stored beside a dataset as its attribute
// `crc32c`, and the root attribute `checksum` = "crc32c" that promises one
// on every dataset of the file (shards and checkpoints, data/FORMAT.md).
// The sum is over the values as the file stores them (their little-endian
// bytes, row-major), so any tool can check it from the raw values. A file
// without the promise (written before it, or by hand) has a dataset's sum
// checked where the dataset has one.
#pragma once

#include <hdf5.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "src/io/hdf5_file.h"

namespace mpiformer::hdf5 {

// The root attribute `checksum` = "crc32c": every dataset carries its sum.
void promise_checksums(hid_t root, const Faults& faults);

// The CRC-32C of n elements `data` of mem_type as file_type stores them
// (converted first where the two differ, e.g. int32 ids stored as uint16).
uint32_t stored_crc32c(const void* data, hid_t mem_type, hid_t file_type, size_t n,
                       const Faults& faults, const std::string& what);

// Attaches `crc` to `dset` as its attribute `crc32c` (uint32).
void write_crc32c(hid_t dset, uint32_t crc, const Faults& faults);

// Whether `dset` (`where` names it) has a sum, in *crc. A dataset without one
// in a file that promises them fails; "truncated or corrupt" where the
// attribute cannot be read.
bool stored_sum(hid_t dset, const std::string& where, const Faults& faults, uint32_t* crc);

// Fails "WHERE is damaged: its CRC-32C checksum is ..., its values sum to ..."
// when `computed` differs from `stored`.
void check_sum(uint32_t stored, uint32_t computed, const std::string& where, const Faults& faults);

// After a whole read of `dset` into `data` (n elements of mem_type):
// checks the values against the dataset's stored sum, if it has one. Where
// mem_type is not the stored type the stored values are read again.
void verify_read(hid_t dset, const void* data, hid_t mem_type, size_t n, const std::string& where,
                 const Faults& faults);

// A 1-D dataset of n elements in chunks of up to `chunk` elements, each
// Fletcher32-checksummed, and its CRC-32C; intermediate groups of `name`
// are created.
// data: (n) of mem_type
void write_vector_dataset(hid_t loc, const std::string& name, hid_t file_type, hid_t mem_type,
                          const void* data, hsize_t n, hsize_t chunk, const Faults& faults);

// `bytes` as a 1-D uint8 dataset `name` (checksummed), e.g. /tokenizer.
void write_bytes_dataset(hid_t loc, const char* name, const std::string& bytes,
                         const Faults& faults);

// A 1-D uint8 dataset `name` (e.g. /tokenizer) as bytes, its sum checked.
std::string read_bytes_dataset(hid_t loc, const char* name, const Faults& faults);

}  // namespace mpiformer::hdf5
