#include "tests/bad_shards.h"

#include <hdf5.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <vector>

#include "src/io/crc32c.h"
#include "src/io/dataset_checksum.h"

namespace mpiformer::test_shards {

namespace {

// Fails loudly: these helpers only run in tests.
void ensure(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error("bad_shards: " + what);
}

// An open file that is closed on scope exit (objects first, by their own RAII below).
struct File {
  hid_t id;
  explicit File(const std::string& path) : id(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT)) {
    ensure(id >= 0, "cannot open " + path);
  }
  ~File() { H5Fclose(id); }
};

struct Dataset {
  hid_t id;
  Dataset(hid_t file, const std::string& name) : id(H5Dopen2(file, name.c_str(), H5P_DEFAULT)) {
    ensure(id >= 0, "cannot open dataset " + name);
  }
  ~Dataset() { H5Dclose(id); }
};

// Sums `dataset` afresh (its attribute crc32c), as a writer of wrong values
// would: what a reader must then find is the values' fault, not the sum's.
void reseal(const std::string& path, hid_t file, const std::string& dataset) {
  Dataset d(file, dataset);
  const hid_t type = H5Dget_type(d.id), space = H5Dget_space(d.id);
  std::vector<unsigned char> raw(static_cast<size_t>(H5Sget_simple_extent_npoints(space)) *
                                 H5Tget_size(type));  // (n) as stored
  const herr_t st =
      raw.empty() ? 0 : H5Dread(d.id, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, raw.data());
  H5Sclose(space);
  H5Tclose(type);
  ensure(st >= 0, "cannot read " + dataset);
  if (H5Aexists(d.id, "crc32c") > 0) H5Adelete(d.id, "crc32c");
  hdf5::write_crc32c(d.id, crc32c(raw.data(), raw.size()),
                     hdf5::Faults::of<std::runtime_error>(path));
}

}  // namespace

const std::vector<FaultName>& fault_names() {
  static const std::vector<FaultName> names = {
      {Fault::kValid, "valid"},
      {Fault::kMissingFormat, "missing-format"},
      {Fault::kBadVersion, "bad-version"},
      {Fault::kTruncated, "truncated"},
      {Fault::kNotHdf5, "not-hdf5"},
      {Fault::kOffsetsNotMonotone, "offsets-not-monotone"},
      {Fault::kOffsetsMismatch, "offsets-mismatch"},
      {Fault::kTokenOutOfRange, "token-out-of-range"},
      {Fault::kEmpty, "empty"},
      {Fault::kOtherVocab, "other-vocab"},
      {Fault::kOtherTokenizer, "other-tokenizer"},
      {Fault::kBadKind, "bad-kind"},
      {Fault::kBadChecksum, "bad-checksum"},
      {Fault::kCountMismatch, "count-mismatch"},
      {Fault::kSumBlindChange, "sum-blind-change"},
  };
  return names;
}

Fault parse_fault(const std::string& name) {
  for (const FaultName& f : fault_names()) {
    if (name == f.name) return f.fault;
  }
  throw std::invalid_argument("unknown fault '" + name + "'");
}

Shard sample_shard(const std::string& kind, int vocab_size, int count,
                   const std::string& tokenizer) {
  Shard shard;
  shard.header.kind = kind;
  shard.header.vocab_size = vocab_size;
  shard.header.tokenizer = tokenizer;
  const int symbols = vocab_size - 6;  // ids 0..5 are reserved
  std::vector<int32_t> seq;
  for (int i = 0; i < count; ++i) {
    seq.resize(1 + i % 24);
    for (size_t j = 0; j < seq.size(); ++j) {
      seq[j] = 6 + static_cast<int32_t>((i * 7 + j * 3) % symbols);
    }
    if (kind == "seq2seq") {
      shard.source.append(seq.data(), seq.size());
      std::reverse(seq.begin(), seq.end());
    }
    shard.target.append(seq.data(), seq.size());
  }
  return shard;
}

void set_int_attr(const std::string& path, const std::string& name, int value) {
  File f(path);
  hid_t attr = H5Aopen(f.id, name.c_str(), H5P_DEFAULT);
  ensure(attr >= 0, "no attribute " + name);
  const herr_t st = H5Awrite(attr, H5T_NATIVE_INT, &value);
  H5Aclose(attr);
  ensure(st >= 0, "cannot write attribute " + name);
}

void delete_attr(const std::string& path, const std::string& name) {
  File f(path);
  ensure(H5Adelete(f.id, name.c_str()) >= 0, "cannot delete attribute " + name);
}

void set_string_attr(const std::string& path, const std::string& name, const std::string& value) {
  // The stored type is fixed-length: recreate the attribute with a fitting size.
  File f(path);
  if (H5Aexists(f.id, name.c_str()) > 0) H5Adelete(f.id, name.c_str());
  hid_t type = H5Tcopy(H5T_C_S1);
  H5Tset_size(type, value.size() + 1);
  hid_t space = H5Screate(H5S_SCALAR);
  hid_t attr = H5Acreate2(f.id, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT);
  const herr_t st = attr >= 0 ? H5Awrite(attr, type, value.c_str()) : -1;
  if (attr >= 0) H5Aclose(attr);
  H5Sclose(space);
  H5Tclose(type);
  ensure(st >= 0, "cannot write attribute " + name);
}

void set_element(const std::string& path, const std::string& dataset, uint64_t index,
                 int64_t value) {
  File f(path);
  Dataset d(f.id, dataset);
  hid_t fspace = H5Dget_space(d.id);
  const hsize_t start[1] = {index}, one[1] = {1};
  H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, nullptr, one, nullptr);
  hid_t mspace = H5Screate_simple(1, one, nullptr);
  const herr_t st = H5Dwrite(d.id, H5T_NATIVE_INT64, mspace, fspace, H5P_DEFAULT, &value);
  H5Sclose(mspace);
  H5Sclose(fspace);
  ensure(st >= 0, "cannot write " + dataset);
  reseal(path, f.id, dataset);
}

void replace_u64_dataset(const std::string& path, const std::string& dataset,
                         const std::vector<uint64_t>& values) {
  File f(path);
  ensure(H5Ldelete(f.id, dataset.c_str(), H5P_DEFAULT) >= 0, "cannot delete " + dataset);
  const hsize_t dims[1] = {values.size()};
  hid_t space = H5Screate_simple(1, dims, nullptr);
  hid_t d = H5Dcreate2(f.id, dataset.c_str(), H5T_STD_U64LE, space, H5P_DEFAULT, H5P_DEFAULT,
                       H5P_DEFAULT);
  const herr_t st =
      d >= 0 ? H5Dwrite(d, H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()) : -1;
  if (d >= 0) H5Dclose(d);
  H5Sclose(space);
  ensure(st >= 0, "cannot write " + dataset);
  reseal(path, f.id, dataset);
}

void truncate_file(const std::string& path, uint64_t keep) {
  std::filesystem::resize_file(path, keep);
}

// Where the first chunk of `dataset` lies in the file's bytes, and its size.
void first_chunk(const std::string& path, const std::string& dataset, haddr_t* addr,
                 hsize_t* size) {
  File f(path);
  Dataset d(f.id, dataset);
  hid_t fspace = H5Dget_space(d.id);
  hsize_t offset[1] = {0};
  unsigned filter_mask = 0;
  const herr_t st = H5Dget_chunk_info(d.id, fspace, 0, offset, &filter_mask, addr, size);
  H5Sclose(fspace);
  ensure(st >= 0 && *addr != HADDR_UNDEF && *size > 10, "no chunk in " + dataset);
}

void corrupt_first_chunk(const std::string& path, const std::string& dataset) {
  haddr_t addr = HADDR_UNDEF;
  hsize_t size = 0;
  first_chunk(path, dataset, &addr, &size);
  // The chunk ends with its 4-byte checksum; flip a data byte before it.
  std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
  io.seekg(static_cast<std::streamoff>(addr));
  char c = 0;
  io.get(c);
  io.seekp(static_cast<std::streamoff>(addr));
  io.put(static_cast<char>(c ^ 0x5a));
  ensure(static_cast<bool>(io), "cannot patch " + path);
}

// Changes three ids of the first chunk of `dataset` (uint16) in the file's
// bytes by +1, -2, +1. HDF5's Fletcher32 adds the chunk's big-endian 16-bit
// words and their running sums: an id below 256 is the word id * 256, so the
// changes cancel in both sums and the chunk still reads. The ids stay valid.
void change_blind_to_fletcher32(const std::string& path, const std::string& dataset) {
  haddr_t addr = HADDR_UNDEF;
  hsize_t size = 0;
  first_chunk(path, dataset, &addr, &size);
  std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
  std::vector<unsigned char> ids(size - 4);  // (ids) little-endian uint16, then the checksum
  io.seekg(static_cast<std::streamoff>(addr));
  io.read(reinterpret_cast<char*>(ids.data()), static_cast<std::streamsize>(ids.size()));
  const int delta[3] = {1, -2, 1};
  for (size_t at = 0; at + 6 <= ids.size(); at += 2) {
    bool fits = true;
    for (int k = 0; k < 3; ++k) {
      const int id = ids[at + 2 * k] + delta[k];
      fits = fits && ids[at + 2 * k + 1] == 0 && id >= 6 && id < kVocab;
    }
    if (!fits) continue;
    for (int k = 0; k < 3; ++k)
      ids[at + 2 * k] = static_cast<unsigned char>(ids[at + 2 * k] + delta[k]);
    io.seekp(static_cast<std::streamoff>(addr));
    io.write(reinterpret_cast<const char*>(ids.data()), static_cast<std::streamsize>(ids.size()));
    ensure(static_cast<bool>(io), "cannot patch " + path);
    return;
  }
  ensure(false, "no three ids to change in " + dataset);
}

void write_bad_shard(const std::string& path, const std::string& kind, Fault fault) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  const bool seq2seq = kind == "seq2seq";
  const std::string prefix = seq2seq ? "/tgt/" : "/";
  ensure(kind == "lm" || seq2seq, "kind must be lm or seq2seq");
  ensure(fault != Fault::kCountMismatch || seq2seq, "count-mismatch needs kind seq2seq");
  switch (fault) {
    case Fault::kNotHdf5: {
      std::ofstream(path) << "this is plain text, not an HDF5 file\n";
      return;
    }
    case Fault::kEmpty:
      write_shard(path, sample_shard(kind, kVocab, 0));
      return;
    case Fault::kOtherVocab:
      write_shard(path, sample_shard(kind, kOtherVocab));
      return;
    case Fault::kOtherTokenizer:
      write_shard(path, sample_shard(kind, kVocab, 40, kOtherTokenizer));
      return;
    default:
      break;
  }
  const Shard shard = sample_shard(kind);
  write_shard(path, shard);
  switch (fault) {
    case Fault::kMissingFormat:
      delete_attr(path, "format");
      break;
    case Fault::kBadVersion:
      set_int_attr(path, "version", 7);
      break;
    case Fault::kTruncated:
      truncate_file(path, std::filesystem::file_size(path) / 2);
      break;
    case Fault::kOffsetsNotMonotone:
      set_element(path, prefix + "offsets", 3, static_cast<int64_t>(shard.target.offsets[4] + 1));
      break;
    case Fault::kOffsetsMismatch:
      set_element(path, prefix + "offsets", shard.target.count(),
                  static_cast<int64_t>(shard.target.tokens.size() + 4));
      break;
    case Fault::kTokenOutOfRange:
      set_element(path, prefix + "tokens", 5, kVocab);
      break;
    case Fault::kBadKind:
      set_string_attr(path, "kind", "xyz");
      break;
    case Fault::kBadChecksum:
      corrupt_first_chunk(path, prefix + "tokens");
      break;
    case Fault::kSumBlindChange:
      change_blind_to_fletcher32(path, prefix + "tokens");
      break;
    case Fault::kCountMismatch: {
      // Drop the last target sequence: /tgt stays self-consistent.
      std::vector<uint64_t> offsets(shard.target.offsets.begin(), shard.target.offsets.end() - 1);
      std::vector<uint64_t> kept(shard.target.tokens.begin(),
                                 shard.target.tokens.begin() + offsets.back());
      replace_u64_dataset(path, "/tgt/offsets", offsets);
      replace_u64_dataset(path, "/tgt/tokens", kept);  // readers accept any integer type
      break;
    }
    default:
      break;
  }
}

}  // namespace mpiformer::test_shards
