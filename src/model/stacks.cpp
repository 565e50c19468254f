// The three stacks a model is built of, each a Stack (src/model/stack.h) of
// its own sub-layers: decoder-only (lm: causal self-attention and MLP),
// encoder (mlm, classify: bidirectional self-attention and MLP) and
// encoder-decoder (seq2seq: an encoder, and a decoder whose layers add
// cross-attention to the encoder's output). They differ only in which
// sub-layers a layer holds, so one builder serves all three.
#include <cmath>
#include <string>

#include "src/model/model_impl.h"

namespace mpiformer {

void Model::Impl::build_stacks() {
  const int N = capacity.max_tokens;
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
      dmemory = arena.acts(static_cast<size_t>(N) * config.d_model);
      break;
  }
}

void Model::Impl::build_stack(Stack& stack, const std::string& name, int layers, bool causal,
                              bool cross, int rows, uint64_t site_base) {
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
                                          Sublayer::Kind::kCrossAttention, false, rows, memory_rows,
                                          site++, residual_std, shared(l, k++));
    }
    stack.sublayers.emplace_back().init(ctx, arena, prefix + ".mlp", Sublayer::Kind::kMlp, false,
                                        rows, 0, site++, residual_std, shared(l, k++),
                                        /*own_output=*/true);
  }
  stack.inputs.assign(stack.sublayers.size(), Act());
  stack.has_final_norm = config.pre_norm;
  if (stack.has_final_norm) stack.final_norm.init(ctx, arena, name + ".norm", rows);
}

}  // namespace mpiformer
