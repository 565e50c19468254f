// Model's classifier head: label targets uploaded, the pooled scores, their
// loss and backward, and the scores for the host (images reach the stack
// through src/model/image_patches.cpp).
#include <stdexcept>
#include <string>
#include <vector>

#include "src/model/model_impl.h"

namespace mpiformer {

void Model::Impl::upload_labels(const Batch& batch) {
  const int B = batch.decoder.batch(), K = config.num_labels;
  if (config.loss == ClassifyLoss::kSoftmax) {
    if (static_cast<int>(batch.targets.size()) != B)
      throw std::runtime_error("classifier batch has " + std::to_string(batch.targets.size()) +
                               " labels for " + std::to_string(B) + " sequences");
    for (int32_t t : batch.targets)
      if (t < 0 || t >= K)
        throw std::runtime_error("label " + std::to_string(t) + " outside [0, " +
                                 std::to_string(K) + ")");
    ops.device().upload(targets, batch.targets.data(), batch.targets.size() * sizeof(int32_t));
    return;
  }
  if (batch.label_targets.size() != static_cast<size_t>(B) * K)
    throw std::runtime_error("classifier batch has " + std::to_string(batch.label_targets.size()) +
                             " label targets for " + std::to_string(B) + " sequences of " +
                             std::to_string(K) + " labels");
  ops.device().upload(label_targets, batch.label_targets.data(), batch.label_targets.size() * 4);
}

// Forward to the scores: class_logits (B, K).
void Model::Impl::classify_forward(const Batch& batch, bool training) {
  const int C = config.d_model, K = config.num_labels, B = batch.decoder.batch();
  upload_patches(batch);
  const Act h = forward(batch, training);  // (N, C)
  ops.pool_forward(pooled, h, dec_seq.rows, C, config.pool);
  ops.matmul_forward(class_logits, pooled, params.weight(class_w), params.weight(class_b), B, C, K);
}

void Model::Impl::run_classify(const Batch& batch, float smoothing, float grad_scale, bool training,
                               GradientListener* listener) {
  const int C = config.d_model, K = config.num_labels, B = batch.decoder.batch();
  check(batch.decoder, "decoder");
  if (B == 0) return;
  upload_labels(batch);
  classify_forward(batch, training);
  LossSums* sums = training ? train_sums : eval_sums;
  if (config.loss == ClassifyLoss::kSoftmax) {
    // Every sequence has a label: no pad id.
    ops.cross_entropy(class_logits, targets, B, K, smoothing, /*pad_id=*/-1, grad_scale, training,
                      sums);
  } else {
    ops.zlpr_loss(class_logits, label_targets, B, K, grad_scale, training, sums,
                  training ? train_counts : eval_counts);
  }
  if (!training) return;
  // class_logits now hold d(scores).
  ops.matmul_backward(dpooled, params.grad(class_w), params.grad(class_b), class_logits, pooled,
                      params.weight(class_w), B, C, K, false);
  if (listener) listener->gradients_final(params.info()[class_w].offset);
  ops.pool_backward(spare, dpooled, dec_seq.rows, C, config.pool);
  main.backward(ctx, scratch, dstream, spare, dec_seq, Act(), Act(), Ragged{}, listener);
  if (listener) listener->gradients_final(0);
}

// scores: host (B, K)
void Model::Impl::classify_scores(const Batch& batch, float* scores) {
  const int K = config.num_labels, B = batch.decoder.batch();
  check(batch.decoder, "decoder");
  if (B == 0) return;
  classify_forward(batch, /*training=*/false);
  std::vector<unsigned char> stored(static_cast<size_t>(B) * K * dtype_bytes(class_logits.dtype));
  ops.device().copy_to_host(stored.data(), class_logits.data, stored.size());
  widen(scores, stored.data(), class_logits.dtype, static_cast<size_t>(B) * K);
}

void Model::classify_scores(const Batch& batch, float* scores) {
  impl_->classify_scores(batch, scores);
}

std::vector<int64_t> Model::take_label_counts(bool train) {
  return impl_->take_counts(train ? impl_->train_counts : impl_->eval_counts);
}

}  // namespace mpiformer
