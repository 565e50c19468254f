// The pieces of a collective HDF5 read or write of a checkpoint, shared by
// src/parallel/collective_checkpoint.cpp (the write) and
// collective_checkpoint_read.cpp (the read): every rank's first fault, the
// MPI-IO access, the blocks a rank's part of a tensor is moved in, and the
// checksums of the ranks' parts.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "src/core/parameters.h"
#include "src/io/crc32c.h"
#include "src/io/hdf5_file.h"
#include "src/parallel/agreement.h"
#include "src/parallel/communicator.h"

namespace mpiformer::collective_io {

// This rank's first fault; later steps are skipped, collective calls are not.
class FirstFault {
 public:
  bool ok() const { return what_.empty(); }
  const std::string& what() const { return what_; }
  void set(const std::string& what) {
    if (ok()) what_ = what.empty() ? "unknown error" : what;
  }
  // Runs `step` unless a fault came first; records what it throws.
  void attempt(const std::function<void()>& step) {
    if (!ok()) return;
    try {
      step();
    } catch (const std::exception& e) {
      set(e.what());
    }
  }

 private:
  std::string what_;
};

// The MPI-IO file access of every rank, as parallel HDF5 needs it.
// Metadata is written collectively (one rank writes, all agree on it); no
// file locking: parallel file systems often lack flock(), and only this run
// opens the temporary name.
hdf5::Hid mpio_access(const hdf5::Faults& faults);

// Collective transfers: filtered (checksummed) datasets are written only so.
hdf5::Hid collective_transfer(const hdf5::Faults& faults);

// A rank's part [lo, hi) of a row-major 1-D or 2-D tensor as at most three
// regular blocks: (0) the end of a first row, (1) whole rows, (2) the start
// of a last row; a 1-D part is block 1 alone. Each block is its own
// transfer with a memory space of the block's shape: a union of hyperslabs,
// or a memory space shaped unlike the file's selection, makes HDF5 1.10 map
// every element to its chunk one at a time (a whole checkpoint three times
// slower).
struct Block {
  int rank = 1;               // of the dataset
  hsize_t start[2] = {0, 0};  // in the dataset
  hsize_t count[2] = {0, 0};  // (count[0], count[1]) elements; 1-D: count[0]
  size_t first = 0;           // the block's first element, counted from lo
  size_t size() const { return rank == 1 ? count[0] : count[0] * count[1]; }
};
constexpr int kBlocks = 3;

// The blocks of [lo, hi) (all empty when lo >= hi); false for a dataset of
// another rank or with no columns.
bool blocks_of(const std::vector<hsize_t>& dims, size_t lo, size_t hi, Block (&blocks)[kBlocks]);

// Moves block `which` of every rank's part of `dset` between the file and
// `buffer` (this rank's part, from its first element): one collective
// H5Dwrite (write) or H5Dread. A rank whose block is empty, or that failed
// before (ok false), takes part with nothing selected. Returns the status.
herr_t transfer_block(hid_t dset, const Block& block, bool ok, hid_t dxpl, float* buffer,
                      bool write);

// Which blocks any rank moves, per tensor: block b of tensor i is moved when
// used[i * kBlocks + b] is non-zero. One collective: every rank must make
// the same transfers.
std::vector<int64_t> blocks_used(const Communicator& comm, const ParameterSet& params, size_t lo,
                                 size_t hi);

// Each rank's CRC-32C of its part of every tensor, summed over the ranks so
// that every rank can tell a whole tensor's: tensor t's slot for rank r is
// {lo, hi, crc} of the elements [lo, hi) of the tensor it moved.
class PartSums {
 public:
  PartSums(const Communicator& comm, size_t tensors)
      : world_(static_cast<size_t>(comm.size())),
        rank_(static_cast<size_t>(comm.rank())),
        slots_(tensors * world_ * 3, 0) {}

  // data: host (hi - lo) float32, elements [lo, hi) of tensor t.
  void record(size_t t, size_t lo, size_t hi, const float* data) {
    int64_t* slot = &slots_[(t * world_ + rank_) * 3];
    slot[0] = static_cast<int64_t>(lo);
    slot[1] = static_cast<int64_t>(hi);
    slot[2] = crc32c(data, (hi - lo) * sizeof(float));
  }
  // One collective: every rank's parts.
  void gather(const Communicator& comm) {
    comm.allreduce_sum(slots_.data(), static_cast<int>(slots_.size()));
  }
  // Tensor t's sum (size elements), chained from parts that start where the
  // last ended; none where the parts leave a hole.
  std::optional<uint32_t> whole(size_t t, size_t size) const {
    uint32_t crc = 0;
    int64_t at = 0;
    while (at < static_cast<int64_t>(size)) {
      const int64_t* next = nullptr;
      for (size_t r = 0; r < world_; ++r) {
        const int64_t* slot = &slots_[(t * world_ + r) * 3];
        if (slot[0] == at && slot[1] > at && (!next || slot[1] > next[1])) next = slot;
      }
      if (!next) return std::nullopt;
      crc = crc32c_combine(crc, static_cast<uint32_t>(next[2]),
                           static_cast<uint64_t>(next[1] - at) * sizeof(float));
      at = next[1];
    }
    return crc;
  }

 private:
  size_t world_, rank_;
  std::vector<int64_t> slots_;  // (tensors, world, 3)
};

// A tensor's shape as HDF5 dimensions.
std::vector<hsize_t> dims_of(const ParamInfo& info);

// This rank's verdict on `fault`: "[rank r] what", exit 1, when it failed.
Verdict verdict_of(const Communicator& comm, const FirstFault& fault);

}  // namespace mpiformer::collective_io
