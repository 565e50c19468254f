#include "src/parallel/collective_checkpoint.h"

#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <optional>
#include <stdexcept>
#include <tuple>
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
#include "src/parallel/collective_hdf5.h"

namespace mpiformer {

namespace {

namespace fs = std::filesystem;
using hdf5::Hid;
using namespace collective_io;

// One of the three groups of tensors, as a rank holds it.
struct TensorGroup {
  const char* path = "";        // "/params/"
  const float* data = nullptr;  // backend (end - begin): the rank's range of this group
  std::vector<Hid> datasets;    // one per params.info() entry, in its order
};

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

}  // namespace

std::pair<size_t, size_t> even_share(size_t n, int rank, int world) {
  const size_t r = static_cast<size_t>(rank), w = static_cast<size_t>(world);
  const size_t base = n / w, extra = n % w;
  const size_t begin = r * base + std::min(r, extra);
  return {begin, begin + base + (r < extra ? 1 : 0)};
}

namespace {

// One collective checkpoint write, in the order every rank takes the same
// collective calls: check, set the disk aside, create the metadata, write
// each rank's part of every tensor, the sums, close; rank 0 then commits.
// A fault is kept in `first_fault_` and agreed at the end of each phase.
class CollectiveWrite {
 public:
  // alone: one process writes (write_checkpoint), and a fault is thrown
  // (CheckpointError) instead of agreed and printed.
  CollectiveWrite(const Communicator& comm, const ParameterSet& params,
                  const CheckpointSlice& slice, CheckpointState& state, SavedCheckpoint* saved,
                  bool alone)
      : comm_(comm), params_(params), slice_(slice), state_(state), saved_(*saved), alone_(alone) {}

  // Names the file on rank 0 (`name_file`) and checks every rank's part:
  // false (the fault agreed in saved.code) when the write must not start.
  bool check(const std::function<std::string()>& name_file);
  // Creates the temporary on rank 0 with room for the whole file.
  bool create_with_room();
  // Every collective HDF5 call, faults or not; `injected`: the tests' faults.
  void write(const CheckpointWriteFault& injected);
  // Rank 0 makes the file durable and, with a run directory, the head of
  // the run; then the verdict.
  void commit(const std::string& rundir, int keep_last);

 private:
  void open_and_create();
  void create_group_datasets(hid_t parent, const char* name, TensorGroup* group);
  void write_tensor(size_t g, size_t i, const std::vector<int64_t>& used, PartSums* sums);
  void close_file();
  void meet_test_fault(const CheckpointWriteFault& injected);
  bool agreed_so_far() { return !comm_.any(!first_fault_.ok()); }
  int verdict() {
    if (!alone_) return agree(comm_, verdict_of(comm_, first_fault_), Speaker::kFirst);
    if (!first_fault_.ok()) throw CheckpointError(first_fault_.what());
    return 0;
  }

  const Communicator& comm_;
  const ParameterSet& params_;
  const CheckpointSlice& slice_;
  CheckpointState& state_;
  SavedCheckpoint& saved_;
  const bool alone_;
  FirstFault first_fault_;
  std::optional<hdf5::Faults> faults_;  // named by the file, once it has its name
  std::string tmp_;                     // rank 0's temporary name, on every rank
  Hid file_, dxpl_;
  std::vector<TensorGroup> groups_;
  std::vector<float> host_;  // staging, reused: (largest part of a tensor)
};

bool CollectiveWrite::check(const std::function<std::string()>& name_file) {
  share_strings(comm_, &state_);
  // Rank 0 names the file (and creates the directory); the others learn it.
  if (comm_.is_root()) first_fault_.attempt([&] { saved_.path = name_file(); });
  comm_.broadcast(&saved_.path, 0);
  faults_.emplace(checkpoint_faults(saved_.path));
  const hdf5::Faults& faults = *faults_;
  first_fault_.attempt([&] {
    if (params_.count() == 0) faults.fail("cannot write: there are no parameters");
    const bool holds_part = slice_.end > slice_.begin;
    if (holds_part && !slice_.params) faults.fail("cannot write: the parameters are not allocated");
    if (holds_part && (!slice_.m || !slice_.v))
      faults.fail("cannot write: the optimizer moments are missing");
    if (slice_.begin > slice_.end || slice_.end > params_.count()) {
      faults.fail("cannot write: this rank's range [" + std::to_string(slice_.begin) + ", " +
                  std::to_string(slice_.end) + ") is not a part of the " +
                  std::to_string(params_.count()) + " parameters it holds");
    }
    check_checkpoint_writable(faults, params_, state_);
  });
  // The slices must tile the buffer, or the file would hold holes.
  const int64_t written = comm_.allreduce_sum(static_cast<int64_t>(slice_.end - slice_.begin));
  if (written != static_cast<int64_t>(params_.count())) {
    first_fault_.attempt([&] {
      faults.fail("cannot write: the ranks' ranges hold " + std::to_string(written) +
                  " elements, the parameters " + std::to_string(params_.count()));
    });
  }
  if (agreed_so_far()) return true;
  saved_.code = verdict();
  return false;
}

bool CollectiveWrite::create_with_room() {
  // Rank 0's name for the temporary, which only it creates and renames.
  tmp_ = comm_.is_root() ? temporary_name(saved_.path) : "";
  comm_.broadcast(&tmp_, 0);
  first_fault_.attempt(
      [&] { set_disk_aside(comm_, tmp_, checkpoint_file_bound(params_, state_), *faults_); });
  if (agreed_so_far()) return true;
  if (comm_.is_root()) ::unlink(tmp_.c_str());
  saved_.code = verdict();
  return false;
}

// Metadata, identical on every rank: the file, attributes, groups, datasets.
void CollectiveWrite::open_and_create() {
  const hdf5::Faults& faults = *faults_;
  Hid fapl = mpio_access(faults);
  file_ = faults.checked(H5Fopen(tmp_.c_str(), H5F_ACC_RDWR, fapl.get()), H5Fclose, "the file");
  dxpl_ = collective_transfer(faults);
  const hid_t root = file_.get();
  write_checkpoint_attributes(root, state_, faults);
  if (!state_.tokenizer.empty())
    write_bytes_collectively(comm_, root, "tokenizer", state_.tokenizer, dxpl_.get(), faults);
  if (!state_.label_names.empty()) {
    write_bytes_collectively(comm_, root, "label_names", join_label_names(state_.label_names),
                             dxpl_.get(), faults);
  }
  Hid optimizer =
      faults.checked(H5Gcreate2(root, "optimizer", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose,
                     "group /optimizer");
  create_group_datasets(root, "params", &groups_[0]);
  create_group_datasets(optimizer.get(), "m", &groups_[1]);
  create_group_datasets(optimizer.get(), "v", &groups_[2]);
}

void CollectiveWrite::create_group_datasets(hid_t parent, const char* name, TensorGroup* group) {
  const hdf5::Faults& faults = *faults_;
  Hid handle = faults.checked(H5Gcreate2(parent, name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                              H5Gclose, std::string("group ") + group->path);
  for (const ParamInfo& info : params_.info()) {
    const std::string what = "dataset " + std::string(group->path) + info.name;
    const std::vector<hsize_t> dims = dims_of(info);
    Hid space = faults.checked(
        H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose, what);
    Hid dcpl = hdf5::checksummed_chunks(checkpoint_chunk_dims(dims), faults, what);
    // Every element is written: no fill values written first.
    faults.check(H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER), what);
    group->datasets.push_back(
        faults.checked(H5Dcreate2(handle.get(), info.name.c_str(), H5T_IEEE_F32LE, space.get(),
                                  H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
                       H5Dclose, what));
  }
}

// The tests' faults, met between /params and the moments: a rank that
// fails (and goes on with nothing selected), or rank 0 killed with half a
// file on disk, as a crash leaves it.
void CollectiveWrite::meet_test_fault(const CheckpointWriteFault& injected) {
  if (state_.step == injected.fail_step && comm_.rank() == injected.fail_rank) {
    first_fault_.set(saved_.path + ": cannot write " + groups_[1].path +
                     "...: fault injected by MPIFORMER_TEST_FAIL_IN_CHECKPOINT");
  }
  if (state_.step == injected.kill_step) {
    H5Fflush(file_.get(), H5F_SCOPE_LOCAL);    // a collective
    if (comm_.is_root()) std::raise(SIGKILL);  // the test's kill: half a file on disk
  }
}

// This rank's range of tensor i of group g, in one collective write per
// used block; a rank that failed takes part with nothing selected.
void CollectiveWrite::write_tensor(size_t g, size_t i, const std::vector<int64_t>& used,
                                   PartSums* sums) {
  const std::vector<ParamInfo>& infos = params_.info();
  const ParamInfo& info = infos[i];
  const hdf5::Faults& faults = *faults_;
  const std::string what = "dataset " + std::string(groups_[g].path) + info.name;
  const size_t lo = std::max(slice_.begin, info.offset);
  const size_t hi = std::max(lo, std::min(slice_.end, info.offset + info.size));
  Block blocks[kBlocks];
  if (!blocks_of(dims_of(info), lo - info.offset, hi - info.offset, blocks))
    first_fault_.attempt([&] { faults.fail("cannot write " + what + ": not 1-D or 2-D"); });
  host_.resize(std::max<size_t>(hi - lo, 1));
  if (hi > lo) {
    first_fault_.attempt([&] {
      params_.ops().device().copy_to_host(host_.data(), groups_[g].data + (lo - slice_.begin),
                                          (hi - lo) * sizeof(float));
      sums->record(g * infos.size() + i, lo - info.offset, hi - info.offset, host_.data());
    });
  }
  const hid_t dset = groups_[g].datasets[i].get();
  for (int b = 0; b < kBlocks; ++b) {
    if (!used[i * kBlocks + b]) continue;
    const bool was_ok = first_fault_.ok();
    const herr_t status = transfer_block(dset, blocks[b], was_ok, dxpl_.get(), host_.data(), true);
    if (status < 0) first_fault_.attempt([&] { faults.check(status, what); });
    if (was_ok && !first_fault_.ok()) abandon_if_apart(comm_, tmp_, first_fault_);
  }
}

// Every rank closes, faults or not: the close is a collective.
void CollectiveWrite::close_file() {
  for (TensorGroup& group : groups_) group.datasets.clear();
  errno = 0;  // a failed flush's reason (Faults::check)
  const bool was_ok = first_fault_.ok();
  const herr_t closed = file_.ok() ? file_.close() : 0;
  if (closed < 0) first_fault_.attempt([&] { faults_->check(closed, "the file"); });
  if (was_ok && !first_fault_.ok()) abandon_if_apart(comm_, tmp_, first_fault_);
}

void CollectiveWrite::write(const CheckpointWriteFault& injected) {
  params_.ops().device().synchronize();  // the last update must have landed before it is copied
  hdf5::Session session;
  groups_.resize(3);
  const std::pair<const char*, const float*> places[3] = {
      {"/params/", slice_.params}, {"/optimizer/m/", slice_.m}, {"/optimizer/v/", slice_.v}};
  for (size_t g = 0; g < groups_.size(); ++g)
    std::tie(groups_[g].path, groups_[g].data) = places[g];
  first_fault_.attempt([&] { open_and_create(); });
  // The same metadata everywhere, or nobody writes data.
  if (agreed_so_far()) {
    // Data: each rank its range of every tensor. A rank that failed selects
    // nothing from then on.
    const std::vector<int64_t> used = blocks_used(comm_, params_, slice_.begin, slice_.end);
    PartSums sums(comm_, groups_.size() * params_.info().size());
    for (size_t g = 0; g < groups_.size(); ++g) {
      if (g == 1) meet_test_fault(injected);
      for (size_t i = 0; i < params_.info().size(); ++i) write_tensor(g, i, used, &sums);
    }
    if (agreed_so_far()) write_sums(comm_, groups_, params_, sums, *faults_, &first_fault_);
  }
  close_file();
}

void CollectiveWrite::commit(const std::string& rundir, int keep_last) {
  // A fault anywhere leaves no temporary file, and the previous checkpoint
  // stays the head.
  const bool written_everywhere = agreed_so_far();
  if (comm_.is_root()) {
    if (written_everywhere) {
      first_fault_.attempt([&] {
        try {
          release_reserved_space(tmp_);
          fsync_file(tmp_);
          std::error_code ec;
          saved_.bytes = fs::file_size(tmp_, ec);
          commit_file(tmp_, saved_.path);
        } catch (const CheckpointError&) {
          throw;
        } catch (const std::runtime_error& e) {
          throw CheckpointError(e.what());
        }
        if (rundir.empty()) return;
        point_latest_at(rundir, saved_.path);
        prune_checkpoints(rundir, saved_.path, keep_last);
      });
    }
    if (!written_everywhere || !first_fault_.ok()) {
      std::error_code ec;
      fs::remove(tmp_, ec);
    }
  }
  saved_.code = verdict();
}

}  // namespace

SavedCheckpoint save_checkpoint_collectively(const Communicator& comm, const std::string& rundir,
                                             const ParameterSet& params,
                                             const CheckpointSlice& slice, CheckpointState state,
                                             int keep_last, const CheckpointWriteFault& injected) {
  const auto start = std::chrono::steady_clock::now();
  SavedCheckpoint saved;
  CollectiveWrite write(comm, params, slice, state, &saved, /*alone=*/false);
  if (!write.check([&] { return checkpoint_path_for(rundir, state.step); }) ||
      !write.create_with_room()) {
    return saved;
  }
  write.write(injected);
  write.commit(rundir, keep_last);
  saved.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return saved;
}

namespace {

// This process as a world of its own, MPI started on first use (after
// HDF5, as main starts them): tools and tests write checkpoints alone.
const Communicator& this_process() {
  hdf5::initialize_library();
  static Communicator process(nullptr, nullptr);
  if (process.size() != 1) {
    throw std::logic_error("write_checkpoint writes with one process; this world has " +
                           std::to_string(process.size()) + " ranks");
  }
  return process;
}

// The whole model and its moments, written by this process alone as
// `name_file()` names it, with `rundir`'s latest and pruning when given.
std::string write_alone(const std::function<std::string()>& name_file, const std::string& rundir,
                        int keep_last, const ParameterSet& params, const float* adam_m,
                        const float* adam_v, CheckpointState state) {
  const CheckpointSlice whole{0, params.count(), params.params(), adam_m, adam_v};
  SavedCheckpoint saved;
  CollectiveWrite write(this_process(), params, whole, state, &saved, /*alone=*/true);
  write.check(name_file);
  write.create_with_room();
  write.write(CheckpointWriteFault{});
  write.commit(rundir, keep_last);
  return saved.path;
}

}  // namespace

void write_checkpoint(const std::string& path, const ParameterSet& params, const float* adam_m,
                      const float* adam_v, const CheckpointState& state) {
  write_alone([&] { return path; }, "", 0, params, adam_m, adam_v, state);
}

std::string save_checkpoint(const std::string& rundir, const ParameterSet& params,
                            const float* adam_m, const float* adam_v, const CheckpointState& state,
                            int keep_last) {
  return write_alone([&] { return checkpoint_path_for(rundir, state.step); }, rundir, keep_last,
                     params, adam_m, adam_v, state);
}

}  // namespace mpiformer
