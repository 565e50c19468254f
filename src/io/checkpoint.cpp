// HDF5 checkpoints: what every writer checks and writes first (the
// attributes, the chunking, the size bound; the tensors are written by
// src/parallel/collective_checkpoint.h) and the readers. The run directory's
// checkpoints/ (names, `latest`, pruning) are in checkpoint_files.cpp. Every
// fault becomes one CheckpointError line "PATH: reason"; HDF5's own error
// stack is never printed.
#include "src/io/checkpoint.h"

#include <hdf5.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <utility>

#include "src/core/error.h"
#include "src/core/escape.h"
#include "src/io/atomic_file.h"
#include "src/io/checkpoint_layout.h"
#include "src/io/crc32c.h"
#include "src/io/dataset_checksum.h"
#include "src/io/declared_size.h"
#include "src/io/hdf5_file.h"
#include "src/io/label_names.h"

namespace mpiformer {

namespace {

namespace fs = std::filesystem;

// How the random streams are positioned, for a reader of the file.
constexpr const char* kRngStreams =
    "counter-based streams keyed by rng_seed: init (seed); dropout (seed, step, micro-batch of "
    "the step); data order (seed, epoch); masking and synthetic data (seed, batch index)";

// Bounds of the resume attributes read back (see read_checkpoint_state).
constexpr uint64_t kMaxNextBatch = uint64_t{1} << 48;
// 4 MiB chunks: large enough for streaming, small enough that a checksum
// fault names a small region and no chunk nears HDF5's 4 GiB limit.
constexpr hsize_t kChunkElements = hsize_t{1} << 20;

using hdf5::Faults;
using hdf5::Hid;

std::string shape_string(const std::vector<int>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + ")";
}

// ---------------------------------------------------------------- writing

// What is wrong with a state's resume attributes ("" when nothing): the
// writer refuses what the reader would.
std::string state_fault(const CheckpointState& state) {
  const auto refuse = [](const char* name, const std::string& value, const std::string& allowed) {
    return "attribute '" + std::string(name) + "' = " + value + "; expected " + allowed;
  };
  if (state.optimizer_steps < 0 || state.optimizer_steps > state.step) {
    return refuse("optimizer_steps", std::to_string(state.optimizer_steps),
                  "0 to the step (" + std::to_string(state.step) + ")");
  }
  if (state.loss_scale_good_steps < 0) {
    return refuse("loss_scale_good_steps", std::to_string(state.loss_scale_good_steps), ">= 0");
  }
  if (state.next_batch > kMaxNextBatch) {
    return refuse("data_next_batch", std::to_string(state.next_batch),
                  "at most 2^48 (no run reads that many micro-batches)");
  }
  if (state.epoch > state.next_batch) {
    return refuse("data_epoch", std::to_string(state.epoch),
                  "at most data_next_batch (" + std::to_string(state.next_batch) + ")");
  }
  if (state.batches_per_step < 1) {
    return refuse("data_batches_per_step", std::to_string(state.batches_per_step), ">= 1");
  }
  if (state.sharding != "data" && state.sharding != "file") {
    return refuse("data_sharding", "'" + escaped(state.sharding) + "'", "'data' or 'file'");
  }
  if (!(state.loss_scale >= kMinLossScale && state.loss_scale <= kMaxLossScale)) {
    char value[32];
    std::snprintf(value, sizeof value, "%g", state.loss_scale);
    return refuse("loss_scale", value, "a number from 1 to 2^24");
  }
  return "";
}

}  // namespace

void check_checkpoint_writable(const Faults& faults, const ParameterSet& params,
                               const CheckpointState& state) {
  if (state.step < 0) faults.fail("cannot write: step " + std::to_string(state.step) + " < 0");
  if (state.world_size < 1) {
    faults.fail("cannot write: world size " + std::to_string(state.world_size) + " < 1");
  }
  const std::string fault = state_fault(state);
  if (!fault.empty()) faults.fail("cannot write: " + fault);
  for (const ParamInfo& info : params.info()) {
    // "." is the group itself and "/" would nest groups; dots elsewhere are fine.
    if (info.name.empty() || info.name == "." || info.name.find('/') != std::string::npos) {
      faults.fail("cannot write: tensor name '" + info.name + "' is not a valid dataset name");
    }
    size_t size = 1;
    for (int d : info.shape) size *= d > 0 ? static_cast<size_t>(d) : 0;
    if (info.shape.empty() || size != info.size || info.offset + info.size > params.count()) {
      faults.fail("cannot write: tensor '" + info.name + "' of shape " + shape_string(info.shape) +
                  " does not match its place in the parameter buffer");
    }
  }
}

void write_checkpoint_attributes(hid_t root, const CheckpointState& state, const Faults& faults) {
  hdf5::write_string_attr(root, "format", kCheckpointFormat, faults);
  const int version = kCheckpointVersion;
  hdf5::write_int_attr(root, "version", H5T_STD_I32LE, H5T_NATIVE_INT, &version, faults);
  hdf5::promise_checksums(root, faults);
  hdf5::write_int_attr(root, "step", H5T_STD_I64LE, H5T_NATIVE_INT64, &state.step, faults);
  hdf5::write_int_attr(root, "world_size", H5T_STD_I32LE, H5T_NATIVE_INT, &state.world_size,
                       faults);
  hdf5::write_string_attr(root, "config", state.config_ini, faults);
  const std::pair<const char*, int64_t> counters[] = {
      {"optimizer_steps", state.optimizer_steps},
      {"data_batches_per_step", state.batches_per_step},
      {"loss_scale_good_steps", state.loss_scale_good_steps}};
  for (const auto& [name, value] : counters) {
    hdf5::write_int_attr(root, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &value, faults);
  }
  const std::pair<const char*, uint64_t> positions[] = {
      {"data_next_batch", state.next_batch}, {"data_epoch", state.epoch}, {"rng_seed", state.seed}};
  for (const auto& [name, value] : positions) {
    hdf5::write_int_attr(root, name, H5T_STD_U64LE, H5T_NATIVE_UINT64, &value, faults);
  }
  hdf5::write_string_attr(root, "data_sharding", state.sharding, faults);
  hdf5::write_string_attr(root, "rng_streams", kRngStreams, faults);
  hdf5::write_double_attr(root, "loss_scale", state.loss_scale, faults);
  hdf5::write_int_attr(root, "vocab_size", H5T_STD_I32LE, H5T_NATIVE_INT, &state.vocab_size,
                       faults);
  hdf5::write_special_token_attrs(root, state.special, faults);
  if (!state.run_id.empty()) hdf5::write_string_attr(root, "run_id", state.run_id, faults);
  if (!state.progress_window.empty())
    hdf5::write_string_attr(root, "progress_window", state.progress_window, faults);
  if (!state.averaged_from.empty()) {
    hdf5::write_string_attr(root, "averaged_from", state.averaged_from, faults);
  }
}

void write_checkpoint_header(hid_t root, const CheckpointState& state, const Faults& faults) {
  write_checkpoint_attributes(root, state, faults);
  if (!state.tokenizer.empty())
    hdf5::write_bytes_dataset(root, "tokenizer", state.tokenizer, faults);
  if (!state.label_names.empty())
    hdf5::write_bytes_dataset(root, "label_names", join_label_names(state.label_names), faults);
}

std::vector<hsize_t> checkpoint_chunk_dims(const std::vector<hsize_t>& dims) {
  std::vector<hsize_t> chunk = dims;
  for (size_t i = 0; i < chunk.size(); ++i) {
    hsize_t rest = 1;
    for (size_t j = 0; j < chunk.size(); ++j) rest *= j == i ? 1 : chunk[j];
    chunk[i] = std::clamp<hsize_t>(kChunkElements / rest, 1, chunk[i]);
  }
  return chunk;
}

// One float32 tensor, chunked and Fletcher32-checksummed, with its CRC-32C,
// so a damaged checkpoint is refused at resume instead of training from
// garbage.
void write_checkpoint_tensor(hid_t group, const std::string& name, const std::vector<int>& shape,
                             const float* data, const Faults& faults, const std::string& what) {
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  Hid space = faults.checked(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
                             H5Sclose, what);
  Hid dcpl = hdf5::checksummed_chunks(checkpoint_chunk_dims(dims), faults, what);
  Hid dset = faults.checked(H5Dcreate2(group, name.c_str(), H5T_IEEE_F32LE, space.get(),
                                       H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
                            H5Dclose, what);
  faults.check(H5Dwrite(dset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), what);
  const size_t count = std::accumulate(dims.begin(), dims.end(), size_t{1},
                                       [](size_t a, hsize_t d) { return a * d; });
  hdf5::write_crc32c(dset.get(), crc32c(data, count * sizeof(float)), faults);
}

Hid create_checkpoint_group(hid_t loc, const char* name, const Faults& faults) {
  return faults.checked(H5Gcreate2(loc, name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose,
                        std::string("group /") + name);
}

Hid create_checkpoint_file(const std::string& tmp, const Faults& faults) {
  // File format 1.8 or later: the config attribute may outgrow the 64 KiB
  // an attribute gets in the oldest format. No file locking: only this
  // process ever opens the temporary name, and parallel file systems often
  // lack flock().
  Hid fapl = faults.checked(H5Pcreate(H5P_FILE_ACCESS), H5Pclose, "the file");
  faults.check(H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V18, H5F_LIBVER_LATEST), "the file");
  faults.check(H5Pset_file_locking(fapl.get(), 0, 1), "the file");
  Hid file = hdf5::create_anew(tmp, fapl.get(), faults);
  if (!file.ok()) faults.check(-1, "the file");
  return file;
}

uint64_t checkpoint_file_bound(const ParameterSet& params, const CheckpointState& state) {
  // Measured files hold under 3 KiB per tensor beyond its data (its object
  // header, chunk index and checksums); each figure here is twice or more.
  constexpr uint64_t kPerFile = 64 << 10, kPerTensor = 6 << 10, kPerChunk = 256;
  uint64_t bytes = kPerFile + 2 * (state.config_ini.size() + state.run_id.size() +
                                   state.progress_window.size() + state.averaged_from.size());
  const uint64_t label_bytes = join_label_names(state.label_names).size();
  for (const uint64_t n : {static_cast<uint64_t>(state.tokenizer.size()), label_bytes}) {
    const uint64_t chunks = (n + kCheckpointBytesChunk - 1) / kCheckpointBytesChunk;
    bytes += (chunks > 1 ? chunks * kCheckpointBytesChunk : n) + chunks * kPerChunk;
  }
  for (const ParamInfo& info : params.info()) {
    const std::vector<hsize_t> dims(info.shape.begin(), info.shape.end());
    const std::vector<hsize_t> chunk = checkpoint_chunk_dims(dims);
    // HDF5 stores a chunk at the edge of a tensor as a whole one.
    uint64_t chunks = 1, chunk_elements = 1;
    for (size_t d = 0; d < dims.size(); ++d) {
      chunks *= (dims[d] + chunk[d] - 1) / chunk[d];
      chunk_elements *= chunk[d];
    }
    const uint64_t stored = chunks * (chunk_elements * sizeof(float) + kPerChunk);
    bytes += 3 * (stored + kPerTensor);  // params, m, v
  }
  return bytes;
}

namespace {

// ---------------------------------------------------------------- reading

// Opens `path` and checks the format and version attributes.
Hid open_checkpoint(const Faults& faults) {
  Hid file = hdf5::open_for_reading(faults, "checkpoint file");
  check_checkpoint_format(file.get(), faults);
  return file;
}

}  // namespace

void check_checkpoint_format(hid_t root, const Faults& faults) {
  const std::string format = hdf5::read_format(root, faults);
  if (format.empty()) faults.fail("not an mpiformer checkpoint (no 'format' attribute)");
  if (format != kCheckpointFormat)
    faults.fail("not an mpiformer checkpoint (format is '" + escaped(format) + "')");
  const int version = hdf5::read_int_attr<int>(root, "version", faults);
  if (version != kCheckpointVersion) {
    faults.fail("unsupported checkpoint version " + std::to_string(version) +
                " (this build reads version " + std::to_string(kCheckpointVersion) + ")");
  }
}

namespace {

// "optimizer/m" -> "/optimizer/m"; refuses empty components.
std::string group_path(const std::string& group, const Faults& faults) {
  std::string g = group;
  while (!g.empty() && g.front() == '/') g.erase(g.begin());
  while (!g.empty() && g.back() == '/') g.pop_back();
  if (g.empty() || g.find("//") != std::string::npos) faults.fail("bad group name '" + group + "'");
  return "/" + g;
}

}  // namespace

CheckpointTensor read_checkpoint_tensor(hid_t group, const std::string& name,
                                        const std::string& where, const Faults& faults,
                                        bool with_data) {
  Hid object(H5Oopen(group, name.c_str(), H5P_DEFAULT), H5Oclose);
  if (!object.ok()) faults.fail_corrupt("open " + where);
  if (H5Iget_type(object.get()) != H5I_DATASET) faults.fail(where + " is not a dataset");
  Hid type(H5Dget_type(object.get()), H5Tclose);
  if (!type.ok() || H5Tget_class(type.get()) != H5T_FLOAT || H5Tget_size(type.get()) != 4) {
    faults.fail(where + " holds " + (type.ok() ? hdf5::type_name(type.get()) : "unreadable") +
                " values" +
                (type.ok() ? " of " + std::to_string(H5Tget_size(type.get())) + " bytes" : "") +
                ", expected float32");
  }
  Hid space(H5Dget_space(object.get()), H5Sclose);
  const int ndims = space.ok() ? H5Sget_simple_extent_ndims(space.get()) : -1;
  if (ndims < 0) faults.fail_corrupt("read the shape of " + where);
  std::vector<hsize_t> dims(static_cast<size_t>(ndims));
  if (ndims > 0 && H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr) < 0) {
    faults.fail_corrupt("read the shape of " + where);
  }
  CheckpointTensor t;
  t.name = name;
  size_t count = 1;
  for (hsize_t d : dims) {
    if (d > static_cast<hsize_t>(INT_MAX) ||
        (d > 0 && count > std::numeric_limits<size_t>::max() / sizeof(float) / d)) {
      faults.fail(where + " has an implausible shape");
    }
    t.shape.push_back(static_cast<int>(d));
    count *= static_cast<size_t>(d);
  }
  if (!with_data) return t;
  checked_extent(object.get(), where, faults);
  t.data.resize(count);  // (product of shape)
  if (count > 0 &&
      H5Dread(object.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, t.data.data()) < 0) {
    faults.fail_corrupt("read " + where);
  }
  hdf5::verify_read(object.get(), t.data.data(), H5T_NATIVE_FLOAT, count, where, faults);
  return t;
}

std::vector<CheckpointTensor> read_checkpoint_tensors(const std::string& path,
                                                      const std::string& group, bool with_data) {
  const Faults faults = checkpoint_faults(path);
  hdf5::Session session;
  Hid file = open_checkpoint(faults);
  const std::string where = group_path(group, faults);
  if (!hdf5::link_exists(file.get(), where, faults)) faults.fail("missing group " + where);
  Hid g(H5Gopen2(file.get(), where.c_str(), H5P_DEFAULT), H5Gclose);
  if (!g.ok()) faults.fail(where + " is not a group");
  H5G_info_t info;
  if (H5Gget_info(g.get(), &info) < 0) faults.fail_corrupt("list " + where);

  std::vector<CheckpointTensor> tensors;
  tensors.reserve(info.nlinks);
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    // By name, ascending: the order is the same whatever wrote the file.
    const ssize_t len =
        H5Lget_name_by_idx(g.get(), ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
    if (len < 0) faults.fail_corrupt("list " + where);
    std::string name(static_cast<size_t>(len) + 1, '\0');
    if (H5Lget_name_by_idx(g.get(), ".", H5_INDEX_NAME, H5_ITER_INC, i, name.data(), name.size(),
                           H5P_DEFAULT) < 0) {
      faults.fail_corrupt("list " + where);
    }
    name.resize(static_cast<size_t>(len));
    tensors.push_back(read_checkpoint_tensor(g.get(), name, where + "/" + name, faults, with_data));
  }
  return tensors;
}

CheckpointState read_checkpoint_state(const std::string& path) {
  const Faults faults = checkpoint_faults(path);
  hdf5::Session session;
  Hid file = open_checkpoint(faults);
  CheckpointState state;
  state.step = hdf5::read_int_attr<int64_t>(file.get(), "step", faults);
  if (state.step < 0) faults.fail("attribute 'step' = " + std::to_string(state.step) + " is < 0");
  state.world_size = hdf5::read_int_attr<int>(file.get(), "world_size", faults);
  if (state.world_size < 1) {
    faults.fail("attribute 'world_size' = " + std::to_string(state.world_size) + " is < 1");
  }
  state.config_ini = hdf5::read_string_attr(file.get(), "config", faults);
  const hid_t root = file.get();
  state.optimizer_steps = hdf5::read_int_attr<int64_t>(root, "optimizer_steps", faults);
  state.batches_per_step = hdf5::read_int_attr<int64_t>(root, "data_batches_per_step", faults);
  state.loss_scale_good_steps = hdf5::read_int_attr<int64_t>(root, "loss_scale_good_steps", faults);
  state.next_batch = hdf5::read_int_attr<uint64_t>(root, "data_next_batch", faults);
  state.epoch = hdf5::read_int_attr<uint64_t>(root, "data_epoch", faults);
  state.seed = hdf5::read_int_attr<uint64_t>(root, "rng_seed", faults);
  state.sharding = hdf5::read_string_attr(root, "data_sharding", faults);
  state.loss_scale = hdf5::read_double_attr(root, "loss_scale", faults);
  state.vocab_size = hdf5::read_int_attr<int>(root, "vocab_size", faults);
  // The vocabulary becomes the model's (its config's rules are the caller's:
  // an image classifier's is the reserved ids alone).
  if (state.vocab_size < 1 || state.vocab_size > kMaxWidth) {
    faults.fail("attribute 'vocab_size' = " + std::to_string(state.vocab_size) +
                ": must be in [1, " + std::to_string(kMaxWidth) + "]");
  }
  state.special = hdf5::read_special_token_attrs(root, state.vocab_size, faults);
  if (hdf5::attr_exists(root, "run_id", faults)) {
    state.run_id = hdf5::read_string_attr(root, "run_id", faults);
  }
  if (hdf5::attr_exists(root, "progress_window", faults)) {
    state.progress_window = hdf5::read_string_attr(root, "progress_window", faults);
  }
  if (hdf5::attr_exists(root, "averaged_from", faults)) {
    state.averaged_from = hdf5::read_string_attr(root, "averaged_from", faults);
  }
  if (hdf5::link_exists(root, "tokenizer", faults)) {
    check_declared_size(root, "tokenizer", faults);
    state.tokenizer = hdf5::read_bytes_dataset(root, "tokenizer", faults);
  }
  if (hdf5::link_exists(root, "label_names", faults)) {
    check_declared_size(root, "label_names", faults);
    state.label_names = split_label_names(hdf5::read_bytes_dataset(root, "label_names", faults));
  }
  // Values no run writes: a hand-edited or damaged file would resume wrongly.
  const std::string fault = state_fault(state);
  if (!fault.empty()) faults.fail(fault);
  return state;
}

namespace {

LoadedCheckpoint read_whole_or_layout(const std::string& path, bool with_data) {
  LoadedCheckpoint c;
  c.path = path;
  c.state = read_checkpoint_state(path);
  c.params = read_checkpoint_tensors(path, "params", with_data);
  c.m = read_checkpoint_tensors(path, "optimizer/m", with_data);
  c.v = read_checkpoint_tensors(path, "optimizer/v", with_data);
  const auto same_names = [](const std::vector<CheckpointTensor>& a,
                             const std::vector<CheckpointTensor>& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
      if (a[i].name != b[i].name || a[i].shape != b[i].shape) return false;
    return true;
  };
  if (!same_names(c.params, c.m) || !same_names(c.params, c.v)) {
    checkpoint_faults(path).fail(
        "the optimizer moments do not match the parameters tensor by tensor");
  }
  return c;
}

}  // namespace

LoadedCheckpoint read_checkpoint(const std::string& path) {
  LoadedCheckpoint c = read_whole_or_layout(path, true);
  require_finite(path, c.params, "params");
  require_finite(path, c.m, "optimizer/m");
  require_finite(path, c.v, "optimizer/v");
  return c;
}

LoadedCheckpoint read_checkpoint_layout(const std::string& path) {
  return read_whole_or_layout(path, false);
}

void check_checkpoint_tensors(const std::string& path, const std::vector<CheckpointTensor>& tensors,
                              const ParameterSet& params) {
  const auto mismatch = [&](const std::string& what) {
    throw CheckpointMismatch(path + ": " + what);
  };
  std::map<std::string, const CheckpointTensor*> by_name;
  for (const CheckpointTensor& t : tensors) by_name[t.name] = &t;
  for (const ParamInfo& info : params.info()) {
    const auto it = by_name.find(info.name);
    if (it == by_name.end()) {
      mismatch("has no tensor '" + info.name + "' of shape " + shape_string(info.shape) +
               ", which these flags build");
    }
    const CheckpointTensor& t = *it->second;
    if (t.shape != info.shape) {
      mismatch("tensor '" + info.name + "' has shape " + shape_string(t.shape) +
               "; these flags build " + shape_string(info.shape));
    }
    by_name.erase(it);
  }
  if (!by_name.empty()) {
    mismatch("holds tensor '" + by_name.begin()->first + "', which these flags do not build");
  }
}

void unpack_checkpoint_tensors(const std::string& path,
                               const std::vector<CheckpointTensor>& tensors,
                               const ParameterSet& params, float* dest) {
  check_checkpoint_tensors(path, tensors, params);
  std::map<std::string, const CheckpointTensor*> by_name;
  for (const CheckpointTensor& t : tensors) by_name[t.name] = &t;
  for (const ParamInfo& info : params.info()) {
    const CheckpointTensor& t = *by_name.at(info.name);
    std::copy(t.data.begin(), t.data.end(), dest + info.offset);
  }
}

ModelCheckpoint read_model_checkpoint(const std::string& path, const std::string& flag,
                                      const ConfigCheck& check_config) {
  try {
    ModelCheckpoint model{read_checkpoint_state(path), {}};
    check_config(model.state.config_ini);  // before any tensor is allocated
    model.params = read_checkpoint_tensors(path, "params");
    require_finite(path, model.params, "params");
    return model;
  } catch (const CheckpointError& e) {
    usage_error(flag, e.what());
  } catch (const UsageError& e) {
    usage_error(flag, e.what());
  }
}

std::string non_finite_fault(const std::string& group, const std::string& name, float bad) {
  return group + " tensor '" + name + "' holds non-finite values (" +
         (std::isnan(bad) ? "nan" : "inf") +
         "): the run that wrote it had diverged; use an earlier checkpoint";
}

void require_finite(const std::string& path, const std::vector<CheckpointTensor>& tensors,
                    const std::string& group) {
  for (const CheckpointTensor& t : tensors) {
    const auto bad =
        std::find_if(t.data.begin(), t.data.end(), [](float x) { return !std::isfinite(x); });
    if (bad == t.data.end()) continue;
    checkpoint_faults(path).fail(non_finite_fault(group, t.name, *bad));
  }
}

bool is_checkpoint(const std::string& path) {
  return hdf5::has_format(path, kCheckpointFormat);
}

}  // namespace mpiformer
