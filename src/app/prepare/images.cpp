// prepare --kind image (images.h): reading and checking the images and
// labels on rank 0, cutting the held-out images from the end of the set,
// and writing the shards into the output directory all or nothing.
#include "src/app/prepare/images.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "src/app/prepare/corpus.h"
#include "src/app/prepare/inputs.h"
#include "src/app/prepare/output.h"
#include "src/app/prepare/progress.h"
#include "src/core/error.h"
#include "src/io/array_file.h"
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

ImageSet read_image_set(const std::string& path) {
  const auto arrays =
      read_arrays(path, {{"images"}, {"labels"}, {"label_names", /*required=*/false}});
  const ArrayData& images = arrays[0].second;
  const ArrayData& labels = arrays[1].second;
  if (images.kind != 'u' || images.itemsize != 1) {
    usage_error("--input", path + ": 'images' must hold uint8 pixels; got " +
                               std::string(1, images.kind) + std::to_string(images.itemsize));
  }
  if (images.shape.size() != 3 && images.shape.size() != 4) {
    usage_error("--input", path + ": 'images' must be (N, H, W) or (N, H, W, C); it has " +
                               std::to_string(images.shape.size()) + " dimensions");
  }
  ImageSet set;
  ShardHeader& h = set.header;
  h.kind = "image";
  h.vocab_size = SpecialTokens::kCount;  // no tokens: only the reserved ids
  h.image_height = static_cast<int>(images.shape[1]);
  h.image_width = static_cast<int>(images.shape[2]);
  h.image_channels = images.shape.size() == 4 ? static_cast<int>(images.shape[3]) : 1;
  const int64_t n = images.shape[0];
  if (labels.shape.size() != 1 || labels.shape[0] != n) {
    usage_error("--input", path + ": 'labels' must be (N) with N = " + std::to_string(n) +
                               " (one integer label per image)");
  }
  int64_t most = -1;
  for (int64_t label : labels.integers(path + ": 'labels'")) {
    if (label < 0)
      usage_error("--input", path + ": label " + std::to_string(label) + " is negative");
    most = std::max(most, label);
    set.labels.push_back(static_cast<int32_t>(label));
  }
  if (arrays.size() > 2) {
    h.label_names = arrays[2].second.strings(path + ": 'label_names'");
    if (static_cast<int64_t>(h.label_names.size()) <= most) {
      usage_error("--input", path + ": label " + std::to_string(most) + " has no name in the " +
                                 std::to_string(h.label_names.size()) + " 'label_names'");
    }
  } else {
    for (int64_t k = 0; k <= most; ++k) h.label_names.push_back(std::to_string(k));
  }
  set.pixels = images.bytes;
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
  if (agree_on_root(
          comm, [&] { check_image_inputs(cfg); }, Faults::kOfInput, "prepare") != 0) {
    return kExitUsage;
  }
  ImageSet set;
  size_t valid = 0, test = 0, train = 0;
  if (agree_on_root(
          comm,
          [&] {
            set = read_image_set(cfg.input);
            const size_t most = set.count() / kHoldOut;
            valid = std::min(static_cast<size_t>(cfg.valid_lines), most);
            test = std::min(static_cast<size_t>(cfg.test_lines), most);
            train = set.count() - valid - test;
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
          Faults::kOfInput, "prepare") != 0) {
    return kExitUsage;
  }
  OutputDir out(cfg.out_dir);
  const bool ok = agreed(comm, [&] {
    if (!comm.is_root()) return;
    out.create();
    const std::string refused = out.lock();
    if (!refused.empty()) throw std::runtime_error(refused);
    out.remove_abandoned_temporaries();
    const std::string origin = fs::path(cfg.input).filename().string();
    for (int64_t k = 0; k < cfg.shards; ++k) {
      out.write_shard(
          shard_name(kTrainPrefix, k),
          image_shard(set, static_cast<size_t>(k) * train / cfg.shards,
                      static_cast<size_t>(k + 1) * train / cfg.shards, kTrainPrefix, origin));
    }
    out.write_shard(shard_name(kValidPrefix, 0),
                    image_shard(set, train, train + valid, kValidPrefix, origin));
    if (test > 0) {
      out.write_shard(shard_name(kTestPrefix, 0),
                      image_shard(set, train + valid, train + valid + test, kTestPrefix, origin));
    }
    out.commit();
  });
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
