// A dataset's declared extent is what the file says, not what it holds: a
// chunked dataset whose chunks were never written reads as fill values, so
// a small file may declare 10^12 elements, and a reader that believes it
// allocates them. Every reader checks the extent against the file's size
// before allocating.
#pragma once

#include <hdf5.h>

#include <string>

#include "src/io/hdf5_file.h"

namespace mpiformer {

// The most raw bytes a dataset stored through `dcpl`'s filters may hold per
// byte of file: 1 without a filter that compresses (Fletcher32 and shuffle
// only, what mpiformer writes), else deflate's largest ratio (about 1032:1).
double stored_ratio_bound(hid_t dcpl);

// The elements dataset `dset` (named `where` in messages) declares, after
// checking that its file can hold them: faults.fail("WHERE declares N
// elements of B bytes, more than the F bytes of the file can hold") when
// N x B exceeds the file's size times stored_ratio_bound.
hsize_t checked_extent(hid_t dset, const std::string& where, const hdf5::Faults& faults);

// The same for the dataset `name` under `loc`, which must exist.
void check_declared_size(hid_t loc, const std::string& name, const hdf5::Faults& faults);

}  // namespace mpiformer
