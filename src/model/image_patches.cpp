// Images into a model: the batch's patch rows uploaded, and the patch
// embedding (one GEMM of pixels and one-hot position) that replaces the
// token embedding of an image classifier's stack.
#include <stdexcept>
#include <string>

#include "src/model/model_impl.h"

namespace mpiformer {

// The batch's image rows, in the compute precision, into the stack.
void Model::Impl::upload_patches(const Batch& batch) {
  if (!config.images()) return;
  const size_t n = static_cast<size_t>(batch.decoder.total()) * config.patch_features();
  if (batch.patches.size() != n) {
    throw std::runtime_error("image batch has " + std::to_string(batch.patches.size()) +
                             " patch values for " + std::to_string(batch.decoder.total()) +
                             " rows of " + std::to_string(config.patch_features()));
  }
  patch_staging.resize(n * dtype_bytes(compute_dtype));
  narrow(patch_staging.data(), compute_dtype, batch.patches.data(), n);
  ops.device().upload(main.patches.data, patch_staging.data(), patch_staging.size());
}

void PatchEmbedding::init(BlockContext& ctx, ActivationArena& arena, int rows, int weight_index,
                          int bias_index, uint64_t site) {
  weight_ = weight_index;
  bias_ = bias_index;
  site_ = site;
  out_ = arena.acts(static_cast<size_t>(rows) * ctx.config->d_model);
}

Act PatchEmbedding::forward(BlockContext& ctx, Act patches, int N) {
  Ops& ops = *ctx.ops;
  ParameterSet& p = *ctx.params;
  const int C = ctx.config->d_model, F = ctx.config->patch_features();
  ops.matmul_forward(out_, patches, p.weight(weight_), p.weight(bias_), N, F, C);
  const Dropout d = dropout_at(ctx, site_);
  if (d.p > 0.0f) ops.dropout(out_, out_, static_cast<size_t>(N) * C, d);
  return out_;
}

void PatchEmbedding::backward(BlockContext& ctx, Act dx, Act patches, int N) {
  Ops& ops = *ctx.ops;
  ParameterSet& p = *ctx.params;
  const int C = ctx.config->d_model, F = ctx.config->patch_features();
  const Dropout d = dropout_at(ctx, site_);
  if (d.p > 0.0f) ops.dropout(dx, dx, static_cast<size_t>(N) * C, d);
  ops.matmul_backward(Act(), p.grad(weight_), p.grad(bias_), dx, patches, p.weight(weight_), N, F,
                      C, false);
}

}  // namespace mpiformer
