// The pieces of the checkpoint format (data/CHECKPOINT.md) that a writer or
// reader other than src/io/checkpoint.cpp's needs: the collective one of
// src/parallel/collective_checkpoint.h writes the same file through MPI-IO.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "src/core/parameters.h"
#include "src/io/checkpoint.h"
#include "src/io/hdf5_file.h"

namespace mpiformer {

// Every fault of a checkpoint or of its directory: a CheckpointError
// "PATH: what".
inline hdf5::Faults checkpoint_faults(const std::string& path) {
  return hdf5::Faults::of<CheckpointError>(path);
}

// Chunk elements of /tokenizer and /label_names (or the whole dataset when smaller).
constexpr hsize_t kCheckpointBytesChunk = hsize_t{64} << 10;

// Refuses (faults.fail "cannot write: ...") a state or parameter set the
// readers would refuse, before anything touches the disk.
void check_checkpoint_writable(const hdf5::Faults& faults, const ParameterSet& params,
                               const CheckpointState& state);

// Every root attribute of `state` (format, version, step, ..., run_id).
void write_checkpoint_attributes(hid_t root, const CheckpointState& state,
                                 const hdf5::Faults& faults);
// The attributes, then /tokenizer and /label_names where the state has them:
// what a single writer puts in a file before its tensors.
void write_checkpoint_header(hid_t root, const CheckpointState& state, const hdf5::Faults& faults);

// A tensor's chunks: at most 2^20 elements, whole rows (outermost dimension cut first).
std::vector<hsize_t> checkpoint_chunk_dims(const std::vector<hsize_t>& dims);

// More than the size of the checkpoint file of `params` and `state`:
// what a writer sets aside before it writes (reserve_file_space).
uint64_t checkpoint_file_bound(const ParameterSet& params, const CheckpointState& state);

// Creates the checkpoint file `tmp` (HDF5 1.8 format or later, no file
// locking) with a single writer. Whatever stood at the name goes first: a
// symbolic link planted there is removed, never written through.
hdf5::Hid create_checkpoint_file(const std::string& tmp, const hdf5::Faults& faults);

// A group of the layout ("params", "optimizer", then "m" and "v" in it).
hdf5::Hid create_checkpoint_group(hid_t loc, const char* name, const hdf5::Faults& faults);

// One float32 tensor in `group`, chunked and Fletcher32-checksummed; `what`
// names it in faults ("dataset /params/NAME").
// data: host (product of shape)
void write_checkpoint_tensor(hid_t group, const std::string& name, const std::vector<int>& shape,
                             const float* data, const hdf5::Faults& faults,
                             const std::string& what);

// Fails unless the open file's format and version attributes are a checkpoint's.
void check_checkpoint_format(hid_t root, const hdf5::Faults& faults);

// Member `name` of an open group (`where` is "/group/name"): a float32
// dataset, its name and shape, and with `with_data` its values.
CheckpointTensor read_checkpoint_tensor(hid_t group, const std::string& name,
                                        const std::string& where, const hdf5::Faults& faults,
                                        bool with_data);

// Runs a file operation of src/io/atomic_file.h, its faults as CheckpointError.
template <class Fn>
void durably(Fn&& operation) {
  try {
    operation();
  } catch (const CheckpointError&) {
    throw;
  } catch (const std::runtime_error& e) {
    throw CheckpointError(e.what());
  }
}

}  // namespace mpiformer
