#include "src/parallel/collective_hdf5.h"

#include <algorithm>
#include <cerrno>

namespace mpiformer::collective_io {

using hdf5::Hid;

Hid mpio_access(const hdf5::Faults& faults) {
  Hid fapl = faults.checked(H5Pcreate(H5P_FILE_ACCESS), H5Pclose, "the file");
  faults.check(H5Pset_fapl_mpio(fapl.get(), MPI_COMM_WORLD, MPI_INFO_NULL), "the file");
  faults.check(H5Pset_all_coll_metadata_ops(fapl.get(), true), "the file");
  faults.check(H5Pset_coll_metadata_write(fapl.get(), true), "the file");
  faults.check(H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V18, H5F_LIBVER_LATEST), "the file");
  faults.check(H5Pset_file_locking(fapl.get(), 0, 1), "the file");
  return fapl;
}

Hid collective_transfer(const hdf5::Faults& faults) {
  Hid dxpl = faults.checked(H5Pcreate(H5P_DATASET_XFER), H5Pclose, "the transfer");
  faults.check(H5Pset_dxpl_mpio(dxpl.get(), H5FD_MPIO_COLLECTIVE), "the transfer");
  return dxpl;
}

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

std::vector<hsize_t> dims_of(const ParamInfo& info) {
  return std::vector<hsize_t>(info.shape.begin(), info.shape.end());
}

Verdict verdict_of(const Communicator& comm, const FirstFault& fault) {
  if (fault.ok()) return {};
  return {kExitFailure, "[rank " + std::to_string(comm.rank()) + "] " + fault.what()};
}

}  // namespace mpiformer::collective_io
