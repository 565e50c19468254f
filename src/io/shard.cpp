// HDF5 token shards: writer, validating reader, directory listing. The
// layout is specified in data/FORMAT.md; every fault becomes one ShardError
// line "PATH: reason" and HDF5's own error stack is never printed.
#include "src/io/shard.h"

#include <hdf5.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <tuple>
#include <type_traits>

#include "src/core/escape.h"
#include "src/io/dataset_checksum.h"
#include "src/io/declared_size.h"
#include "src/io/hdf5_file.h"
#include "src/io/label_names.h"

namespace mpiformer {

namespace {

namespace fs = std::filesystem;

using hdf5::Faults;
using hdf5::Hid;

constexpr hsize_t kChunkElements = 64 * 1024;
constexpr int64_t kUint16Vocab = 65536;  // ids up to 65535 fit uint16

// ---------------------------------------------------------------- writing

void write_dataset(hid_t loc, const std::string& name, hid_t file_type, hid_t mem_type,
                   const void* data, hsize_t n, const Faults& faults) {
  hdf5::write_vector_dataset(loc, name, file_type, mem_type, data, n, kChunkElements, faults);
}

// Checks one side before anything is written, so a bad shard never reaches disk.
// `name` is "" (lm) or "source "/"target ".
void validate_for_write(const TokenSequences& seq, const std::string& name, int vocab_size,
                        const Faults& faults) {
  if (seq.offsets.empty() || seq.offsets.front() != 0) {
    faults.fail("cannot write: " + name + "offsets must start with 0");
  }
  for (size_t i = 0; i + 1 < seq.offsets.size(); ++i) {
    if (seq.offsets[i + 1] < seq.offsets[i]) {
      faults.fail("cannot write: " + name + "offsets are not non-decreasing at sequence " +
                  std::to_string(i));
    }
  }
  if (seq.offsets.back() != seq.tokens.size()) {
    faults.fail("cannot write: " + name + "offsets end at " + std::to_string(seq.offsets.back()) +
                " but there are " + std::to_string(seq.tokens.size()) + " tokens");
  }
  for (size_t i = 0; i < seq.tokens.size(); ++i) {
    const int32_t t = seq.tokens[i];
    if (t < 0 || t >= vocab_size) {
      faults.fail("cannot write: " + name + "token id " + std::to_string(t) + " at position " +
                  std::to_string(i) + " is not in [0, vocab_size " + std::to_string(vocab_size) +
                  ")");
    }
  }
}

void write_side(hid_t file, const std::string& prefix, const TokenSequences& seq, int vocab_size,
                const Faults& faults) {
  if (vocab_size <= kUint16Vocab) {
    std::vector<uint16_t> narrow(seq.tokens.begin(), seq.tokens.end());  // (tokens)
    write_dataset(file, prefix + "tokens", H5T_STD_U16LE, H5T_NATIVE_UINT16, narrow.data(),
                  narrow.size(), faults);
  } else {
    write_dataset(file, prefix + "tokens", H5T_STD_I32LE, H5T_NATIVE_INT32, seq.tokens.data(),
                  seq.tokens.size(), faults);
  }
  write_dataset(file, prefix + "offsets", H5T_STD_U64LE, H5T_NATIVE_UINT64, seq.offsets.data(),
                seq.offsets.size(), faults);
}

void validate_labels_for_write(const Shard& shard, const Faults& faults) {
  const ShardLabels& l = shard.labels;
  const size_t K = shard.header.label_names.size();
  if (K == 0) faults.fail("cannot write: a " + shard.header.kind + " shard needs label names");
  for (const std::string& n : shard.header.label_names) {
    if (n.empty() || n.find_first_of(" \t\n\r") != std::string::npos) {
      faults.fail("cannot write: label name '" + n + "' is empty or holds white space");
    }
  }
  if (l.offsets.empty() || l.offsets.front() != 0 || l.offsets.back() != l.ids.size() ||
      l.weights.size() != l.ids.size()) {
    faults.fail("cannot write: label offsets, ids and weights disagree");
  }
  for (size_t i = 0; i < l.ids.size(); ++i) {
    if (l.ids[i] < 0 || static_cast<size_t>(l.ids[i]) >= K || !(l.weights[i] >= 0.0f) ||
        !(l.weights[i] <= 1.0f)) {
      faults.fail("cannot write: label " + std::to_string(i) + " (id " + std::to_string(l.ids[i]) +
                  ", weight " + std::to_string(l.weights[i]) + ") is outside " + std::to_string(K) +
                  " labels or [0, 1]");
    }
  }
}

void write_labels(hid_t root, const Shard& shard, const Faults& faults) {
  const ShardHeader& h = shard.header;
  const int K = static_cast<int>(h.label_names.size());
  hdf5::write_int_attr(root, "num_labels", H5T_STD_I32LE, H5T_NATIVE_INT, &K, faults);
  hdf5::write_bytes_dataset(root, "label_names", join_label_names(h.label_names), faults);
  const ShardLabels& l = shard.labels;
  write_dataset(root, "labels/ids", H5T_STD_I32LE, H5T_NATIVE_INT32, l.ids.data(), l.ids.size(),
                faults);
  write_dataset(root, "labels/weights", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, l.weights.data(),
                l.weights.size(), faults);
  write_dataset(root, "labels/offsets", H5T_STD_U64LE, H5T_NATIVE_UINT64, l.offsets.data(),
                l.offsets.size(), faults);
  if (h.kind != "image") return;
  for (const auto& [name, value] : {std::pair{"image_height", &h.image_height},
                                    {"image_width", &h.image_width},
                                    {"image_channels", &h.image_channels}}) {
    hdf5::write_int_attr(root, name, H5T_STD_I32LE, H5T_NATIVE_INT, value, faults);
  }
  write_dataset(root, "images", H5T_STD_U8LE, H5T_NATIVE_UINT8, shard.images.data(),
                shard.images.size(), faults);
}

void write_shard_file(const Faults& faults, const Shard& shard) {
  const ShardHeader& h = shard.header;
  Hid file =
      faults.checked(H5Fcreate(faults.path().c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT),
                     H5Fclose, "the file");
  const hid_t root = file.get();
  hdf5::write_string_attr(root, "format", kShardFormat, faults);
  const int version = kShardVersion;
  hdf5::write_int_attr(root, "version", H5T_STD_I32LE, H5T_NATIVE_INT, &version, faults);
  hdf5::promise_checksums(root, faults);
  hdf5::write_string_attr(root, "kind", h.kind, faults);
  hdf5::write_int_attr(root, "vocab_size", H5T_STD_I32LE, H5T_NATIVE_INT, &h.vocab_size, faults);
  hdf5::write_special_token_attrs(root, h.special, faults);
  const bool seq2seq = h.kind == "seq2seq";
  const uint64_t sequences = shard.count();
  const uint64_t tokens = shard.target.tokens.size() + (seq2seq ? shard.source.tokens.size() : 0);
  hdf5::write_int_attr(root, "sequences", H5T_STD_U64LE, H5T_NATIVE_UINT64, &sequences, faults);
  hdf5::write_int_attr(root, "tokens", H5T_STD_U64LE, H5T_NATIVE_UINT64, &tokens, faults);
  if (!h.split.empty()) hdf5::write_string_attr(root, "split", h.split, faults);
  if (!h.origin.empty()) hdf5::write_string_attr(root, "origin", h.origin, faults);

  hdf5::write_bytes_dataset(root, "tokenizer", h.tokenizer, faults);
  if (seq2seq) {
    write_side(root, "src/", shard.source, h.vocab_size, faults);
    write_side(root, "tgt/", shard.target, h.vocab_size, faults);
  } else if (h.kind != "image") {
    write_side(root, "", shard.target, h.vocab_size, faults);
  }
  if (h.has_labels()) write_labels(root, shard, faults);
  faults.check(H5Fflush(root, H5F_SCOPE_LOCAL), "the file");
  faults.check(file.close(), "the file");
}

// ---------------------------------------------------------------- reading

// Strings written by other tools may be space-padded.
std::string read_trimmed_attr(hid_t loc, const char* name, const Faults& faults) {
  std::string value = hdf5::read_string_attr(loc, name, faults);
  while (!value.empty() && value.back() == ' ') value.pop_back();
  return value;
}

// An image shard's image_height, image_width and image_channels, positive
// and within the bounds of their flags.
void read_image_size(hid_t file, const Faults& faults, ShardHeader* h) {
  h->image_height = hdf5::read_int_attr<int>(file, "image_height", faults);
  h->image_width = hdf5::read_int_attr<int>(file, "image_width", faults);
  h->image_channels = hdf5::read_int_attr<int>(file, "image_channels", faults);
  if (h->image_height <= 0 || h->image_width <= 0 || h->image_channels <= 0) {
    faults.fail("image size " + std::to_string(h->image_height) + " x " +
                std::to_string(h->image_width) + " x " + std::to_string(h->image_channels) +
                " is not positive");
  }
  // The bounds of --image-height, --image-width and --image-channels.
  for (const auto& [name, value, most] :
       {std::tuple{"image_height", h->image_height, kMaxImageSide},
        {"image_width", h->image_width, kMaxImageSide},
        {"image_channels", h->image_channels, kMaxPatch}}) {
    if (value > most) {
      faults.fail("attribute '" + std::string(name) + "' = " + std::to_string(value) +
                  ": must be at most " + std::to_string(most));
    }
  }
}

// Header attributes plus /tokenizer; `sequences`/`tokens` receive the
// count attributes.
ShardHeader read_header(hid_t file, const Faults& faults, uint64_t* sequences, uint64_t* tokens) {
  const std::string format = hdf5::read_format(file, faults);
  if (format.empty()) faults.fail("not an mpiformer shard (no 'format' attribute)");
  if (format != kShardFormat)
    faults.fail("not an mpiformer shard (format is '" + escaped(format) + "')");
  ShardHeader h;
  h.version = hdf5::read_int_attr<int>(file, "version", faults);
  if (h.version != kShardVersion) {
    faults.fail("unsupported shard version " + std::to_string(h.version) +
                " (this build reads version " + std::to_string(kShardVersion) + ")");
  }
  h.kind = read_trimmed_attr(file, "kind", faults);
  if (h.kind != "lm" && h.kind != "seq2seq" && !h.has_labels()) {
    faults.fail("kind '" + escaped(h.kind) + "' is not lm, seq2seq, classify or image");
  }
  h.vocab_size = hdf5::read_int_attr<int>(file, "vocab_size", faults);
  // --vocab's rule: the shards' vocabulary becomes the model's (images have
  // none beyond the reserved ids).
  const std::string fault = h.kind == "image" ? "" : vocab_fault(h.vocab_size);
  if (!fault.empty()) {
    faults.fail("attribute 'vocab_size' = " + std::to_string(h.vocab_size) + ": " + fault);
  }
  h.special = hdf5::read_special_token_attrs(file, h.vocab_size, faults);
  *sequences = hdf5::read_int_attr<uint64_t>(file, "sequences", faults);
  *tokens = hdf5::read_int_attr<uint64_t>(file, "tokens", faults);
  // Optional: shards written before they existed have neither.
  if (hdf5::attr_exists(file, "split", faults)) h.split = read_trimmed_attr(file, "split", faults);
  if (hdf5::attr_exists(file, "origin", faults))
    h.origin = read_trimmed_attr(file, "origin", faults);

  // /tokenizer: uint8 bytes of the SentencePiece model.
  if (hdf5::link_exists(file, "tokenizer", faults)) check_declared_size(file, "tokenizer", faults);
  h.tokenizer = hdf5::read_bytes_dataset(file, "tokenizer", faults);
  if (h.has_labels()) {
    const int K = hdf5::read_int_attr<int>(file, "num_labels", faults);
    if (hdf5::link_exists(file, "label_names", faults)) {
      check_declared_size(file, "label_names", faults);
    }
    h.label_names = split_label_names(hdf5::read_bytes_dataset(file, "label_names", faults));
    if (K <= 0 || static_cast<size_t>(K) != h.label_names.size()) {
      faults.fail("attribute 'num_labels' says " + std::to_string(K) + " but /label_names holds " +
                  std::to_string(h.label_names.size()) + " names");
    }
  }
  if (h.kind == "image") read_image_size(file, faults, &h);
  return h;
}

// A 1-D dataset of any numeric type read as `mem_type` into `out`.
template <class T>
void read_numbers(hid_t file, const std::string& name, hid_t mem_type, const Faults& faults,
                  std::vector<T>* out) {
  if (!hdf5::link_exists(file, name, faults)) faults.fail("missing dataset " + name);
  Hid dset(H5Dopen2(file, name.c_str(), H5P_DEFAULT), H5Dclose);
  if (!dset.ok()) faults.fail_corrupt("open " + name);
  Hid space(H5Dget_space(dset.get()), H5Sclose);
  if (!space.ok() || H5Sget_simple_extent_ndims(space.get()) != 1) {
    faults.fail(name + " is not a 1-D dataset");
  }
  out->resize(static_cast<size_t>(checked_extent(dset.get(), "/" + name, faults)));
  if (!out->empty() &&
      H5Dread(dset.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, out->data()) < 0) {
    faults.fail_corrupt("read " + name);
  }
  hdf5::verify_read(dset.get(), out->data(), mem_type, out->size(), "/" + name, faults);
}

// /labels of a classify or image shard, checked against the vocabulary.
void read_labels(hid_t file, const ShardHeader& h, const Faults& faults, ShardLabels* out) {
  read_numbers(file, "labels/ids", H5T_NATIVE_INT32, faults, &out->ids);
  read_numbers(file, "labels/weights", H5T_NATIVE_FLOAT, faults, &out->weights);
  read_numbers(file, "labels/offsets", H5T_NATIVE_UINT64, faults, &out->offsets);
  const std::vector<uint64_t>& off = out->offsets;
  if (off.empty() || off.front() != 0) faults.fail("/labels/offsets do not start at 0");
  for (size_t i = 0; i + 1 < off.size(); ++i) {
    if (off[i + 1] < off[i]) {
      faults.fail("/labels/offsets are not non-decreasing at example " + std::to_string(i));
    }
  }
  if (off.back() != out->ids.size() || out->weights.size() != out->ids.size()) {
    faults.fail("/labels/offsets end at " + std::to_string(off.back()) + " but /labels/ids holds " +
                std::to_string(out->ids.size()) + " and /labels/weights " +
                std::to_string(out->weights.size()));
  }
  const size_t K = h.label_names.size();
  for (size_t i = 0; i < out->ids.size(); ++i) {
    if (out->ids[i] < 0 || static_cast<size_t>(out->ids[i]) >= K) {
      faults.fail("label id " + std::to_string(out->ids[i]) + " at position " + std::to_string(i) +
                  " of /labels/ids is not below num_labels " + std::to_string(K));
    }
    if (!(out->weights[i] >= 0.0f && out->weights[i] <= 1.0f)) {
      faults.fail("label weight " + std::to_string(out->weights[i]) + " at position " +
                  std::to_string(i) + " of /labels/weights is not in [0, 1]");
    }
  }
}

// Opens a 1-D integer dataset; returns its length in `n`.
Hid open_int_dataset(hid_t file, const std::string& name, const Faults& faults, hsize_t* n) {
  if (!hdf5::link_exists(file, name, faults)) faults.fail("missing dataset " + name);
  Hid dset(H5Dopen2(file, name.c_str(), H5P_DEFAULT), H5Dclose);
  if (!dset.ok()) faults.fail_corrupt("open " + name);
  Hid space(H5Dget_space(dset.get()), H5Sclose);
  if (!space.ok() || H5Sget_simple_extent_ndims(space.get()) != 1) {
    faults.fail(name + " is not a 1-D dataset");
  }
  Hid type(H5Dget_type(dset.get()), H5Tclose);
  if (!type.ok() || H5Tget_class(type.get()) != H5T_INTEGER) {
    faults.fail(name + " holds " + (type.ok() ? hdf5::type_name(type.get()) : "unreadable") +
                " values, expected integers");
  }
  *n = checked_extent(dset.get(), name, faults);
  return dset;
}

// "token id V at position I of NAME is negative" (or not below vocab_size).
[[noreturn]] void fail_token(const std::string& value, bool negative, hsize_t i,
                             const std::string& name, int vocab_size, const Faults& faults) {
  faults.fail(
      "token id " + value + " at position " + std::to_string(i) + " of " + name +
      (negative ? " is negative" : " is not below vocab_size " + std::to_string(vocab_size)));
}

// Ids stored wider than int32 (int64, uint32, uint64) are read at their
// width, so that one past int32 is reported as it is, not as the int32
// HDF5's conversion would clamp it to; then range-checked and narrowed.
template <class Wide>
void read_wide_ids(hid_t dset, hid_t mem_type, const std::string& name, int vocab_size,
                   const Faults& faults, std::vector<int32_t>* out) {
  std::vector<Wide> wide(out->size());  // (tokens)
  if (H5Dread(dset, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, wide.data()) < 0) {
    faults.fail_corrupt("read " + name);
  }
  hdf5::verify_read(dset, wide.data(), mem_type, wide.size(), name, faults);
  for (size_t i = 0; i < wide.size(); ++i) {
    const bool negative = std::is_signed_v<Wide> && wide[i] < 0;
    if (negative || wide[i] >= static_cast<Wide>(vocab_size)) {
      fail_token(std::to_string(wide[i]), negative, i, name, vocab_size, faults);
    }
    (*out)[i] = static_cast<int32_t>(wide[i]);
  }
}

// Reads the ids of one side (out->size() of them) and checks each is below
// vocab_size.
void read_token_ids(hid_t dset, const std::string& name, int vocab_size, const Faults& faults,
                    std::vector<int32_t>* out) {
  Hid type(H5Dget_type(dset), H5Tclose);
  const size_t bytes = H5Tget_size(type.get());
  const bool is_unsigned = H5Tget_sign(type.get()) == H5T_SGN_NONE;
  if (bytes > 4 || (bytes == 4 && is_unsigned)) {
    if (is_unsigned)
      return read_wide_ids<uint64_t>(dset, H5T_NATIVE_UINT64, name, vocab_size, faults, out);
    return read_wide_ids<int64_t>(dset, H5T_NATIVE_INT64, name, vocab_size, faults, out);
  }
  const hsize_t n = out->size();
  int32_t* dst = out->data();
  if (bytes == 2 && is_unsigned) {
    // The common case: read narrow in one call, widen in a tight loop.
    std::vector<uint16_t> narrow(n);  // (tokens)
    if (H5Dread(dset, H5T_NATIVE_UINT16, H5S_ALL, H5S_ALL, H5P_DEFAULT, narrow.data()) < 0) {
      faults.fail_corrupt("read " + name);
    }
    hdf5::verify_read(dset, narrow.data(), H5T_NATIVE_UINT16, n, name, faults);
    for (hsize_t i = 0; i < n; ++i) dst[i] = narrow[i];
  } else if (H5Dread(dset, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, dst) < 0) {
    faults.fail_corrupt("read " + name);  // int32 holds every value of these types exactly
  } else {
    hdf5::verify_read(dset, dst, H5T_NATIVE_INT32, n, name, faults);
  }
  // Range check as a branch-free min/max pass; locate the culprit only on failure.
  int32_t lo = 0, hi = 0;
  for (hsize_t i = 0; i < n; ++i) {
    lo = std::min(lo, dst[i]);
    hi = std::max(hi, dst[i]);
  }
  if (lo >= 0 && hi < vocab_size) return;
  for (hsize_t i = 0; i < n; ++i) {
    if (dst[i] < 0 || dst[i] >= vocab_size) {
      fail_token(std::to_string(dst[i]), dst[i] < 0, i, name, vocab_size, faults);
    }
  }
}

// Reads one side: `prefix` is "/" (lm) or "/src/", "/tgt/".
void read_side(hid_t file, const std::string& prefix, int vocab_size, const Faults& faults,
               TokenSequences* out) {
  const std::string offsets_name = prefix + "offsets";
  const std::string tokens_name = prefix + "tokens";

  hsize_t n_offsets = 0;
  Hid offsets = open_int_dataset(file, offsets_name, faults, &n_offsets);
  if (n_offsets == 0) faults.fail(offsets_name + " is empty (it needs sequences + 1 entries)");
  out->offsets.resize(n_offsets);  // (n+1)
  if (H5Dread(offsets.get(), H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT,
              out->offsets.data()) < 0) {
    faults.fail_corrupt("read " + offsets_name);
  }
  hdf5::verify_read(offsets.get(), out->offsets.data(), H5T_NATIVE_UINT64, n_offsets, offsets_name,
                    faults);

  hsize_t n_tokens = 0;
  Hid tokens = open_int_dataset(file, tokens_name, faults, &n_tokens);
  out->tokens.resize(n_tokens);  // (tokens)
  if (n_tokens > 0) read_token_ids(tokens.get(), tokens_name, vocab_size, faults, &out->tokens);

  const std::vector<uint64_t>& off = out->offsets;
  if (off[0] != 0) faults.fail(offsets_name + " start at " + std::to_string(off[0]) + ", not 0");
  for (size_t i = 0; i + 1 < off.size(); ++i) {
    if (off[i + 1] < off[i]) {
      faults.fail(offsets_name + " are not non-decreasing at sequence " + std::to_string(i) + " (" +
                  std::to_string(off[i]) + " then " + std::to_string(off[i + 1]) + ")");
    }
  }
  if (off.back() != n_tokens) {
    faults.fail(offsets_name + " end at " + std::to_string(off.back()) + " but " + tokens_name +
                " holds " + std::to_string(n_tokens));
  }
}

}  // namespace

void ShardLabels::append(const int32_t* label_ids, const float* label_weights, size_t n) {
  ids.insert(ids.end(), label_ids, label_ids + n);
  weights.insert(weights.end(), label_weights, label_weights + n);
  offsets.push_back(ids.size());
}

void TokenSequences::append(const int32_t* ids, size_t n) {
  tokens.insert(tokens.end(), ids, ids + n);
  offsets.push_back(tokens.size());
}

void write_shard(const std::string& path, const Shard& shard) {
  const Faults faults = Faults::of<ShardError>(path);
  const ShardHeader& h = shard.header;
  if (h.kind != "lm" && h.kind != "seq2seq" && !h.has_labels()) {
    faults.fail("cannot write: kind '" + h.kind + "' is not lm, seq2seq, classify or image");
  }
  if (h.vocab_size <= 0) faults.fail("cannot write: vocab_size must be positive");
  const bool seq2seq = h.kind == "seq2seq";
  validate_for_write(shard.target, seq2seq ? "target " : "", h.vocab_size, faults);
  if (seq2seq) {
    validate_for_write(shard.source, "source ", h.vocab_size, faults);
    if (shard.source.count() != shard.target.count()) {
      faults.fail("cannot write: " + std::to_string(shard.source.count()) + " source but " +
                  std::to_string(shard.target.count()) + " target sequences");
    }
  } else if (shard.source.count() != 0 || !shard.source.tokens.empty()) {
    faults.fail("cannot write: an " + h.kind + " shard has no source side");
  }
  if (h.has_labels()) {
    validate_labels_for_write(shard, faults);
    if (shard.labels.count() != shard.count() ||
        (h.kind == "classify" && shard.labels.count() != shard.target.count())) {
      faults.fail("cannot write: " + std::to_string(shard.labels.count()) + " label lists for " +
                  std::to_string(shard.target.count()) + " sequences");
    }
    if (h.kind == "image" && shard.images.size() != shard.labels.count() * h.image_bytes()) {
      faults.fail("cannot write: " + std::to_string(shard.images.size()) + " image bytes for " +
                  std::to_string(shard.labels.count()) + " images of " +
                  std::to_string(h.image_bytes()));
    }
  }

  hdf5::Session session;
  try {
    write_shard_file(faults, shard);
  } catch (const ShardError&) {
    std::error_code ec;
    fs::remove(path, ec);  // leave no half-written file behind
    throw;
  }
}

Shard read_shard(const std::string& path) {
  const Faults faults = Faults::of<ShardError>(path);
  hdf5::Session session;
  Hid file = hdf5::open_for_reading(faults, "shard file");
  Shard shard;
  uint64_t sequences = 0, tokens = 0;
  shard.header = read_header(file.get(), faults, &sequences, &tokens);
  const int vocab = shard.header.vocab_size;
  uint64_t stored_tokens = 0;
  if (shard.header.kind == "seq2seq") {
    read_side(file.get(), "/src/", vocab, faults, &shard.source);
    read_side(file.get(), "/tgt/", vocab, faults, &shard.target);
    if (shard.source.count() != shard.target.count()) {
      faults.fail("/src holds " + std::to_string(shard.source.count()) +
                  " sequences but /tgt holds " + std::to_string(shard.target.count()));
    }
    stored_tokens = shard.source.tokens.size() + shard.target.tokens.size();
  } else if (shard.header.kind != "image") {
    read_side(file.get(), "/", vocab, faults, &shard.target);
    stored_tokens = shard.target.tokens.size();
  }
  if (shard.header.has_labels()) {
    read_labels(file.get(), shard.header, faults, &shard.labels);
    if (shard.header.kind == "classify" && shard.labels.count() != shard.target.count()) {
      faults.fail("/labels holds " + std::to_string(shard.labels.count()) +
                  " label lists but /offsets " + std::to_string(shard.target.count()) +
                  " sequences");
    }
  }
  if (shard.header.kind == "image") {
    read_numbers(file.get(), "images", H5T_NATIVE_UINT8, faults, &shard.images);
    if (shard.images.size() != shard.labels.count() * shard.header.image_bytes()) {
      faults.fail("/images holds " + std::to_string(shard.images.size()) + " bytes but " +
                  std::to_string(shard.labels.count()) + " images of " +
                  std::to_string(shard.header.image_bytes()) + " need " +
                  std::to_string(shard.labels.count() * shard.header.image_bytes()));
    }
  }
  if (sequences != shard.count()) {
    faults.fail("attribute 'sequences' says " + std::to_string(sequences) + " but the file holds " +
                std::to_string(shard.count()));
  }
  if (tokens != stored_tokens) {
    faults.fail("attribute 'tokens' says " + std::to_string(tokens) + " but the file holds " +
                std::to_string(stored_tokens));
  }
  if (shard.count() == 0) faults.fail("empty shard (0 sequences)");
  return shard;
}

ShardHeader read_shard_header(const std::string& path) {
  const Faults faults = Faults::of<ShardError>(path);
  hdf5::Session session;
  Hid file = hdf5::open_for_reading(faults, "shard file");
  uint64_t sequences = 0, tokens = 0;
  return read_header(file.get(), faults, &sequences, &tokens);
}

std::vector<std::string> list_shards(const std::string& dir, const std::string& prefix) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    throw ShardError(dir + (fs::exists(dir, ec) ? ": not a directory" : ": no such directory"));
  }
  // Names are PREFIX-DIGITS.h5; sorted by number so a set past 99999 files
  // (six digits) still comes out in order.
  const std::string head = prefix + "-";
  std::vector<std::pair<uint64_t, std::string>> found;
  try {
    for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
      const std::string name = e.path().filename().string();
      if (name.size() <= head.size() + 3 || name.compare(0, head.size(), head) != 0) continue;
      if (name.compare(name.size() - 3, 3, ".h5") != 0) continue;
      const std::string digits = name.substr(head.size(), name.size() - head.size() - 3);
      if (digits.empty() || digits.size() > 18 ||
          !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        continue;
      }
      found.emplace_back(std::stoull(digits), (fs::path(dir) / name).string());
    }
  } catch (const fs::filesystem_error& e) {
    throw ShardError(dir + ": cannot list (" + e.code().message() + ")");
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> paths;
  paths.reserve(found.size());
  for (auto& f : found) paths.push_back(std::move(f.second));
  return paths;
}

}  // namespace mpiformer
