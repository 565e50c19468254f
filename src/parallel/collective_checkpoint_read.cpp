#include <hdf5.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <optional>
#include <utility>
#include <vector>

#include "src/core/error.h"
#include "src/io/checkpoint_layout.h"
#include "src/io/dataset_checksum.h"
#include "src/io/hdf5_file.h"
#include "src/parallel/agreement.h"
#include "src/parallel/collective_checkpoint.h"
#include "src/parallel/collective_hdf5.h"

namespace mpiformer {

namespace {

using hdf5::Hid;
using namespace collective_io;

// "/GROUP/NAME", appended piece by piece (GCC 12 warns wrongly of an
// overlap in "/" + std::string(group) + ...).
std::string dataset_path(const char* group, const std::string& name) {
  std::string path = "/";
  path += group;
  path += '/';
  path += name;
  return path;
}

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
        const std::string where = dataset_path(group_name(t / infos.size()), info.name);
        hdf5::check_sum(*stored[t], *crc, where, faults);
      });
    }
  }
};

// What a collective read fills from one group: [lo, hi) of the flat buffer
// into dest.
struct ReadTarget {
  const char* group;                 // "params"
  float* dest;                       // backend (hi - lo)
  size_t lo, hi;                     // the range of the flat buffer read into dest
  const std::vector<int64_t>* used;  // blocks_used of the ranks' ranges
};

// Reads this rank's range of one tensor of a group, in one collective read
// per used block; a rank that failed takes part with nothing selected.
struct TensorReader {
  const ParameterSet& params;
  hid_t dxpl;
  const hdf5::Faults& faults;
  ReadSums* sums;
  FirstFault* failed;
  std::vector<float> host;  // staging, reused: (largest part of a tensor)

  // Tensor t = (group index) * infos.size() + i of the target's group.
  void read(const Hid& group, const ReadTarget& part, size_t t) {
    const std::vector<ParamInfo>& infos = params.info();
    const ParamInfo& info = infos[t % infos.size()];
    const std::string where = dataset_path(part.group, info.name);
    Hid dset;
    if (group.ok()) dset = Hid(H5Dopen2(group.get(), info.name.c_str(), H5P_DEFAULT), H5Dclose);
    if (!dset.ok()) failed->attempt([&] { faults.fail_corrupt("open " + where); });
    if (dset.ok()) sums->read_stored(t, dset.get(), where, faults, failed);
    const size_t lo = std::max(part.lo, info.offset);
    const size_t hi = std::max(lo, std::min(part.hi, info.offset + info.size));
    Block blocks[kBlocks];
    if (!blocks_of(dims_of(info), lo - info.offset, hi - info.offset, blocks))
      failed->attempt([&] { faults.fail(where + ": not 1-D or 2-D"); });
    const size_t count = failed->ok() ? hi - lo : 0;
    host.resize(std::max<size_t>(count, 1));
    // Every rank reads each used block while the dataset opened (the same
    // file on every rank): each is a collective.
    const size_t i = t % infos.size();
    for (int b = 0; dset.ok() && b < kBlocks; ++b) {
      if (!(*part.used)[i * kBlocks + b]) continue;
      if (transfer_block(dset.get(), blocks[b], failed->ok(), dxpl, host.data(), false) < 0)
        failed->attempt([&] { faults.fail_corrupt("read " + where); });
    }
    if (!failed->ok() || count == 0) return;
    const auto bad = std::find_if(host.begin(), host.begin() + static_cast<long>(count),
                                  [](float x) { return !std::isfinite(x); });
    if (bad != host.begin() + static_cast<long>(count)) {
      failed->attempt([&] { faults.fail(non_finite_fault(part.group, info.name, *bad)); });
      return;
    }
    sums->parts.record(t, lo - info.offset, hi - info.offset, host.data());
    failed->attempt([&] {
      params.ops().device().copy_to_device(part.dest + (lo - part.lo), host.data(),
                                           count * sizeof(float));
    });
  }
};

}  // namespace

std::string read_checkpoint_collectively(const Communicator& comm, const std::string& path,
                                         const ParameterSet& params, float* params_dest,
                                         size_t params_begin, size_t params_end, size_t begin,
                                         size_t end, float* m, float* v) {
  const hdf5::Faults faults = checkpoint_faults(path);
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
  const ReadTarget parts[3] = {{"params", params_dest, params_begin, params_end, &param_parts},
                               {"optimizer/m", m, begin, end, &moment_slices},
                               {"optimizer/v", v, begin, end, &moment_slices}};
  const std::vector<ParamInfo>& infos = params.info();
  ReadSums sums(comm, 3 * infos.size());
  TensorReader reader{params, dxpl.get(), faults, &sums, &failed, {}};
  for (size_t p = 0; p < 3; ++p) {
    Hid group;
    failed.attempt([&] {
      group = Hid(H5Gopen2(file.get(), parts[p].group, H5P_DEFAULT), H5Gclose);
      if (!group.ok()) faults.fail_corrupt(std::string("open /") + parts[p].group);
    });
    for (size_t i = 0; i < infos.size(); ++i) reader.read(group, parts[p], p * infos.size() + i);
  }
  sums.check(
      comm, infos, [&](size_t p) { return parts[p].group; }, faults, &failed);
  const herr_t closed = file.close();
  if (closed < 0) failed.attempt([&] { faults.fail_corrupt("close the file"); });
  return failed.what();
}

}  // namespace mpiformer
