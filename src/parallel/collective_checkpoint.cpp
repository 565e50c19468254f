#include "src/parallel/collective_checkpoint.h"

#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <optional>
#include <utility>
#include <vector>

#include "src/core/error.h"
#include "src/io/atomic_file.h"
#include "src/io/checkpoint_layout.h"
#include "src/io/crc32c.h"
#include "src/io/dataset_checksum.h"
#include "src/io/hdf5_file.h"
#include "src/io/label_names.h"
#include "src/parallel/agreement.h"

namespace mpiformer {

namespace {

namespace fs = std::filesystem;
using hdf5::Hid;

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
Hid mpio_access(const hdf5::Faults& faults) {
  Hid fapl = faults.checked(H5Pcreate(H5P_FILE_ACCESS), H5Pclose, "the file");
  faults.check(H5Pset_fapl_mpio(fapl.get(), MPI_COMM_WORLD, MPI_INFO_NULL), "the file");
  faults.check(H5Pset_all_coll_metadata_ops(fapl.get(), true), "the file");
  faults.check(H5Pset_coll_metadata_write(fapl.get(), true), "the file");
  faults.check(H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V18, H5F_LIBVER_LATEST), "the file");
  faults.check(H5Pset_file_locking(fapl.get(), 0, 1), "the file");
  return fapl;
}

// Collective transfers: filtered (checksummed) datasets are written only so.
Hid collective_transfer(const hdf5::Faults& faults) {
  Hid dxpl = faults.checked(H5Pcreate(H5P_DATASET_XFER), H5Pclose, "the transfer");
  faults.check(H5Pset_dxpl_mpio(dxpl.get(), H5FD_MPIO_COLLECTIVE), "the transfer");
  return dxpl;
}

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
bool blocks_of(const std::vector<hsize_t>& dims, size_t lo, size_t hi, Block (&blocks)[kBlocks]) {
  for (Block& block : blocks) block = Block{};
  if (dims.size() == 1) {
    if (hi > lo) blocks[1] = Block{1, {lo, 0}, {hi - lo, 0}, 0};
    return true;
  }
  if (dims.size() != 2 || dims[1] == 0) return false;
  const hsize_t cols = dims[1];
  size_t pos = lo;
  if (pos < hi && pos % cols != 0) {
    const hsize_t n = std::min<hsize_t>(cols - pos % cols, hi - pos);
    blocks[0] = Block{2, {pos / cols, pos % cols}, {1, n}, 0};
    pos += n;
  }
  if (const hsize_t rows = pos < hi ? (hi - pos) / cols : 0; rows > 0) {
    blocks[1] = Block{2, {pos / cols, 0}, {rows, cols}, pos - lo};
    pos += rows * cols;
  }
  if (pos < hi) blocks[2] = Block{2, {pos / cols, 0}, {1, hi - pos}, pos - lo};
  return true;
}

// Moves block `which` of every rank's part of `dset` between the file and
// `buffer` (this rank's part, from its first element): one collective
// H5Dwrite (write) or H5Dread. A rank whose block is empty, or that failed
// before (ok false), takes part with nothing selected. Returns the status.
herr_t transfer_block(hid_t dset, const Block& block, bool ok, hid_t dxpl, float* buffer,
                      bool write) {
  Hid file_space(H5Dget_space(dset), H5Sclose);
  const bool mine = ok && block.size() > 0;
  const hsize_t one[2] = {1, 1};
  Hid memory(H5Screate_simple(block.rank, mine ? block.count : one, nullptr), H5Sclose);
  if (!file_space.ok() || !memory.ok()) return -1;
  const herr_t selected =
      mine ? H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, block.start, nullptr,
                                 block.count, nullptr)
           : std::min(H5Sselect_none(file_space.get()), H5Sselect_none(memory.get()));
  float* data = buffer + (mine ? block.first : 0);
  errno = 0;  // a failed write's reason (Faults::check)
  const herr_t moved =
      write ? H5Dwrite(dset, H5T_NATIVE_FLOAT, memory.get(), file_space.get(), dxpl, data)
            : H5Dread(dset, H5T_NATIVE_FLOAT, memory.get(), file_space.get(), dxpl, data);
  return selected < 0 ? selected : moved;
}

// Which blocks any rank moves, per tensor: block b of tensor i is moved when
// used[i * kBlocks + b] is non-zero. One collective: every rank must make
// the same transfers.
std::vector<int64_t> blocks_used(const Communicator& comm, const ParameterSet& params, size_t lo,
                                 size_t hi) {
  const std::vector<ParamInfo>& infos = params.info();
  std::vector<int64_t> used(infos.size() * kBlocks, 0);
  for (size_t i = 0; i < infos.size(); ++i) {
    const size_t begin = std::max(lo, infos[i].offset);
    const size_t end = std::min(hi, infos[i].offset + infos[i].size);
    Block blocks[kBlocks];
    const std::vector<hsize_t> dims(infos[i].shape.begin(), infos[i].shape.end());
    if (end > begin && blocks_of(dims, begin - infos[i].offset, end - infos[i].offset, blocks)) {
      for (int b = 0; b < kBlocks; ++b) used[i * kBlocks + b] = blocks[b].size() > 0;
    }
  }
  comm.allreduce_sum(used.data(), static_cast<int>(used.size()));
  return used;
}

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

// What a collective read checks: the sums the file holds (none where a
// tensor has none) and every rank's parts.
struct ReadSums {
  PartSums parts;
  std::vector<std::optional<uint32_t>> stored;  // (tensors)

  ReadSums(const Communicator& comm, size_t tensors) : parts(comm, tensors), stored(tensors) {}

  // Tensor t's sum, read by every rank that opened it (the same file
  // everywhere), a fault before or not: with collective metadata reads, a
  // rank that skipped it would leave the others waiting.
  void read_stored(size_t t, hid_t dset, const std::string& where, const hdf5::Faults& faults,
                   FirstFault* failed) {
    try {
      if (uint32_t crc = 0; hdf5::stored_sum(dset, where, faults, &crc)) stored[t] = crc;
    } catch (const std::exception& e) {
      failed->set(e.what());
    }
  }
  // Every tensor the ranks read whole between them, against its sum; tensor
  // t = group * infos.size() + i is named "/" + group_name(group) + "/" + name.
  template <class GroupName>
  void check(const Communicator& comm, const std::vector<ParamInfo>& infos, GroupName group_name,
             const hdf5::Faults& faults, FirstFault* failed) {
    parts.gather(comm);
    for (size_t t = 0; t < stored.size(); ++t) {
      const ParamInfo& info = infos[t % infos.size()];
      const std::optional<uint32_t> crc = parts.whole(t, info.size);
      if (!crc || !stored[t]) continue;
      failed->attempt([&] {
        const std::string where = "/" + std::string(group_name(t / infos.size())) + "/" + info.name;
        hdf5::check_sum(*stored[t], *crc, where, faults);
      });
    }
  }
};

// One of the three groups of tensors, as a rank holds it.
struct TensorGroup {
  const char* path = "";        // "/params/"
  const float* data = nullptr;  // backend (end - begin): the rank's range of this group
  std::vector<Hid> datasets;    // one per params.info() entry, in its order
};

std::vector<hsize_t> dims_of(const ParamInfo& info) {
  return std::vector<hsize_t>(info.shape.begin(), info.shape.end());
}

// Rank 0's strings of the state, sent to every rank: only rank 0 read the
// shards and holds the run directory, and the attributes must be alike.
void share_strings(const Communicator& comm, CheckpointState* state) {
  comm.broadcast(&state->config_ini, 0);
  comm.broadcast(&state->run_id, 0);
  comm.broadcast(&state->tokenizer, 0);
  std::string labels = comm.is_root() ? join_label_names(state->label_names) : "";
  comm.broadcast(&labels, 0);
  state->label_names = labels.empty() ? std::vector<std::string>{} : split_label_names(labels);
}

// The datasets /tokenizer, /label_names: created by all, written by rank 0.
void write_bytes_collectively(const Communicator& comm, hid_t root, const char* name,
                              const std::string& bytes, hid_t dxpl, const hdf5::Faults& faults) {
  const std::string what = std::string("dataset /") + name;
  const hsize_t n = bytes.size();
  Hid space = faults.checked(H5Screate_simple(1, &n, nullptr), H5Sclose, what);
  Hid dcpl =
      hdf5::checksummed_chunks({std::clamp<hsize_t>(n, 1, kCheckpointBytesChunk)}, faults, what);
  Hid dset = faults.checked(
      H5Dcreate2(root, name, H5T_STD_U8LE, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
      H5Dclose, what);
  const hsize_t one = 1;
  Hid memory = faults.checked(H5Screate_simple(1, n > 0 ? &n : &one, nullptr), H5Sclose, what);
  if (!comm.is_root() || n == 0) {
    faults.check(H5Sselect_none(space.get()), what);
    faults.check(H5Sselect_none(memory.get()), what);
  }
  const unsigned char none = 0;
  const void* data = comm.is_root() && n > 0 ? static_cast<const void*>(bytes.data()) : &none;
  faults.check(H5Dwrite(dset.get(), H5T_NATIVE_UINT8, memory.get(), space.get(), dxpl, data), what);
  hdf5::write_crc32c(dset.get(), crc32c(bytes.data(), bytes.size()), faults);
}

// Makes the file `tmp` on rank 0 and sets `bytes` of disk aside for it, and
// checks every rank may write that much (ulimit -f). A failed write inside
// HDF5's collective calls leaves the ranks waiting on each other for ever
// (a rank that failed skips a barrier the others entered): a full disk, a
// quota or a file size limit must be met here, before the first of them.
void set_disk_aside(const Communicator& comm, const std::string& tmp, uint64_t bytes,
                    const hdf5::Faults& faults) {
  const std::string what = "cannot write: no room for up to " + format_bytes(bytes);
  if (const uint64_t limit = file_size_limit(); limit < bytes) {
    faults.fail(what + " (" + std::strerror(EFBIG) + "): the file size limit (ulimit -f) is " +
                format_bytes(limit));
  }
  if (!comm.is_root()) return;
  {
    hdf5::Session session;
    faults.check(create_checkpoint_file(tmp, faults).close(), "the file");
  }
  if (const int err = reserve_file_space(tmp, bytes); err != 0) {
    errno = err;
    faults.fail_errno(what);
  }
}

// Each tensor's CRC-32C, from every rank's part, as its attribute: the same
// value written by every rank (a collective).
void write_sums(const Communicator& comm, const std::vector<TensorGroup>& groups,
                const ParameterSet& params, PartSums& sums, const hdf5::Faults& faults,
                FirstFault* failed) {
  sums.gather(comm);
  const std::vector<ParamInfo>& infos = params.info();
  failed->attempt([&] {
    for (size_t g = 0; g < groups.size(); ++g) {
      for (size_t i = 0; i < infos.size(); ++i) {
        const std::optional<uint32_t> crc = sums.whole(g * infos.size() + i, infos[i].size);
        if (!crc) {
          faults.fail("cannot write dataset " + std::string(groups[g].path) + infos[i].name +
                      ": the ranks' parts leave a hole");
        }
        hdf5::write_crc32c(groups[g].datasets[i].get(), *crc, faults);
      }
    }
  });
}

// After this rank's part of a collective HDF5 write or close failed (a
// device error in the middle of the write: a full disk, a quota and the
// file size limit are met before the first collective call). HDF5 returns
// early on the rank that failed and leaves the others inside the call,
// waiting for MPI calls this rank will never make, so no agreement can
// follow: on several ranks this one removes the temporary, says why in one
// line and ends the job (MPI_Abort, exit 1). One rank goes on as usual.
void abandon_if_apart(const Communicator& comm, const std::string& tmp, const FirstFault& fault) {
  if (comm.size() == 1) return;
  ::unlink(tmp.c_str());
  comm.abort(fault.what(), kExitFailure);
}

// Every rank's verdict on `fault`: the lowest rank that failed prints it,
// and every rank returns kExitFailure when any rank failed.
int agree_once(const Communicator& comm, const FirstFault& fault) {
  Verdict mine;
  if (!fault.ok())
    mine = {kExitFailure, "[rank " + std::to_string(comm.rank()) + "] " + fault.what()};
  return agree_first(comm, mine);
}

}  // namespace

std::pair<size_t, size_t> even_share(size_t n, int rank, int world) {
  const size_t r = static_cast<size_t>(rank), w = static_cast<size_t>(world);
  const size_t base = n / w, extra = n % w;
  const size_t begin = r * base + std::min(r, extra);
  return {begin, begin + base + (r < extra ? 1 : 0)};
}

SavedCheckpoint save_checkpoint_collectively(const Communicator& comm, const std::string& rundir,
                                             const ParameterSet& params,
                                             const CheckpointSlice& slice, CheckpointState state,
                                             int keep_last, const CheckpointWriteFault& fault) {
  const auto start = std::chrono::steady_clock::now();
  SavedCheckpoint saved;
  FirstFault failed;
  share_strings(comm, &state);
  // Rank 0 names the file (and creates the directory); the others learn it.
  if (comm.is_root()) failed.attempt([&] { saved.path = checkpoint_path_for(rundir, state.step); });
  comm.broadcast(&saved.path, 0);
  const hdf5::Faults faults = hdf5::Faults::of<CheckpointError>(saved.path);
  failed.attempt([&] {
    if (params.count() == 0) faults.fail("cannot write: there are no parameters");
    if (slice.begin > slice.end || slice.end > params.count() ||
        (slice.end > slice.begin && (!slice.params || !slice.m || !slice.v))) {
      faults.fail("cannot write: this rank's range [" + std::to_string(slice.begin) + ", " +
                  std::to_string(slice.end) + ") is not a part of the " +
                  std::to_string(params.count()) + " parameters it holds");
    }
    check_checkpoint_writable(faults, params, state);
  });
  // The slices must tile the buffer, or the file would hold holes.
  const int64_t written = comm.allreduce_sum(static_cast<int64_t>(slice.end - slice.begin));
  if (written != static_cast<int64_t>(params.count())) {
    failed.attempt([&] {
      faults.fail("cannot write: the ranks' ranges hold " + std::to_string(written) +
                  " elements, the parameters " + std::to_string(params.count()));
    });
  }
  if (comm.any(!failed.ok())) {
    saved.code = agree_once(comm, failed);
    return saved;
  }

  // Rank 0's name for the temporary, which only it creates and renames.
  std::string tmp = comm.is_root() ? temporary_name(saved.path) : "";
  comm.broadcast(&tmp, 0);
  failed.attempt([&] { set_disk_aside(comm, tmp, checkpoint_file_bound(params, state), faults); });
  if (comm.any(!failed.ok())) {
    if (comm.is_root()) ::unlink(tmp.c_str());
    saved.code = agree_once(comm, failed);
    return saved;
  }
  params.ops().device().synchronize();  // the last update must have landed before it is copied
  {
    hdf5::Session session;
    Hid file, dxpl;
    std::vector<TensorGroup> groups(3);
    groups[0].path = "/params/";
    groups[0].data = slice.params;
    groups[1].path = "/optimizer/m/";
    groups[1].data = slice.m;
    groups[2].path = "/optimizer/v/";
    groups[2].data = slice.v;
    // Metadata, identical on every rank: the file, attributes, groups, datasets.
    failed.attempt([&] {
      Hid fapl = mpio_access(faults);
      file = faults.checked(H5Fopen(tmp.c_str(), H5F_ACC_RDWR, fapl.get()), H5Fclose, "the file");
      dxpl = collective_transfer(faults);
      const hid_t root = file.get();
      write_checkpoint_attributes(root, state, faults);
      if (!state.tokenizer.empty())
        write_bytes_collectively(comm, root, "tokenizer", state.tokenizer, dxpl.get(), faults);
      if (!state.label_names.empty()) {
        write_bytes_collectively(comm, root, "label_names", join_label_names(state.label_names),
                                 dxpl.get(), faults);
      }
      Hid optimizer =
          faults.checked(H5Gcreate2(root, "optimizer", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                         H5Gclose, "group /optimizer");
      const std::pair<hid_t, const char*> places[3] = {
          {root, "params"}, {optimizer.get(), "m"}, {optimizer.get(), "v"}};
      for (size_t g = 0; g < groups.size(); ++g) {
        Hid group = faults.checked(
            H5Gcreate2(places[g].first, places[g].second, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
            H5Gclose, std::string("group ") + groups[g].path);
        for (const ParamInfo& info : params.info()) {
          const std::string what = "dataset " + std::string(groups[g].path) + info.name;
          const std::vector<hsize_t> dims = dims_of(info);
          Hid space =
              faults.checked(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
                             H5Sclose, what);
          Hid dcpl = hdf5::checksummed_chunks(checkpoint_chunk_dims(dims), faults, what);
          // Every element is written: no fill values written first.
          faults.check(H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER), what);
          groups[g].datasets.push_back(
              faults.checked(H5Dcreate2(group.get(), info.name.c_str(), H5T_IEEE_F32LE, space.get(),
                                        H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
                             H5Dclose, what));
        }
      }
    });
    // The same metadata everywhere, or nobody writes data.
    const bool created = !comm.any(!failed.ok());

    // Data: each rank its range of every tensor, one collective write per
    // dataset. A rank that failed selects nothing from then on.
    std::vector<float> host;  // staging, reused: (largest part of a tensor)
    const std::vector<int64_t> used =
        created ? blocks_used(comm, params, slice.begin, slice.end) : std::vector<int64_t>{};
    PartSums sums(comm, groups.size() * params.info().size());
    for (size_t g = 0; created && g < groups.size(); ++g) {
      if (g == 1) {
        if (state.step == fault.step && comm.rank() == fault.rank) {
          failed.set(saved.path + ": cannot write " + groups[g].path +
                     "...: fault injected by MPIFORMER_TEST_FAIL_IN_CHECKPOINT");
        }
        if (checkpoint_kill_requested(state.step)) {
          H5Fflush(file.get(), H5F_SCOPE_LOCAL);    // a collective
          if (comm.is_root()) std::raise(SIGKILL);  // half a file on disk, as a crash leaves it
        }
      }
      const std::vector<ParamInfo>& infos = params.info();
      for (size_t i = 0; i < infos.size(); ++i) {
        const ParamInfo& info = infos[i];
        const std::string what = "dataset " + std::string(groups[g].path) + info.name;
        const size_t lo = std::max(slice.begin, info.offset);
        const size_t hi = std::max(lo, std::min(slice.end, info.offset + info.size));
        Block blocks[kBlocks];
        if (!blocks_of(dims_of(info), lo - info.offset, hi - info.offset, blocks))
          failed.attempt([&] { faults.fail("cannot write " + what + ": not 1-D or 2-D"); });
        host.resize(std::max<size_t>(hi - lo, 1));
        if (hi > lo) {
          failed.attempt([&] {
            params.ops().device().copy_to_host(host.data(), groups[g].data + (lo - slice.begin),
                                               (hi - lo) * sizeof(float));
            sums.record(g * infos.size() + i, lo - info.offset, hi - info.offset, host.data());
          });
        }
        // Every rank takes part in each used block's write, faults or not:
        // each is a collective.
        const hid_t dset = groups[g].datasets[i].get();
        for (int b = 0; b < kBlocks; ++b) {
          if (!used[i * kBlocks + b]) continue;
          const bool was_ok = failed.ok();
          const herr_t status =
              transfer_block(dset, blocks[b], was_ok, dxpl.get(), host.data(), true);
          if (status < 0) failed.attempt([&] { faults.check(status, what); });
          if (was_ok && !failed.ok()) abandon_if_apart(comm, tmp, failed);
        }
      }
    }
    if (created && !comm.any(!failed.ok())) write_sums(comm, groups, params, sums, faults, &failed);
    // Every rank closes, faults or not: the close is a collective.
    for (TensorGroup& group : groups) group.datasets.clear();
    errno = 0;  // a failed flush's reason (Faults::check)
    const bool was_ok = failed.ok();
    const herr_t closed = file.ok() ? file.close() : 0;
    if (closed < 0) failed.attempt([&] { faults.check(closed, "the file"); });
    if (was_ok && !failed.ok()) abandon_if_apart(comm, tmp, failed);
  }

  // Rank 0 alone makes it durable and the head of the run; a fault anywhere
  // leaves no temporary file, and the previous checkpoint stays the head.
  const bool written_everywhere = !comm.any(!failed.ok());
  if (comm.is_root()) {
    if (written_everywhere) {
      failed.attempt([&] {
        try {
          release_reserved_space(tmp);
          fsync_file(tmp);
          std::error_code ec;
          saved.bytes = fs::file_size(tmp, ec);
          commit_file(tmp, saved.path);
        } catch (const CheckpointError&) {
          throw;
        } catch (const std::runtime_error& e) {
          throw CheckpointError(e.what());
        }
        point_latest_at(rundir, saved.path);
        prune_checkpoints(rundir, saved.path, keep_last);
      });
    }
    if (!written_everywhere || !failed.ok()) {
      std::error_code ec;
      fs::remove(tmp, ec);
    }
  }
  saved.code = agree_once(comm, failed);
  saved.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return saved;
}

std::string read_checkpoint_collectively(const Communicator& comm, const std::string& path,
                                         const ParameterSet& params, float* params_dest,
                                         size_t params_begin, size_t params_end, size_t begin,
                                         size_t end, float* m, float* v) {
  const hdf5::Faults faults = hdf5::Faults::of<CheckpointError>(path);
  FirstFault failed;
  failed.attempt([&] {
    for (const auto& [lo, hi] : {std::pair{params_begin, params_end}, std::pair{begin, end}}) {
      if (lo > hi || hi > params.count())
        faults.fail("cannot read the range [" + std::to_string(lo) + ", " + std::to_string(hi) +
                    ") of " + std::to_string(params.count()) + " parameters");
    }
  });
  hdf5::Session session;
  Hid file, dxpl;
  failed.attempt([&] {
    Hid fapl = mpio_access(faults);
    file = Hid(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get()), H5Fclose);
    if (!file.ok()) faults.fail_corrupt("open the file");
    check_checkpoint_format(file.get(), faults);
    dxpl = collective_transfer(faults);
  });
  if (comm.any(!failed.ok())) return failed.what();

  // Which blocks any rank reads.
  const std::vector<int64_t> param_parts = blocks_used(comm, params, params_begin, params_end);
  const std::vector<int64_t> moment_slices = blocks_used(comm, params, begin, end);
  const struct {
    const char* group;                 // "params"
    float* dest;                       // backend (hi - lo)
    size_t lo, hi;                     // the range of the flat buffer read into dest
    const std::vector<int64_t>& used;  // blocks_used of the ranks' ranges
  } parts[3] = {{"params", params_dest, params_begin, params_end, param_parts},
                {"optimizer/m", m, begin, end, moment_slices},
                {"optimizer/v", v, begin, end, moment_slices}};
  std::vector<float> host;  // staging, reused: (largest part of a tensor)
  const std::vector<ParamInfo>& infos = params.info();
  ReadSums sums(comm, 3 * infos.size());
  for (size_t p = 0; p < 3; ++p) {
    const auto& part = parts[p];
    Hid group;
    failed.attempt([&] {
      group = Hid(H5Gopen2(file.get(), part.group, H5P_DEFAULT), H5Gclose);
      if (!group.ok()) faults.fail_corrupt(std::string("open /") + part.group);
    });
    for (size_t i = 0; i < infos.size(); ++i) {
      const ParamInfo& info = infos[i];
      const std::string where = "/" + std::string(part.group) + "/" + info.name;
      Hid dset;
      if (group.ok()) dset = Hid(H5Dopen2(group.get(), info.name.c_str(), H5P_DEFAULT), H5Dclose);
      if (!dset.ok()) failed.attempt([&] { faults.fail_corrupt("open " + where); });
      if (dset.ok()) sums.read_stored(p * infos.size() + i, dset.get(), where, faults, &failed);
      const size_t lo = std::max(part.lo, info.offset);
      const size_t hi = std::max(lo, std::min(part.hi, info.offset + info.size));
      Block blocks[kBlocks];
      if (!blocks_of(dims_of(info), lo - info.offset, hi - info.offset, blocks))
        failed.attempt([&] { faults.fail(where + ": not 1-D or 2-D"); });
      const size_t count = failed.ok() ? hi - lo : 0;
      host.resize(std::max<size_t>(count, 1));
      // Every rank reads each used block while the dataset opened (the same
      // file on every rank): each is a collective.
      for (int b = 0; dset.ok() && b < kBlocks; ++b) {
        if (!part.used[i * kBlocks + b]) continue;
        if (transfer_block(dset.get(), blocks[b], failed.ok(), dxpl.get(), host.data(), false) < 0)
          failed.attempt([&] { faults.fail_corrupt("read " + where); });
      }
      if (!failed.ok() || count == 0) continue;
      const auto bad = std::find_if(host.begin(), host.begin() + static_cast<long>(count),
                                    [](float x) { return !std::isfinite(x); });
      if (bad != host.begin() + static_cast<long>(count)) {
        failed.attempt([&] { faults.fail(non_finite_fault(part.group, info.name, *bad)); });
        continue;
      }
      sums.parts.record(p * infos.size() + i, lo - info.offset, hi - info.offset, host.data());
      failed.attempt([&] {
        params.ops().device().copy_to_device(part.dest + (lo - part.lo), host.data(),
                                             count * sizeof(float));
      });
    }
  }
  sums.check(
      comm, infos, [&](size_t p) { return parts[p].group; }, faults, &failed);
  const herr_t closed = file.close();
  if (closed < 0) failed.attempt([&] { faults.fail_corrupt("close the file"); });
  return failed.what();
}

}  // namespace mpiformer
