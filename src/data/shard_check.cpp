#include "src/data/shard_check.h"

#include "src/core/error.h"

namespace mpiformer {

namespace {

// A field the shards fix, as the model has it: "--vocab: the shards in DIR
// have vocabulary 8000; got 500" where they differ.
void require_field(const char* flag, int model_value, int shard_value, const std::string& what) {
  if (model_value != shard_value) {
    usage_error(flag, what + std::to_string(shard_value) + "; got " + std::to_string(model_value));
  }
}

// An image classifier's image shape, patch and --max-len against the shards.
void check_images(const ShardHeader& header, const std::string& dir, const ModelConfig& model) {
  const std::string images = "the images in " + dir + " have ";
  require_field("--image-height", model.image_height, header.image_height, images);
  require_field("--image-width", model.image_width, header.image_width, images);
  require_field("--image-channels", model.image_channels, header.image_channels, images);
  const int P = model.patch;
  if (model.image_height % P != 0 || model.image_width % P != 0) {
    usage_error("--patch", std::to_string(P) + " does not divide the " +
                               std::to_string(model.image_height) + " x " +
                               std::to_string(model.image_width) + " images in " + dir);
  }
  if (model.image_rows() > model.max_len) {
    usage_error("--max-len", "must be at least " + std::to_string(model.image_rows()) +
                                 ", the rows of one image (its patches" +
                                 (model.pool == PoolKind::kCls ? " and the CLS row" : "") +
                                 "); got " + std::to_string(model.max_len));
  }
}

}  // namespace

void check_same_set(const ShardHeader& header, const std::string& file, const ShardHeader& first,
                    const std::string& first_file) {
  if (header.kind != first.kind) {
    throw ShardError(file + ": kind " + header.kind + " differs from " + first.kind + " in " +
                     first_file);
  }
  if (header.vocab_size != first.vocab_size) {
    throw ShardError(file + ": vocabulary " + std::to_string(header.vocab_size) + " differs from " +
                     std::to_string(first.vocab_size) + " in " + first_file);
  }
  if (header.special != first.special) {
    throw ShardError(file + ": special ids differ from " + first_file);
  }
  if (header.tokenizer != first.tokenizer) {
    throw ShardError(file + ": tokenizer differs from " + first_file);
  }
}

void check_shard_kind(const ShardHeader& header, const std::string& dir, const ModelConfig& model) {
  const bool classify = model.kind == ModelKind::kClassify;
  const char* needed = model.kind == ModelKind::kSeq2seq ? "seq2seq"
                       : !classify                       ? "lm"
                       : model.patch > 0                 ? "image"
                                                         : "classify";
  if (classify && header.kind == "image" && model.patch == 0) {
    usage_error("--patch", "required for the image shards in " + dir +
                               ": the side of the square patches each image is cut into");
  }
  if (header.kind != needed) {
    usage_error("--model", std::string(to_string(model.kind)) + " reads " + needed +
                               " shards; the shards in " + dir + " are " + header.kind);
  }
}

void check_model_against_shards(const ShardHeader& header, const std::string& dir,
                                const ModelConfig& model) {
  check_shard_kind(header, dir, model);
  require_field("--vocab", model.vocab, header.vocab_size,
                "the shards in " + dir + " have vocabulary ");
  if (model.special != header.special) {
    usage_error("--data", "the special ids of the model differ from the shards' in " + dir);
  }
  if (model.kind != ModelKind::kClassify) return;
  const int K = static_cast<int>(header.label_names.size());
  if (model.num_labels != K) {
    usage_error("--num-labels", "the shards in " + dir + " have " + std::to_string(K) +
                                    " labels; got " + std::to_string(model.num_labels));
  }
  if (model.loss == ClassifyLoss::kSoftmax && K < 2) {
    usage_error("--loss", "softmax needs at least 2 labels; the shards in " + dir + " have " +
                              std::to_string(K) + " (use --loss zlpr)");
  }
  if (header.kind == "image") check_images(header, dir, model);
}

}  // namespace mpiformer
