#include "src/train/shard_config.h"

#include <filesystem>
#include <utility>
#include <vector>

#include "src/core/error.h"
#include "src/data/shard_check.h"

namespace mpiformer {

namespace {

// A field the flags leave open (0) takes the shards' value, named in `taken`.
void take_open(int* field, int shard_value, const std::string& name,
               std::vector<std::string>* taken) {
  if (*field != 0) return;
  *field = shard_value;
  taken->push_back(name);
}

std::string joined(const std::vector<std::string>& parts) {
  std::string out;
  for (const std::string& part : parts) out += (out.empty() ? "" : ", ") + part;
  return out;
}

}  // namespace

std::string reconcile_with_shards(const ShardHeader& header, const std::string& dir,
                                  ModelConfig* model) {
  check_shard_kind(header, dir, *model);  // before any field: the kind says which apply
  std::vector<std::string> taken;
  take_open(&model->vocab, header.vocab_size, "vocab " + std::to_string(header.vocab_size), &taken);
  model->special = header.special;
  taken.push_back("special ids");
  if (model->kind == ModelKind::kClassify) {
    const int K = static_cast<int>(header.label_names.size());
    take_open(&model->num_labels, K, std::to_string(K) + " labels", &taken);
  }
  if (model->kind == ModelKind::kClassify && header.kind == "image") {
    const std::string side = std::to_string(header.image_height) + " x " +
                             std::to_string(header.image_width) + " x " +
                             std::to_string(header.image_channels);
    bool any = false;
    for (auto [field, value] : {std::pair{&model->image_height, header.image_height},
                                std::pair{&model->image_width, header.image_width},
                                std::pair{&model->image_channels, header.image_channels}}) {
      if (*field != 0) continue;
      *field = value;
      any = true;
    }
    if (any) taken.push_back("images " + side);
  }
  check_model_against_shards(header, dir, *model);
  return joined(taken);
}

std::string resolve_data_config(TrainConfig* cfg) {
  if (cfg->data_dir.empty()) return "";
  const std::string& dir = cfg->data_dir;
  if (!std::filesystem::is_directory(dir)) usage_error("--data", dir + " is not a directory");
  const std::vector<std::string> train = list_shards(dir, "train");
  if (train.empty()) usage_error("--data", dir + " holds no train-*.h5 shards");
  try {
    return reconcile_with_shards(read_shard_header(train.front()), dir, &cfg->model);
  } catch (const ShardError& e) {
    usage_error("--data", e.what());
  } catch (const UsageError& e) {
    // The kind came from a preset, not from a --model the user wrote.
    const std::string what = e.what();
    if (cfg->arch.empty() || what.rfind("--model:", 0) != 0) throw;
    throw UsageError(what + " (--arch " + cfg->arch + " sets --model " +
                     to_string(cfg->model.kind) + "; choose a preset of the shards' kind)");
  }
}

}  // namespace mpiformer
