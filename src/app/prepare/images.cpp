// prepare --kind image (images.h): reading and checking the images and
// labels on rank 0, cutting the held-out images from the end of the set,
// and writing the shards into the output directory all or nothing.
#include "src/app/prepare/images.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "src/app/prepare/corpus.h"
#include "src/app/prepare/inputs.h"
#include "src/app/prepare/output.h"
#include "src/app/prepare/progress.h"
#include "src/core/error.h"
#include "src/core/escape.h"
#include "src/io/array_file.h"
#include "src/io/label_names.h"
#include "src/io/shard.h"
#include "src/io/stop_cleanup.h"
#include "src/parallel/agreement.h"

namespace mpiformer::prepare {
namespace {

namespace fs = std::filesystem;

// The images of --kind image: (N, H, W) or (N, H, W, C) uint8 and N integer
// labels, with optional label names, read on rank 0.
struct ImageSet {
  ShardHeader header;           // kind, size and label names
  std::vector<uint8_t> pixels;  // (N, H, W, C)
  std::vector<int32_t> labels;  // (N)
  size_t count() const { return labels.size(); }
};

// The faults of the file are the user's: each names --input and the file.
std::vector<std::pair<std::string, ArrayData>> read_image_arrays(const std::string& path) {
  try {
    return read_arrays(path, {{"images"}, {"labels"}, {"label_names", /*required=*/false}});
  } catch (const std::runtime_error& e) {
    usage_error("--input", e.what());
  }
}

// "N, H, W" or "N, H, W, C", as the messages show a shape.
std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text;
  for (int64_t d : shape) text += (text.empty() ? "" : ", ") + std::to_string(d);
  return text;
}

// 'images' hold uint8 pixels, (N, H, W) or (N, H, W, C), with every size of
// an image at least 1 and small enough for an int.
void check_images(const std::string& path, const ArrayData& images) {
  if (images.kind != 'u' || images.itemsize != 1) {
    usage_error("--input", path + ": 'images' must hold uint8 pixels; got " + images.type);
  }
  if (images.shape.size() != 3 && images.shape.size() != 4) {
    usage_error("--input", path + ": 'images' must be (N, H, W) or (N, H, W, C); it has " +
                               std::to_string(images.shape.size()) + " dimensions");
  }
  const std::string shape = shape_text(images.shape);
  for (size_t d = 1; d < images.shape.size(); ++d) {
    if (images.shape[d] == 0) {
      usage_error("--input", path + ": 'images' of shape (" + shape +
                                 ") are empty; an image needs at least one pixel");
    }
    if (images.shape[d] > std::numeric_limits<int>::max()) {
      usage_error("--input", path + ": 'images' of shape (" + shape + ") are too large");
    }
  }
}

// The shards' header for these (checked) images; the label names come later.
ShardHeader image_header(const ArrayData& images) {
  ShardHeader h;
  h.kind = "image";
  h.vocab_size = SpecialTokens::kCount;  // no tokens: only the reserved ids
  h.image_height = static_cast<int>(images.shape[1]);
  h.image_width = static_cast<int>(images.shape[2]);
  h.image_channels = images.shape.size() == 4 ? static_cast<int>(images.shape[3]) : 1;
  return h;
}

// 'label_names', each one a name a label may have.
std::vector<std::string> read_label_names(const std::string& path, const ArrayData& array) {
  std::vector<std::string> names = array.strings(path + ": 'label_names'");
  for (size_t k = 0; k < names.size(); ++k) {
    const std::string fault = label_name_fault(names[k]);
    if (!fault.empty()) {
      usage_error("--input", path + ": 'label_names' entry " + std::to_string(k) + " '" +
                                 escaped(names[k]) + "' " + fault);
    }
  }
  return names;
}

// The n labels, int32 as a shard holds them: each below the number of
// `names`, or, without names (nullptr), below the number of images.
std::vector<int32_t> read_labels(const std::string& path, const ArrayData& labels, int64_t n,
                                 const std::vector<std::string>* names) {
  const int64_t bound = names ? std::min<int64_t>(static_cast<int64_t>(names->size()),
                                                  std::numeric_limits<int32_t>::max())
                              : n;
  std::vector<int32_t> checked;
  checked.reserve(static_cast<size_t>(n));
  const std::vector<int64_t> values = labels.integers(path + ": 'labels'");
  for (size_t i = 0; i < values.size(); ++i) {
    const int64_t label = values[i];
    const std::string which = "labels[" + std::to_string(i) + "] = " + std::to_string(label);
    if (label < 0) usage_error("--input", path + ": " + which + " is negative");
    if (label >= bound) {
      usage_error(
          "--input",
          path + ": " + which +
              (names ? " has no name in the " + std::to_string(names->size()) + " 'label_names'"
                     : " is not below the number of images (" + std::to_string(n) +
                           "); name the labels in 'label_names' to have more"));
    }
    checked.push_back(static_cast<int32_t>(label));
  }
  return checked;
}

// Without 'label_names' the labels name themselves: "0" up to the largest.
std::vector<std::string> numbered_label_names(const std::vector<int32_t>& labels) {
  const int64_t most =
      labels.empty() ? -1 : static_cast<int64_t>(*std::max_element(labels.begin(), labels.end()));
  std::vector<std::string> names;
  for (int64_t k = 0; k <= most; ++k) names.push_back(std::to_string(k));
  return names;
}

// Every size taken from the file is checked before it sizes anything: the
// images' (no empty image), and the labels', which count the label
// vocabulary: without 'label_names' a label above the number of images is
// a mistake (one image in a class of its own at best), not a reason to
// write millions of labels.
ImageSet read_image_set(const std::string& path) {
  auto arrays = read_image_arrays(path);
  ArrayData& images = arrays[0].second;
  const ArrayData& labels = arrays[1].second;
  check_images(path, images);
  ImageSet set;
  set.header = image_header(images);
  ShardHeader& h = set.header;
  const int64_t n = images.shape[0];
  if (labels.shape.size() != 1 || labels.shape[0] != n) {
    usage_error("--input", path + ": 'labels' must be (N) with N = " + std::to_string(n) +
                               " (one integer label per image)");
  }
  const bool named = arrays.size() > 2;
  if (named) h.label_names = read_label_names(path, arrays[2].second);
  set.labels = read_labels(path, labels, n, named ? &h.label_names : nullptr);
  if (!named) h.label_names = numbered_label_names(set.labels);
  set.pixels = std::move(images.bytes);
  return set;
}

// Images [begin, end) of the set as one shard.
Shard image_shard(const ImageSet& set, size_t begin, size_t end, const char* split,
                  const std::string& origin) {
  Shard shard;
  shard.header = set.header;
  shard.header.split = split;
  shard.header.origin = origin + " images " + std::to_string(begin + 1) + "-" + std::to_string(end);
  const size_t bytes = set.header.image_bytes();
  shard.images.assign(set.pixels.begin() + static_cast<std::ptrdiff_t>(begin * bytes),
                      set.pixels.begin() + static_cast<std::ptrdiff_t>(end * bytes));
  const float hard = 1.0f;
  for (size_t i = begin; i < end; ++i) shard.labels.append(&set.labels[i], &hard, 1);
  return shard;
}

}  // namespace

// Held-out images come from the end of the set.
int run_prepare_images(const PrepareConfig& cfg, Communicator& comm) {
  const auto start = Clock::now();
  if (agree_on(
          comm, [&] { check_image_inputs(cfg); }, Speaker::kRoot, Blame::kOfInput, "prepare") !=
      0) {
    return kExitUsage;
  }
  ImageSet set;
  size_t valid = 0, test = 0, train = 0;
  std::vector<std::string> warnings;
  if (agree_on(
          comm,
          [&] {
            set = read_image_set(cfg.input);
            const size_t most = set.count() / kHoldOut;
            valid = std::min(static_cast<size_t>(cfg.valid_lines), most);
            test = std::min(static_cast<size_t>(cfg.test_lines), most);
            train = set.count() - valid - test;
            // As for text: only a number the user chose is worth a word.
            const auto capped = [&](const char* flag, int wanted, size_t got) {
              warnings.push_back("warning: " + std::string(flag) + " " + std::to_string(wanted) +
                                 ": holding out " + std::to_string(got) + " images, a tenth of " +
                                 "the " + std::to_string(set.count()) + " images of " + cfg.input);
            };
            if (cfg.valid_lines_given && valid < static_cast<size_t>(cfg.valid_lines)) {
              capped("--valid-lines", cfg.valid_lines, valid);
            }
            if (test > 0 && test < static_cast<size_t>(cfg.test_lines)) {
              capped("--test-lines", cfg.test_lines, test);
            }
            if (valid == 0) {
              usage_error("--input", cfg.input + " has " + std::to_string(set.count()) +
                                         " images; at least " + std::to_string(kHoldOut) +
                                         " are needed to hold one out for validation");
            }
            if (static_cast<size_t>(cfg.shards) > train) {
              usage_error("--shards", std::to_string(cfg.shards) + " shards but only " +
                                          std::to_string(train) + " training images");
            }
          },
          Speaker::kRoot, Blame::kOfInput, "prepare") != 0) {
    return kExitUsage;
  }
  if (comm.is_root()) {
    for (const std::string& w : warnings)
      std::fprintf(stderr, "mpiformer prepare: %s\n", w.c_str());
  }
  OutputDir out(cfg.out_dir);
  const bool ok = agree_on(comm, [&] {
                    if (!comm.is_root()) return;
                    out.create();
                    const std::string refused = out.lock();
                    if (!refused.empty()) throw std::runtime_error(refused);
                    out.remove_abandoned_temporaries();
                    const std::string origin = fs::path(cfg.input).filename().string();
                    for (int64_t k = 0; k < cfg.shards; ++k) {
                      out.write_shard(shard_name(kTrainPrefix, k),
                                      image_shard(set, static_cast<size_t>(k) * train / cfg.shards,
                                                  static_cast<size_t>(k + 1) * train / cfg.shards,
                                                  kTrainPrefix, origin));
                    }
                    out.write_shard(shard_name(kValidPrefix, 0),
                                    image_shard(set, train, train + valid, kValidPrefix, origin));
                    if (test > 0) {
                      out.write_shard(shard_name(kTestPrefix, 0),
                                      image_shard(set, train + valid, train + valid + test,
                                                  kTestPrefix, origin));
                    }
                    out.commit();
                  }) == 0;
  if (!ok) {
    out.remove_written();
    out.let_go();
    return kExitFailure;
  }
  ExitOnStop::finish();  // the set is complete
  if (comm.is_root()) {
    const ShardHeader& h = set.header;
    std::printf(
        "prepared %s: %s training images in %d shard(s), %s validation, %s test; %d x %d x %d "
        "pixels, %zu labels; %.1f s\n",
        cfg.out_dir.c_str(), grouped(static_cast<int64_t>(train)).c_str(), cfg.shards,
        grouped(static_cast<int64_t>(valid)).c_str(), grouped(static_cast<int64_t>(test)).c_str(),
        h.image_height, h.image_width, h.image_channels, h.label_names.size(),
        seconds_since(start));
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace mpiformer::prepare
