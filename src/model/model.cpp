#include "src/model/model.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "src/model/blocks.h"

namespace mpiformer {

namespace {

// A fresh version for each upload of batch offsets (Ragged::version).
uint64_t next_batch_version() {
  static std::atomic<uint64_t> counter{0};
  return ++counter;
}

// Rows grouped by a key (ids or positions) for the deterministic embedding
// backward: built on the host, uploaded with the batch.
struct DeviceGroups {
  int32_t* keys = nullptr;    // (G)
  int32_t* starts = nullptr;  // (G+1)
  int32_t* rows = nullptr;    // (N)
  std::vector<int32_t> host_keys, host_starts, host_rows;
  RowGroups view;

  void init(ActivationArena& arena, int max_tokens) {
    keys = arena.ints(max_tokens);
    starts = arena.ints(static_cast<size_t>(max_tokens) + 1);
    rows = arena.ints(max_tokens);
  }
  void upload(Ops& ops, const std::vector<int32_t>& by) {
    const int N = static_cast<int>(by.size());
    const int groups = group_rows_by_key(by.data(), N, &host_keys, &host_starts, &host_rows);
    ops.device().upload(keys, host_keys.data(), groups * sizeof(int32_t));
    ops.device().upload(starts, host_starts.data(), (groups + 1) * sizeof(int32_t));
    ops.device().upload(rows, host_rows.data(), N * sizeof(int32_t));
    view = RowGroups{keys, starts, rows, groups};
  }
  // Bytes one upload may stage.
  static size_t upload_bytes(int max_tokens) { return (3 * size_t(max_tokens) + 1) * 4; }
};

// Device copies of one side of a batch: ids, positions, offsets, and the
// rows grouped by id and by position. Uploaded once per micro-batch,
// stream-ordered.
struct DeviceSequences {
  int32_t* ids = nullptr;        // (N)
  int32_t* positions = nullptr;  // (N)
  int32_t* offsets = nullptr;    // (B+1)
  DeviceGroups by_id, by_pos;
  Ragged rows;

  void init(ActivationArena& arena, int max_tokens) {
    ids = arena.ints(max_tokens);
    positions = arena.ints(max_tokens);
    offsets = arena.ints(static_cast<size_t>(max_tokens) + 1);
    by_id.init(arena, max_tokens);
    by_pos.init(arena, max_tokens);
  }
  void upload(Ops& ops, const PackedSequences& s) {
    const size_t n = s.tokens.size() * sizeof(int32_t);
    ops.device().upload(ids, s.tokens.data(), n);
    ops.device().upload(positions, s.positions.data(), n);
    ops.device().upload(offsets, s.offsets.data(), s.offsets.size() * sizeof(int32_t));
    by_id.upload(ops, s.tokens);
    by_pos.upload(ops, s.positions);
    rows.host_offsets = s.offsets.data();
    rows.device_offsets = offsets;
    rows.batch = s.batch();
    rows.total = s.total();
    rows.max_len = s.max_len();
    rows.version = next_batch_version();
  }
  static size_t upload_bytes(int max_tokens) {
    return (3 * size_t(max_tokens) + 1) * 4 + 2 * DeviceGroups::upload_bytes(max_tokens);
  }
};

// A stack of residual sub-layers over one embedded sequence side, with the
// final layer norm of pre-LN models. A layer is per_layer sub-layers in a
// row (self-attention, cross-attention in a decoder with memory, MLP).
struct Stack {
  Embedding embedding;
  PatchEmbedding patch_embedding;  // images (classify --patch): instead of `embedding`
  bool images = false;
  Act patches;  // images: (N, F) the batch's patch rows
  std::vector<Sublayer> sublayers;
  std::vector<Act> inputs;  // input stream of each sub-layer
  LayerNorm final_norm;
  bool has_final_norm = false;
  Act last;  // stream after the last sub-layer (N, C)
  Act out;   // the stack's output (N, C)
  int per_layer = 1;
  // --recompute layer: the layers take turns in one set of activation
  // buffers; each keeps its input (the previous layer's output, a buffer of
  // its own), and backward reruns a layer's forward before its backward.
  bool recompute = false;

  // The layer norm that follows sub-layer i's residual add: its own in
  // post-LN models; in pre-LN models the next sub-layer's, or the final one.
  LayerNorm& norm_after(BlockContext& ctx, size_t i) {
    if (!ctx.config->pre_norm) return sublayers[i].norm();
    return i + 1 < sublayers.size() ? sublayers[i + 1].norm() : final_norm;
  }

  Act forward(BlockContext& ctx, BlockScratch& scratch, const DeviceSequences& seq, Act memory,
              const Ragged& memory_rows) {
    const int N = seq.rows.total;
    Act x = images ? patch_embedding.forward(ctx, patches, N)
                   : embedding.forward(ctx, seq.ids, seq.positions, N);
    return run_sublayers(ctx, scratch, x, N, [&](Sublayer& sublayer, Act u) {
      sublayer.inner_forward(ctx, scratch, u, seq.rows, memory, memory_rows);
    });
  }

  // Decoding: the R new rows of a step (ids, pos: backend (R)) through the
  // stack, each sub-layer's decode_forward reading and filling the cache.
  Act decode_forward(BlockContext& ctx, BlockScratch& scratch, const int32_t* ids,
                     const int32_t* pos, int R, const int32_t* cache_rows,
                     const KeyLists& self_keys, const KeyLists& cross_keys) {
    Act x = embedding.forward(ctx, ids, pos, R);
    return run_sublayers(ctx, scratch, x, R, [&](Sublayer& sublayer, Act u) {
      sublayer.decode_forward(ctx, scratch, u, R, cache_rows, self_keys, cross_keys);
    });
  }

  // The sub-layers over the embedded rows x (N, C): `inner(sublayer, u)`
  // runs a sub-layer's f on its input u into scratch.y.
  template <typename Inner>
  Act run_sublayers(BlockContext& ctx, BlockScratch& scratch, Act x, int N, Inner&& inner) {
    const bool pre = ctx.config->pre_norm;
    // u: the next sub-layer's input. Each residual add is fused with the
    // layer norm after it, so only the first pre-LN norm runs alone.
    Act u = x;
    if (pre) {
      LayerNorm& first = sublayers.empty() ? final_norm : sublayers[0].norm();
      first.forward(ctx, x, N);
      u = first.out;
    }
    for (size_t i = 0; i < sublayers.size(); ++i) {
      inputs[i] = x;
      inner(sublayers[i], u);
      LayerNorm& next = norm_after(ctx, i);
      const Act sum = sublayers[i].residual_forward(ctx, scratch, x, N, next);
      x = pre ? sum : next.out;
      u = next.out;
    }
    last = x;
    out = has_final_norm ? final_norm.out : x;
    return out;
  }

  // --recompute layer: the forward of the layer whose first sub-layer is
  // `first`, again from its kept input inputs[first], rebuilding in the
  // shared set what its backward reads. The same ops on the same bits with
  // the same dropout masks (a hash of the pass and site, kernels/dropout_mask.h)
  // store the same bits; the loss sums and every other count come from the
  // head, which is not rerun.
  void rerun_layer(BlockContext& ctx, BlockScratch& scratch, const DeviceSequences& seq, Act memory,
                   const Ragged& memory_rows, size_t first) {
    const int N = seq.rows.total;
    const bool pre = ctx.config->pre_norm;
    const size_t end = first + static_cast<size_t>(per_layer);
    Act x = inputs[first];
    Act u = x;
    if (pre) {
      // Forward fused this norm with the previous layer's last residual add;
      // that op normalises the stored sum exactly as layernorm_forward does.
      LayerNorm& norm = sublayers[first].norm();
      norm.forward(ctx, x, N);
      u = norm.out;
    }
    for (size_t i = first; i < end; ++i) {
      sublayers[i].inner_forward(ctx, scratch, u, seq.rows, memory, memory_rows);
      // pre-LN: the last residual add made the next layer's input, which is
      // kept, and the next layer's norm, whose buffers this layer's first
      // norm shares: it is not redone.
      if (pre && i + 1 == end) break;
      LayerNorm& next = norm_after(ctx, i);
      const Act sum = sublayers[i].residual_forward(ctx, scratch, x, N, next);
      x = pre ? sum : next.out;
      u = next.out;
    }
  }

  // dout: (N, C) d(out), in `spare` on entry; the stream buffers are swapped freely.
  // Tells `listener` (may be null) as each block's gradients become final.
  void backward(BlockContext& ctx, BlockScratch& scratch, Act& dstream, Act& spare,
                const DeviceSequences& seq, Act memory, Act dmemory, const Ragged& memory_rows,
                GradientListener* listener) {
    const int N = seq.rows.total;
    const ParameterSet& params = *ctx.params;
    if (has_final_norm) {
      final_norm.backward(ctx, dstream, spare, last, N, false);
      if (listener) listener->gradients_final(params.info()[final_norm.gamma].offset);
    } else {
      std::swap(dstream, spare);
    }
    for (size_t i = sublayers.size(); i-- > 0;) {
      // Entering a layer from its top. The last layer's activations are
      // still in the shared set from the forward pass: nothing ran since.
      if (recompute && (i + 1) % per_layer == 0 && i + 1 < sublayers.size())
        rerun_layer(ctx, scratch, seq, memory, memory_rows, i + 1 - per_layer);
      sublayers[i].backward(ctx, scratch, dstream, spare, inputs[i], seq.rows, memory, dmemory,
                            memory_rows);
      if (listener) listener->gradients_final(sublayers[i].first_offset(params));
    }
    // The embedding tables are shared (tokens with the output projection and
    // the other stack): final only when the whole pass is done.
    if (images) {
      patch_embedding.backward(ctx, dstream, patches, N);
    } else {
      embedding.backward(ctx, dstream, seq.by_id.view, seq.by_pos.view, N);
    }
  }
};

}  // namespace

struct Model::Impl {
  Ops& ops;
  const ModelConfig& config;
  ModelCapacity capacity;
  ParameterSet& params;
  ActivationArena arena;
  BlockContext ctx;
  BlockScratch scratch;

  bool has_encoder = false;
  Stack encoder;  // seq2seq only
  Stack main;     // decoder (lm, seq2seq) or encoder (mlm): produces predictions
  DeviceSequences enc_seq, dec_seq;
  int32_t* targets = nullptr;  // (N)
  // Decoding (capacity.cache_rows > 0): the key lists of a step, the cache
  // rows of its new rows, and the memory rows of decode_sources's rows.
  int32_t* step_cache_rows = nullptr;  // (N)
  int32_t* memory_slots = nullptr;     // (N)
  int32_t* self_starts = nullptr;      // (N+1)
  int32_t* self_rows = nullptr;        // (N * L)
  int32_t* source_starts = nullptr;    // (N+1)
  int32_t* source_rows = nullptr;      // (N * L)
  // host (chunk_rows, logits_stride) of a decoding step, pinned on a GPU
  std::unique_ptr<HostBuffer> logits_staging;

  int token_table = -1;    // (V, C)
  int output_weight = -1;  // (V, C): token_table when tied
  int output_bias = -1;    // (V); -1 with --output-bias false
  // mlm head: h -> act(dense(h)) -> LN
  int mlm_dense_w = -1, mlm_dense_b = -1;
  LayerNorm mlm_norm;
  Act mlm_dense;  // (N, C) pre-activation
  Act mlm_act;    // (N, C)

  // classify head: pool -> (B, C) -> scores (B, K)
  int class_w = -1, class_b = -1;            // (K, C), (K)
  Act pooled;                                // (B, C)
  Act dpooled;                               // (B, C)
  Act class_logits;                          // (B, K)
  float* label_targets = nullptr;            // (B, K) zlpr targets
  int64_t* train_counts = nullptr;           // backend (3K) zlpr per-label TP, FP, FN
  int64_t* eval_counts = nullptr;            // backend (3K)
  std::vector<unsigned char> patch_staging;  // host (N, F) in the compute precision

  Act sinusoids;  // (L, C) fixed positions
  Act dstream;    // (N, C) gradient of the stream being back-propagated
  Act spare;      // (N, C)
  Act dmemory;    // (Nk, C) gradient of the encoder output
  Act logits;     // (chunk_rows, V) rows logits_stride apart
  int chunk_rows = 0;
  int logits_stride = 0;  // V rounded up: aligned rows for the GEMMs
  // Loss sums accumulated on the backend: training and evaluation.
  LossSums* train_sums = nullptr;  // backend (1)
  LossSums* eval_sums = nullptr;   // backend (1)

  size_t upload_bytes = 0;  // staging for uploads in flight
  bool measuring = false;   // Model::measure: nothing is allocated
  DType compute_dtype = DType::kF32;

  // measure: only count the buffers (Model::measure); nothing is allocated.
  Impl(Ops& o, const ModelConfig& c, const ModelCapacity& cap, ParameterSet& p, DType compute,
       bool measure = false)
      : ops(o), config(c), capacity(cap), params(p), arena(o, compute, measure) {
    measuring = measure;
    compute_dtype = compute;
    ctx.ops = &ops;
    ctx.params = &params;
    ctx.config = &config;
    build();
  }

  void build_stack(Stack& stack, const std::string& name, int layers, bool causal, bool cross,
                   int rows, uint64_t site_base) {
    const int per_layer = cross ? 3 : 2;
    // GPT-2: residual projections scaled down by the number of residual adds.
    const float residual_std = 0.02f / std::sqrt(static_cast<float>(per_layer * layers));
    const int positions =
        config.positions == PositionKind::kLearned ? params.find("embed.positions") : -1;
    if (config.images()) {
      stack.images = true;
      stack.patch_embedding.init(ctx, arena, rows, params.find("patch_embed.weight"),
                                 params.find("patch_embed.bias"), site_base);
      stack.patches = arena.acts(static_cast<size_t>(rows) * config.patch_features());
    } else {
      stack.embedding.init(ctx, arena, rows, token_table, positions,
                           positions >= 0 ? Act() : sinusoids, site_base);
    }
    uint64_t site = site_base + 1;
    const int memory_rows = cross ? capacity.max_tokens : 0;
    stack.per_layer = per_layer;
    stack.recompute = capacity.recompute == Recompute::kLayer;
    // --recompute layer: layer 0 allocates the set, the others share it (by
    // address: the vector never grows past its reservation).
    stack.sublayers.reserve(static_cast<size_t>(layers) * per_layer);
    const auto shared = [&](int l, int k) -> const Sublayer* {
      return stack.recompute && l > 0 ? &stack.sublayers[static_cast<size_t>(k)] : nullptr;
    };
    for (int l = 0; l < layers; ++l) {
      const std::string prefix = name + ".layers." + std::to_string(l);
      int k = 0;  // the sub-layer's place in its layer
      stack.sublayers.emplace_back().init(ctx, arena, prefix + ".self_attn",
                                          Sublayer::Kind::kSelfAttention, causal, rows, 0, site++,
                                          residual_std, shared(l, k++));
      if (cross) {
        stack.sublayers.emplace_back().init(ctx, arena, prefix + ".cross_attn",
                                            Sublayer::Kind::kCrossAttention, false, rows,
                                            memory_rows, site++, residual_std, shared(l, k++));
      }
      stack.sublayers.emplace_back().init(ctx, arena, prefix + ".mlp", Sublayer::Kind::kMlp, false,
                                          rows, 0, site++, residual_std, shared(l, k++),
                                          /*own_output=*/true);
    }
    stack.inputs.assign(stack.sublayers.size(), Act());
    stack.has_final_norm = config.pre_norm;
    if (stack.has_final_norm) stack.final_norm.init(ctx, arena, name + ".norm", rows);
  }

  void build() {
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

    switch (config.kind) {
      case ModelKind::kLm:
        build_stack(main, "decoder", config.layers, true, false, N, 1000);
        break;
      case ModelKind::kMlm:
      case ModelKind::kClassify:
        build_stack(main, "encoder", config.layers, false, false, N, 1000);
        break;
      case ModelKind::kSeq2seq:
        has_encoder = true;
        build_stack(encoder, "encoder", config.enc_layers, false, false, N, 1000);
        build_stack(main, "decoder", config.dec_layers, true, true, N, 2000);
        enc_seq.init(arena, N);
        dmemory = arena.acts(static_cast<size_t>(N) * C);
        break;
    }
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

    scratch.init(arena, N, has_encoder ? N : 0, C, config.d_ff);
    dstream = arena.acts(static_cast<size_t>(N) * C);
    spare = arena.acts(static_cast<size_t>(N) * C);
    if (!classify) {
      // The vocabulary projection runs in row chunks so logits never need
      // (N, V) elements: as many as the backend likes at a time.
      logits_stride = (V + 63) / 64 * 64;
      const size_t chunk =
          ops.device().logits_chunk_elements() / static_cast<size_t>(logits_stride);
      chunk_rows = static_cast<int>(std::clamp<size_t>(chunk, 16, std::max(N, 16)));
      logits = arena.acts(static_cast<size_t>(chunk_rows) * logits_stride);
    }
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
  void build_classifier() {
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
  void init_tables() {
    if (!sinusoids) return;
    const int C = config.d_model, L = config.max_len;
    std::vector<float> table(static_cast<size_t>(L) * C);  // host (L, C)
    sinusoid_table(table.data(), L, C);
    std::vector<unsigned char> stored(table.size() * dtype_bytes(sinusoids.dtype));
    narrow(stored.data(), sinusoids.dtype, table.data(), table.size());
    ops.device().copy_to_device(sinusoids.data, stored.data(), stored.size());
  }

  void check(const PackedSequences& s, const char* side) const {
    if (s.total() > capacity.max_tokens || s.max_len() > capacity.max_len ||
        s.batch() > capacity.sequences())
      throw std::runtime_error(
          std::string("batch ") + side + " side (" + std::to_string(s.batch()) + " sequences, " +
          std::to_string(s.total()) + " tokens, longest " + std::to_string(s.max_len()) +
          ") exceeds the model capacity (" + std::to_string(capacity.sequences()) + " sequences, " +
          std::to_string(capacity.max_tokens) + " tokens, length " +
          std::to_string(capacity.max_len) + ")");
    for (int32_t id : s.tokens)
      if (id < 0 || id >= config.vocab)
        throw std::runtime_error(std::string("batch ") + side + " token id " + std::to_string(id) +
                                 " outside the vocabulary [0, " + std::to_string(config.vocab) +
                                 ")");
  }

  Act head_bias() const { return output_bias >= 0 ? params.weight(output_bias) : Act(); }

  // Loss of the vocabulary projection over rows [0, N) of h, fused with its
  // backward: dh (N, C) is written when `backward`. The sums go to *sums.
  // h: (N, C)
  void head(Act h, Act dh, int N, float smoothing, float grad_scale, bool backward,
            LossSums* sums) {
    const int C = config.d_model, V = config.vocab;
    for (int r0 = 0; r0 < N; r0 += chunk_rows) {
      const int n = std::min(chunk_rows, N - r0);
      const Act x = h + static_cast<size_t>(r0) * C;
      ops.matmul_forward(logits, x, params.weight(output_weight), head_bias(), n, C, V, {},
                         logits_stride);
      ops.cross_entropy(logits, targets + r0, n, V, smoothing, config.special.pad, grad_scale,
                        backward, sums, logits_stride);
      if (backward)
        ops.matmul_backward(dh + static_cast<size_t>(r0) * C, params.grad(output_weight),
                            output_bias >= 0 ? params.grad(output_bias) : nullptr, logits, x,
                            params.weight(output_weight), n, C, V, false, {}, logits_stride);
    }
  }

  // The forward pass up to the main stack's output; the encoder output
  // stays in memory_ / memory_rows_ for the backward pass.
  // returns: backend (decoder.total(), C)
  Act forward(const Batch& batch, bool training) {
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
  Act memory_;  // backend (memory_rows_.total, C)
  Ragged memory_rows_;

  // logits: host (B, V)
  void last_logits(const Batch& batch, float* out) {
    if (config.kind == ModelKind::kMlm)
      throw std::runtime_error("an mlm predicts masked tokens; it does not continue sequences");
    if (config.kind == ModelKind::kClassify)
      throw std::runtime_error("a classifier scores labels; it does not continue sequences");
    const int C = config.d_model, V = config.vocab;
    if (batch.decoder.total() == 0) return;
    const Act h = forward(batch, /*training=*/false);
    std::vector<unsigned char> stored(static_cast<size_t>(V) * dtype_bytes(logits.dtype));
    for (int b = 0; b < batch.decoder.batch(); ++b) {
      // One row at a time: decoding batches are small (beams), and the
      // logits buffer holds chunk_rows rows.
      const Act x = h + static_cast<size_t>(batch.decoder.offsets[b + 1] - 1) * C;
      ops.matmul_forward(logits, x, params.weight(output_weight), head_bias(), 1, C, V);
      ops.device().copy_to_host(stored.data(), logits.data, stored.size());
      widen(out + static_cast<size_t>(b) * V, stored.data(), logits.dtype, V);
    }
  }

  // ---- decoding ----

  // Decoding runs batch-invariant (src/model/decoding.h), training does not.
  // On for one call, unless a DecodingSession holds it on already.
  struct BatchInvariant {
    Ops& ops;
    bool was;
    explicit BatchInvariant(Ops& o) : ops(o), was(o.batch_invariant()) {
      ops.set_batch_invariant(true);
    }
    ~BatchInvariant() { ops.set_batch_invariant(was); }
  };

  void decode_sources(const PackedSequences& sources, const std::vector<int32_t>& rows) {
    if (capacity.cache_rows <= 0) throw std::logic_error("decode_sources: no key/value cache");
    if (!has_encoder) return;
    const int n = sources.total();
    check(sources, "encoder");
    if (static_cast<int>(rows.size()) != n)
      throw std::runtime_error("decode_sources: " + std::to_string(rows.size()) +
                               " memory rows for " + std::to_string(n) + " source rows");
    for (int32_t row : rows)
      if (row < 0 || row >= capacity.max_tokens)
        throw std::runtime_error("decode_sources: memory row " + std::to_string(row) +
                                 " outside [0, " + std::to_string(capacity.max_tokens) + ")");
    const BatchInvariant invariant(ops);
    ctx.training = false;
    enc_seq.upload(ops, sources);
    const Act memory = encoder.forward(ctx, scratch, enc_seq, Act(), Ragged{});  // (n, C)
    ops.device().upload(memory_slots, rows.data(), rows.size() * sizeof(int32_t));
    for (Sublayer& sublayer : main.sublayers)
      sublayer.keep_memory(ctx, scratch, memory, n, memory_slots);
  }

  // The key lists of a step, checked against the rows they may name, and
  // uploaded. starts: host (R+1)
  KeyLists upload_lists(const std::vector<int32_t>& starts, const std::vector<int32_t>& rows, int R,
                        int limit, int32_t* device_starts, int32_t* device_rows, const char* what) {
    if (static_cast<int>(starts.size()) != R + 1 || starts[0] != 0 ||
        starts[R] != static_cast<int32_t>(rows.size()))
      throw std::runtime_error(std::string("decode_step: malformed ") + what + " lists");
    KeyLists lists;
    for (int r = 0; r < R; ++r) {
      const int n = starts[r + 1] - starts[r];
      if (n < 0 || n > capacity.max_len)
        throw std::runtime_error(std::string("decode_step: a ") + what + " list of " +
                                 std::to_string(n) + " keys (max-len " +
                                 std::to_string(capacity.max_len) + ")");
      lists.longest = std::max(lists.longest, n);
    }
    for (int32_t row : rows)
      if (row < 0 || row >= limit)
        throw std::runtime_error(std::string("decode_step: ") + what + " key row " +
                                 std::to_string(row) + " outside [0, " + std::to_string(limit) +
                                 ")");
    ops.device().upload(device_starts, starts.data(), starts.size() * sizeof(int32_t));
    ops.device().upload(device_rows, rows.data(), rows.size() * sizeof(int32_t));
    lists.host_starts = starts.data();
    lists.device_starts = device_starts;
    lists.host_rows = rows.data();
    lists.device_rows = device_rows;
    lists.queries = R;
    lists.key_rows = limit;
    return lists;
  }

  // logits: host (step.logit_rows.size(), V)
  void decode_step(const DecodeStep& step, float* out) {
    const int R = step.rows(), C = config.d_model, V = config.vocab;
    if (capacity.cache_rows <= 0) throw std::logic_error("decode_step: no key/value cache");
    if (R == 0) return;
    if (R > capacity.max_tokens || static_cast<int>(step.positions.size()) != R ||
        static_cast<int>(step.cache_rows.size()) != R)
      throw std::runtime_error("decode_step: " + std::to_string(R) + " rows exceed the capacity (" +
                               std::to_string(capacity.max_tokens) +
                               " rows) or miss positions or cache rows");
    for (int32_t row : step.cache_rows)
      if (row < 0 || row >= capacity.cache_rows)
        throw std::runtime_error("decode_step: cache row " + std::to_string(row) +
                                 " outside the cache of " + std::to_string(capacity.cache_rows));
    for (int r = 0; r < R; ++r) {
      if (step.tokens[r] < 0 || step.tokens[r] >= V || step.positions[r] < 0 ||
          step.positions[r] >= config.max_len)
        throw std::runtime_error("decode_step: token " + std::to_string(step.tokens[r]) +
                                 " at position " + std::to_string(step.positions[r]) +
                                 " outside the vocabulary or the positions table");
    }
    const BatchInvariant invariant(ops);
    ctx.training = false;
    ops.device().upload(dec_seq.ids, step.tokens.data(), R * sizeof(int32_t));
    ops.device().upload(dec_seq.positions, step.positions.data(), R * sizeof(int32_t));
    ops.device().upload(step_cache_rows, step.cache_rows.data(), R * sizeof(int32_t));
    const KeyLists self = upload_lists(step.self_starts, step.self_rows, R, capacity.cache_rows,
                                       self_starts, self_rows, "self-attention");
    KeyLists cross;
    if (has_encoder) {
      cross = upload_lists(step.source_starts, step.source_rows, R, capacity.max_tokens,
                           source_starts, source_rows, "source");
    }
    const Act h = main.decode_forward(ctx, scratch, dec_seq.ids, dec_seq.positions, R,
                                      step_cache_rows, self, cross);  // (R, C)
    // The vocabulary projection of each run of wanted rows, chunk by chunk.
    // fp32 rows are written dense and copied straight into `out`; others
    // are staged and widened.
    const bool dense = logits.dtype == DType::kF32;
    const int stride = dense ? V : logits_stride;
    const size_t row_bytes = static_cast<size_t>(stride) * dtype_bytes(logits.dtype);
    if (!logits_staging) logits_staging = std::make_unique<HostBuffer>(ops.device());
    auto* stored = static_cast<unsigned char*>(
        dense ? nullptr : logits_staging->reserve(static_cast<size_t>(chunk_rows) * row_bytes));
    const std::vector<int32_t>& wanted = step.logit_rows;
    for (size_t w = 0; w < wanted.size();) {
      if (wanted[w] < 0 || wanted[w] >= R || (w > 0 && wanted[w] <= wanted[w - 1]))
        throw std::runtime_error("decode_step: logit rows must ascend within the step");
      size_t n = 1;
      while (w + n < wanted.size() && static_cast<int>(n) < chunk_rows &&
             wanted[w + n] == wanted[w] + static_cast<int32_t>(n))
        ++n;
      const Act x = h + static_cast<size_t>(wanted[w]) * C;
      ops.matmul_forward(logits, x, params.weight(output_weight), head_bias(), static_cast<int>(n),
                         C, V, {}, stride);
      if (dense) {
        ops.device().copy_to_host(out + w * V, logits.data, n * row_bytes);
      } else {
        ops.device().copy_to_host(stored, logits.data, n * row_bytes);
        const int rows = static_cast<int>(n);
#pragma omp parallel for if (rows > 1)
        for (int i = 0; i < rows; ++i)
          widen(out + (w + i) * V, stored + static_cast<size_t>(i) * row_bytes, logits.dtype, V);
      }
      w += n;
    }
  }

  // ---- classify ----

  // The batch's image rows, in the compute precision, into the stack.
  void upload_patches(const Batch& batch) {
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

  void upload_labels(const Batch& batch) {
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
      throw std::runtime_error("classifier batch has " +
                               std::to_string(batch.label_targets.size()) + " label targets for " +
                               std::to_string(B) + " sequences of " + std::to_string(K) +
                               " labels");
    ops.device().upload(label_targets, batch.label_targets.data(), batch.label_targets.size() * 4);
  }

  // Forward to the scores: class_logits (B, K).
  void classify_forward(const Batch& batch, bool training) {
    const int C = config.d_model, K = config.num_labels, B = batch.decoder.batch();
    upload_patches(batch);
    const Act h = forward(batch, training);  // (N, C)
    ops.pool_forward(pooled, h, dec_seq.rows, C, config.pool);
    ops.matmul_forward(class_logits, pooled, params.weight(class_w), params.weight(class_b), B, C,
                       K);
  }

  void run_classify(const Batch& batch, float smoothing, float grad_scale, bool training,
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
  void classify_scores(const Batch& batch, float* scores) {
    const int K = config.num_labels, B = batch.decoder.batch();
    check(batch.decoder, "decoder");
    if (B == 0) return;
    classify_forward(batch, /*training=*/false);
    std::vector<unsigned char> stored(static_cast<size_t>(B) * K * dtype_bytes(class_logits.dtype));
    ops.device().copy_to_host(stored.data(), class_logits.data, stored.size());
    widen(scores, stored.data(), class_logits.dtype, static_cast<size_t>(B) * K);
  }

  void run(const Batch& batch, float smoothing, float grad_scale, bool training,
           GradientListener* listener) {
    if (config.kind == ModelKind::kClassify) {
      run_classify(batch, smoothing, grad_scale, training, listener);
      return;
    }
    const int C = config.d_model;
    check(batch.decoder, "decoder");
    if (static_cast<int>(batch.targets.size()) != batch.decoder.total())
      throw std::runtime_error("batch has " + std::to_string(batch.targets.size()) +
                               " targets for " + std::to_string(batch.decoder.total()) +
                               " decoder tokens");
    for (int32_t t : batch.targets)
      if (t < 0 || t >= config.vocab)
        throw std::runtime_error("batch target id " + std::to_string(t) +
                                 " outside the vocabulary");
    if (batch.decoder.total() == 0) return;
    ops.device().upload(targets, batch.targets.data(), batch.targets.size() * sizeof(int32_t));

    // ---- forward ----
    Act h = forward(batch, training);
    const int N = dec_seq.rows.total;
    const Act memory = memory_;
    const Ragged memory_rows = memory_rows_;
    if (config.kind == ModelKind::kMlm) {
      ops.matmul_forward(mlm_act, h, params.weight(mlm_dense_w), params.weight(mlm_dense_b), N, C,
                         C, FusedActivation{config.activation, mlm_dense});
      mlm_norm.forward(ctx, mlm_act, N);
      h = mlm_norm.out;
    }

    // ---- loss, fused with the head's backward ----
    head(h, spare, N, smoothing, grad_scale, training, training ? train_sums : eval_sums);
    if (!training) return;
    // The output bias, and the output weight unless it is the token table.
    const int head_first = config.tied_embeddings ? output_bias : output_weight;
    if (listener && head_first >= 0) listener->gradients_final(params.info()[head_first].offset);

    // ---- backward ----  (d(main.out) is in `spare`)
    if (config.kind == ModelKind::kMlm) {
      const size_t n = static_cast<size_t>(N) * C;
      mlm_norm.backward(ctx, scratch.dy, spare, mlm_act, N, false);
      ops.activation_backward(scratch.du, scratch.dy, mlm_dense, n, config.activation);
      ops.matmul_backward(spare, params.grad(mlm_dense_w), params.grad(mlm_dense_b), scratch.du,
                          main.out, params.weight(mlm_dense_w), N, C, C, false);
      if (listener) listener->gradients_final(params.info()[mlm_dense_w].offset);
    }
    if (has_encoder)
      ops.device().fill_zero(
          dmemory.data, static_cast<size_t>(memory_rows.total) * C * dtype_bytes(dmemory.dtype));
    main.backward(ctx, scratch, dstream, spare, dec_seq, memory, dmemory, memory_rows, listener);
    if (has_encoder) {
      // d(encoder output) becomes the encoder's incoming gradient; the three
      // (N, C) buffers only trade places.
      std::swap(spare, dmemory);
      encoder.backward(ctx, scratch, dstream, spare, enc_seq, Act(), Act(), Ragged{}, listener);
    }
    if (listener) listener->gradients_final(0);
  }

  std::vector<int64_t> take_counts(int64_t* counts) {
    if (!counts) return {};
    std::vector<int64_t> host(3 * static_cast<size_t>(config.num_labels));
    ops.device().copy_to_host(host.data(), counts, host.size() * sizeof(int64_t));
    ops.device().fill_zero(counts, host.size() * sizeof(int64_t));
    return host;
  }

  LossSums take(LossSums* sums) {
    LossSums host;
    ops.device().copy_to_host(&host, sums, sizeof host);
    ops.device().fill_zero(sums, sizeof host);
    return host;
  }
};

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

void Model::last_logits(const Batch& batch, float* logits) {
  impl_->last_logits(batch, logits);
}

void Model::decode_sources(const PackedSequences& sources, const std::vector<int32_t>& rows) {
  impl_->decode_sources(sources, rows);
}

Model::DecodingSession::DecodingSession(Model& model)
    : ops_(model.impl_->ops), was_(ops_.batch_invariant()) {
  ops_.set_batch_invariant(true);
}

Model::DecodingSession::~DecodingSession() {
  ops_.set_batch_invariant(was_);
}

void Model::decode_step(const DecodeStep& step, float* logits) {
  impl_->decode_step(step, logits);
}

void Model::classify_scores(const Batch& batch, float* scores) {
  impl_->classify_scores(batch, scores);
}

std::vector<int64_t> Model::take_label_counts(bool train) {
  return impl_->take_counts(train ? impl_->train_counts : impl_->eval_counts);
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
