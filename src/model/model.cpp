#include "src/model/model.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "src/model/model_impl.h"

namespace mpiformer {

void Model::Impl::build() {
  const int C = config.d_model, V = config.vocab, L = config.max_len;
  const int N = capacity.max_tokens;
  const bool learned = config.positions == PositionKind::kLearned;
  const bool classify = config.kind == ModelKind::kClassify;
  if (config.images()) {
    // Pixels and the one-hot position in one GEMM (PatchEmbedding): the
    // positions are learned, as in ViT.
    params.add("patch_embed.weight", {C, config.patch_features()}, true, Init::kNormal, 0.02f);
    params.add("patch_embed.bias", {C}, false, Init::kZeros);
  } else {
    token_table = params.add("embed.tokens", {V, C}, false, Init::kNormal,
                             learned ? 0.02f : 1.0f / std::sqrt(static_cast<float>(C)));
    if (learned) {
      params.add("embed.positions", {L, C}, false, Init::kNormal, 0.02f);
    } else {
      sinusoids = arena.acts(static_cast<size_t>(L) * C);  // filled by init_tables
    }
  }

  build_stacks();
  dec_seq.init(arena, N);
  targets = arena.ints(N);
  if (capacity.cache_rows > 0) {
    // Every list is at most max-len long.
    const size_t listed = static_cast<size_t>(N) * capacity.max_len;
    for (Sublayer& sublayer : main.sublayers) sublayer.init_cache(arena, capacity.cache_rows, C);
    step_cache_rows = arena.ints(N);
    memory_slots = arena.ints(N);
    self_starts = arena.ints(static_cast<size_t>(N) + 1);
    self_rows = arena.ints(listed);
    if (has_encoder) {
      source_starts = arena.ints(static_cast<size_t>(N) + 1);
      source_rows = arena.ints(listed);
    }
  }

  if (config.kind == ModelKind::kMlm) {
    mlm_dense_w = params.add("mlm_head.dense.weight", {C, C}, true, Init::kNormal, 0.02f);
    mlm_dense_b = params.add("mlm_head.dense.bias", {C}, false, Init::kZeros);
    mlm_norm.init(ctx, arena, "mlm_head.norm", N);
    mlm_dense = arena.acts(static_cast<size_t>(N) * C);
    mlm_act = arena.acts(static_cast<size_t>(N) * C);
  }
  if (classify) {
    build_classifier();
  } else {
    output_weight = config.tied_embeddings
                        ? token_table
                        : params.add("output.weight", {V, C}, true, Init::kNormal, 0.02f);
    if (config.output_bias) output_bias = params.add("output.bias", {V}, false, Init::kZeros);
  }

  dstream = arena.acts(static_cast<size_t>(N) * C);
  spare = arena.acts(static_cast<size_t>(N) * C);
  size_t logits_bytes = 0;
  if (!classify) {
    // The vocabulary projection runs in row chunks so logits never need
    // (N, V) elements: as many as the backend likes at a time.
    logits_stride = (V + 63) / 64 * 64;
    const size_t chunk = ops.device().logits_chunk_elements() / static_cast<size_t>(logits_stride);
    chunk_rows = static_cast<int>(std::clamp<size_t>(chunk, 16, std::max(N, 16)));
    logits_bytes = static_cast<size_t>(chunk_rows) * logits_stride * dtype_bytes(compute_dtype);
  }
  // The head's logits lie over the sub-layers' scratch: the head runs after
  // the forward, which leaves nothing there, and its chunks are done (the
  // gradient taken, or decoding's rows copied out) before the stack's
  // backward or the next step's forward writes there again.
  const int memory_rows = has_encoder ? N : 0;
  const bool activation = ctx.recompute_activation;
  void* shared =
      arena.bytes(std::max(logits_bytes, BlockScratch::bytes(compute_dtype, N, memory_rows, C,
                                                             config.d_ff, activation)));
  scratch.init(shared, compute_dtype, N, memory_rows, C, config.d_ff, activation);
  // The sub-layers' input norms in forward, where their outputs are not
  // kept: du is free until backward (blocks.h, BlockContext).
  if (Sublayer::norm_in_scratch(ctx)) {
    for (Stack* stack : {&encoder, &main})
      for (Sublayer& sublayer : stack->sublayers) sublayer.norm().out = scratch.du;
  }
  if (!classify) logits = Act(shared, compute_dtype);
  train_sums = static_cast<LossSums*>(arena.bytes(sizeof(LossSums)));
  eval_sums = static_cast<LossSums*>(arena.bytes(sizeof(LossSums)));
  // Two micro-batches of uploads in flight: both sides and the targets
  // (a classifier's label targets and image patches too).
  size_t batch_upload = 2 * DeviceSequences::upload_bytes(N) + size_t(N) * 4;
  if (classify) batch_upload += size_t(capacity.sequences()) * config.num_labels * 4;
  if (config.images()) {
    batch_upload += size_t(N) * config.patch_features() * dtype_bytes(compute_dtype);
  }
  upload_bytes = 2 * batch_upload;
  if (!measuring) ops.device().reserve_uploads(upload_bytes);
}

// The head of --model classify, registered after the stack so that its
// gradients are final first.
void Model::Impl::build_classifier() {
  const int C = config.d_model, K = config.num_labels, B = capacity.sequences();
  if (K <= 0) throw std::invalid_argument("a classifier needs --num-labels > 0");
  class_w = params.add("classifier.weight", {K, C}, true, Init::kNormal, 0.02f);
  class_b = params.add("classifier.bias", {K}, false, Init::kZeros);
  // One row per sequence: with many labels, (B, K) is the head's largest buffer.
  pooled = arena.acts(static_cast<size_t>(B) * C);
  dpooled = arena.acts(static_cast<size_t>(B) * C);
  class_logits = arena.acts(static_cast<size_t>(B) * K);
  if (config.loss == ClassifyLoss::kZlpr) {
    label_targets = arena.floats(static_cast<size_t>(B) * K);
    train_counts = static_cast<int64_t*>(arena.bytes(3 * sizeof(int64_t) * K));
    eval_counts = static_cast<int64_t*>(arena.bytes(3 * sizeof(int64_t) * K));
  }
}

// The fixed sinusoid positions table, (L, C) in the compute precision.
void Model::Impl::init_tables() {
  if (!sinusoids) return;
  const int C = config.d_model, L = config.max_len;
  std::vector<float> table(static_cast<size_t>(L) * C);  // host (L, C)
  sinusoid_table(table.data(), L, C);
  std::vector<unsigned char> stored(table.size() * dtype_bytes(sinusoids.dtype));
  narrow(stored.data(), sinusoids.dtype, table.data(), table.size());
  ops.device().copy_to_device(sinusoids.data, stored.data(), stored.size());
}

void Model::Impl::check(const PackedSequences& s, const char* side) const {
  if (s.total() > capacity.max_tokens || s.max_len() > capacity.max_len ||
      s.batch() > capacity.sequences())
    throw std::runtime_error(std::string("batch ") + side + " side (" + std::to_string(s.batch()) +
                             " sequences, " + std::to_string(s.total()) + " tokens, longest " +
                             std::to_string(s.max_len()) + ") exceeds the model capacity (" +
                             std::to_string(capacity.sequences()) + " sequences, " +
                             std::to_string(capacity.max_tokens) + " tokens, length " +
                             std::to_string(capacity.max_len) + ")");
  for (int32_t id : s.tokens)
    if (id < 0 || id >= config.vocab)
      throw std::runtime_error(std::string("batch ") + side + " token id " + std::to_string(id) +
                               " outside the vocabulary [0, " + std::to_string(config.vocab) + ")");
}

// The forward pass up to the main stack's output; the encoder output
// stays in memory_ / memory_rows_ for the backward pass.
// returns: backend (decoder.total(), C)
Act Model::Impl::forward(const Batch& batch, bool training) {
  check(batch.decoder, "decoder");
  ctx.training = training;
  dec_seq.upload(ops, batch.decoder);
  memory_ = Act();
  memory_rows_ = Ragged{};
  if (has_encoder) {
    check(batch.encoder, "encoder");
    if (batch.encoder.batch() != batch.decoder.batch())
      throw std::runtime_error("seq2seq batch with different source and target counts");
    enc_seq.upload(ops, batch.encoder);
    memory_ = encoder.forward(ctx, scratch, enc_seq, Act(), Ragged{});
    memory_rows_ = enc_seq.rows;
  }
  return main.forward(ctx, scratch, dec_seq, memory_, memory_rows_);
}

void Model::Impl::run(const Batch& batch, float smoothing, float grad_scale, bool training,
                      GradientListener* listener) {
  if (config.kind == ModelKind::kClassify) {
    run_classify(batch, smoothing, grad_scale, training, listener);
    return;
  }
  const int C = config.d_model;
  check(batch.decoder, "decoder");
  if (static_cast<int>(batch.targets.size()) != batch.decoder.total())
    throw std::runtime_error("batch has " + std::to_string(batch.targets.size()) + " targets for " +
                             std::to_string(batch.decoder.total()) + " decoder tokens");
  for (int32_t t : batch.targets)
    if (t < 0 || t >= config.vocab)
      throw std::runtime_error("batch target id " + std::to_string(t) + " outside the vocabulary");
  if (batch.decoder.total() == 0) return;
  ops.device().upload(targets, batch.targets.data(), batch.targets.size() * sizeof(int32_t));

  // ---- forward ----
  Act h = forward(batch, training);
  const int N = dec_seq.rows.total;
  const Act memory = memory_;
  const Ragged memory_rows = memory_rows_;
  if (config.kind == ModelKind::kMlm) h = mlm_transform_forward(h, N);

  // ---- loss, fused with the head's backward ----
  head(h, spare, N, smoothing, grad_scale, training, training ? train_sums : eval_sums);
  if (!training) return;
  // The output bias, and the output weight unless it is the token table.
  const int head_first = config.tied_embeddings ? output_bias : output_weight;
  if (listener && head_first >= 0) listener->gradients_final(params.info()[head_first].offset);

  // ---- backward ----  (d(main.out) is in `spare`)
  if (config.kind == ModelKind::kMlm) mlm_transform_backward(N, listener);
  if (has_encoder)
    ops.device().fill_zero(dmemory.data,
                           static_cast<size_t>(memory_rows.total) * C * dtype_bytes(dmemory.dtype));
  main.backward(ctx, scratch, dstream, spare, dec_seq, memory, dmemory, memory_rows, listener);
  if (has_encoder) {
    // d(encoder output) becomes the encoder's incoming gradient; the three
    // (N, C) buffers only trade places.
    std::swap(spare, dmemory);
    encoder.backward(ctx, scratch, dstream, spare, enc_seq, Act(), Act(), Ragged{}, listener);
  }
  if (listener) listener->gradients_final(0);
}

std::vector<int64_t> Model::Impl::take_counts(int64_t* counts) {
  if (!counts) return {};
  std::vector<int64_t> host(3 * static_cast<size_t>(config.num_labels));
  ops.device().copy_to_host(host.data(), counts, host.size() * sizeof(int64_t));
  ops.device().fill_zero(counts, host.size() * sizeof(int64_t));
  return host;
}

LossSums Model::Impl::take(LossSums* sums) {
  LossSums host;
  ops.device().copy_to_host(&host, sums, sizeof host);
  ops.device().fill_zero(sums, sizeof host);
  return host;
}

Model::Model(Ops& ops, const ModelConfig& config, const ModelCapacity& capacity, DType compute)
    : config_(config), capacity_(capacity), params_(std::make_unique<ParameterSet>(ops, compute)) {
  if (capacity.max_tokens <= 0 || capacity.max_len <= 0 || capacity.max_len > config.max_len)
    throw std::invalid_argument("model capacity must be positive and within max_len");
  impl_ = std::make_unique<Impl>(ops, config_, capacity_, *params_, compute);
}

Model::~Model() = default;

void Model::init_parameters(uint64_t seed) {
  params_->allocate(seed);
  impl_->init_tables();
}

std::vector<AttentionCase> Model::attention_cases(
    const ModelConfig& config, const std::vector<BatchSource::BucketBound>& bounds) {
  const int C = config.d_model;
  AttentionConfig attention;
  attention.heads = config.heads;
  attention.head_dim = C / std::max(config.heads, 1);
  attention.scale = config.attention_scale;
  attention.ref_len = config.attention_ref_len;
  // Self-attention reads a fused QKV tensor (rows 3C); cross-attention
  // reads q (rows C) and a fused KV tensor of the encoder's memory (2C), as
  // Sublayer's calls do.
  const auto self = [&](bool causal, const SideBound& side) {
    AttentionCase c{attention, 3 * C, 3 * C, side, side};
    c.cfg.causal = causal;
    return c;
  };
  std::vector<AttentionCase> cases;
  for (const BatchSource::BucketBound& b : bounds) {
    switch (config.kind) {
      case ModelKind::kLm:
        cases.push_back(self(true, b.decoder));
        break;
      case ModelKind::kMlm:
      case ModelKind::kClassify:
        cases.push_back(self(false, b.decoder));
        break;
      case ModelKind::kSeq2seq:
        cases.push_back(self(false, b.encoder));
        cases.push_back(self(true, b.decoder));
        cases.push_back(AttentionCase{attention, C, 2 * C, b.decoder, b.encoder});
        break;
    }
  }
  return cases;
}

ModelMemory Model::measure(Ops& ops, const ModelConfig& config, const ModelCapacity& capacity,
                           DType compute) {
  if (capacity.max_tokens <= 0 || capacity.max_len <= 0 || capacity.max_len > config.max_len)
    throw std::invalid_argument("model capacity must be positive and within max_len");
  ParameterSet params(ops, compute);
  const Impl impl(ops, config, capacity, params, compute, /*measure=*/true);
  ModelMemory m;
  m.parameters = params.count();
  m.activation_bytes = impl.arena.total_bytes();
  // Decoding: and what the backend keeps of the weights while it decodes.
  if (capacity.cache_rows > 0) m.activation_bytes += ops.batch_invariant_bytes(params.count());
  m.upload_bytes = impl.upload_bytes;
  for (const ParamInfo& info : params.info())
    m.largest_tensor = std::max(m.largest_tensor, info.size);
  return m;
}

void Model::forward_backward(const Batch& batch, float label_smoothing, float grad_scale,
                             const PassId& pass, GradientListener* listener) {
  impl_->ctx.dropout_seed = pass.seed;
  impl_->ctx.dropout_pass =
      (static_cast<uint64_t>(pass.step) << 16) ^ static_cast<uint64_t>(pass.micro);
  impl_->run(batch, label_smoothing, grad_scale, true, listener);
}

void Model::evaluate(const Batch& batch, float label_smoothing) {
  impl_->run(batch, label_smoothing, 1.0f, false, nullptr);
}

LossSums Model::take_train_sums() {
  return impl_->take(impl_->train_sums);
}

LossSums Model::take_eval_sums() {
  return impl_->take(impl_->eval_sums);
}

int64_t Model::flop_parameters() const {
  int64_t n = 0;
  for (const ParamInfo& info : params_->info())
    if (info.name.rfind("embed.", 0) != 0) n += static_cast<int64_t>(info.size);
  // a tied output projection is the token table: count it once, as the projection
  if (config_.tied_embeddings && config_.kind != ModelKind::kClassify)
    n += static_cast<int64_t>(config_.vocab) * config_.d_model;
  return n;
}

double Model::training_flops(const Batch& batch) const {
  int64_t encoder_params = 0;
  for (const ParamInfo& info : params_->info())
    if (info.name.rfind("encoder.", 0) == 0) encoder_params += static_cast<int64_t>(info.size);
  const bool seq2seq = config_.kind == ModelKind::kSeq2seq;
  if (!seq2seq) encoder_params = 0;  // mlm: its encoder is the main stack
  const double d = config_.d_model;
  auto attention = [&](const PackedSequences& s, int layers) {
    double f = 0.0;
    for (int b = 0; b < s.batch(); ++b) f += 12.0 * layers * d * s.length(b) * s.length(b);
    return f;
  };
  const int main_layers = seq2seq ? config_.dec_layers : config_.layers;
  double flops =
      6.0 * static_cast<double>(flop_parameters() - encoder_params) * batch.decoder.total() +
      attention(batch.decoder, main_layers);
  if (seq2seq)
    flops += 6.0 * static_cast<double>(encoder_params) * batch.encoder.total() +
             attention(batch.encoder, config_.enc_layers);
  return flops;
}

}  // namespace mpiformer
