// The pieces a model is built of beside the blocks (src/model/blocks.h):
// the batch's sequences and row groups on the device, and a Stack, the
// embedding and sub-layers of one side (decoder-only, encoder-decoder or
// encoder) with their forward, decoding and backward passes.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "src/data/batch.h"
#include "src/model/blocks.h"

namespace mpiformer {

// A fresh version for each upload of batch offsets (Ragged::version).
inline uint64_t next_batch_version() {
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

}  // namespace mpiformer
