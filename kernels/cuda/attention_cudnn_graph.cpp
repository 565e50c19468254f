// What a cuDNN attention graph is for a key (attention_cudnn_graph.h), and
// the check of the graphs a run builds against the frontend's validation,
// which needs no GPU (tests/attention_graphs_test.cpp).
//
// Layout ("THD": tokens packed back to back, heads side by side), every
// tensor (b, h, s, d) with a ragged offset in elements per sequence:
//   q  (Nq, H*D) rows q_stride apart     ro_q  = q_offsets * q_stride
//   k, v (Nk, H*D) rows kv_stride apart  ro_kv = k_offsets * kv_stride
//   out, dout (Nq, H*D) dense             ro_o  = q_offsets * H*D
//   stats (Nq, H) fp32                    ro_stats = q_offsets * H
// so a fused QKV tensor (q_stride = kv_stride = 3C) is read in place, and
// its gradient written in place. The padding mask makes each sequence see
// only its own keys; the causal mask is the top-left diagonal band. The
// dense layout (attention=dense, a batch of equal lengths) has neither
// offsets nor padding mask.
#include "kernels/cuda/attention_cudnn_graph.h"

#include <cmath>
#include <string>
#include <vector>

#include "kernels/cuda/attention_cudnn.h"

namespace mpiformer::cuda {

#if !defined(MPIFORMER_HAVE_CUDNN_FRONTEND)

std::vector<std::string> FlashAttention::validate_graphs(int) {
  return {};
}

#else

namespace fe = cudnn_frontend;

namespace {

using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;

// The ragged layout's per-sequence lengths and offsets (B slots); all null
// in the dense layout, which has neither.
struct RaggedIndex {
  TensorPtr seq_q, seq_kv, ro_q, ro_kv, ro_o, ro_stats;
};

RaggedIndex ragged_index(fe::graph::Graph& g, const GraphKey& key) {
  if (key.dense) return {};
  const auto index = [&](const char* name, int64_t uid, int64_t n, fe::DataType_t type) {
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name(name)
                        .set_uid(uid)
                        .set_dim({n, 1, 1, 1})
                        .set_stride({1, 1, 1, 1})
                        .set_data_type(type));
  };
  const int64_t B = key.slots;
  return RaggedIndex{index("seq_q", kSeqQ, B, fe::DataType_t::INT32),
                     index("seq_kv", kSeqKv, B, fe::DataType_t::INT32),
                     index("ro_q", kRoQ, B + 1, fe::DataType_t::INT64),
                     index("ro_kv", kRoKv, B + 1, fe::DataType_t::INT64),
                     index("ro_o", kRoO, B + 1, fe::DataType_t::INT64),
                     index("ro_stats", kRoStats, B + 1, fe::DataType_t::INT64)};
}

// The masks of either pass: padding (ragged only) and the causal band.
template <typename Options>
void set_masks(Options& options, const GraphKey& key, const RaggedIndex& r) {
  if (!key.dense) options.set_padding_mask(true).set_seq_len_q(r.seq_q).set_seq_len_kv(r.seq_kv);
  if (key.causal) {
    options.set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
        .set_diagonal_band_right_bound(0);
  }
}

}  // namespace

std::shared_ptr<fe::graph::Graph> describe(const GraphKey& key, int sm) {
  const int64_t B = key.slots, H = key.heads, D = key.head_dim, C = H * D;
  const int64_t Sq = key.max_q, Skv = key.max_kv;
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_sm_version(sm);
  g->set_io_data_type(static_cast<DType>(key.dtype) == DType::kBF16 ? fe::DataType_t::BFLOAT16
                                                                    : fe::DataType_t::HALF)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  const RaggedIndex r = ragged_index(*g, key);
  // (b, h, s, d) over rows `token` elements apart.
  const auto layout = [&](TensorPtr t, int64_t S, int64_t token, TensorPtr ro) {
    t->set_dim({B, H, S, D}).set_stride({S * token, D, token, 1});
    if (ro) t->set_ragged_offset(ro);
    return t;
  };
  const auto input = [&](const char* name, int64_t uid, int64_t S, int64_t token, TensorPtr ro) {
    return layout(g->tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid)), S, token,
                  ro);
  };
  // (N, H) rows; packed (B, H, S) into the dense backward (launch_pack_stats).
  const auto stats_layout = [&](TensorPtr t) {
    const bool packed = key.dense && key.backward;
    t->set_uid(kStats).set_data_type(fe::DataType_t::FLOAT).set_dim({B, H, Sq, 1});
    t->set_stride(packed ? std::vector<int64_t>{H * Sq, Sq, 1, 1}
                         : std::vector<int64_t>{Sq * H, 1, H, 1});
    if (r.ro_stats) t->set_ragged_offset(r.ro_stats);
    return t;
  };
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const auto q = input("q", kQ, Sq, key.q_stride, r.ro_q);
  const auto k = input("k", kK, Skv, key.kv_stride, r.ro_kv);
  const auto v = input("v", kV, Skv, key.kv_stride, r.ro_kv);

  if (!key.backward) {
    auto options = fe::graph::SDPA_attributes()
                       .set_name("attention")
                       .set_generate_stats(true)
                       .set_attn_scale(scale);
    set_masks(options, key, r);
    auto [o, stats] = g->sdpa(q, k, v, options);
    layout(o, Sq, C, r.ro_o)->set_output(true).set_uid(kO);
    stats_layout(stats)->set_output(true);
  } else {
    const auto o = input("o", kO, Sq, C, r.ro_o);
    const auto dout = input("dout", kDO, Sq, C, r.ro_o);
    const auto stats = stats_layout(g->tensor(fe::graph::Tensor_attributes().set_name("stats")));
    auto options =
        fe::graph::SDPA_backward_attributes().set_name("attention_backward").set_attn_scale(scale);
    set_masks(options, key, r);
    // Accumulators sized by the packed totals (not slots x longest); the
    // frontend takes them for ragged head sizes that are multiples of 16.
    if (!key.dense && D % 16 == 0) {
      options.set_max_total_seq_len_q(key.total_q).set_max_total_seq_len_kv(key.total_kv);
    }
    // cuDNN's default backward adds into dQ with float atomics: the bits
    // then change from run to run. Where it has no deterministic engine for
    // a case, the graph is refused and the plain kernels run (no atomics).
    if (key.deterministic) options.set_deterministic_algorithm(true);
    auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dout, stats, options);
    layout(dq, Sq, key.q_stride, r.ro_q)->set_output(true).set_uid(kDQ);
    layout(dk, Skv, key.kv_stride, r.ro_kv)->set_output(true).set_uid(kDK);
    layout(dv, Skv, key.kv_stride, r.ro_kv)->set_output(true).set_uid(kDV);
  }
  return g;
}

std::vector<std::string> FlashAttention::validate_graphs(int sm) {
  struct Case {
    const char* name;
    int q_stride, kv_stride;  // in units of C
    bool causal;
    AttentionScale scale;
    int heads, head_dim, batch, q_len, k_len;
  };
  const Case cases[] = {
      {"causal self-attention, fused QKV", 3, 3, true, AttentionScale::kStandard, 12, 64, 8, 1024,
       1024},
      {"bidirectional self-attention, fused QKV", 3, 3, false, AttentionScale::kStandard, 8, 64,
       100, 48, 48},
      {"causal self-attention, folded q", 3, 3, true, AttentionScale::kLogLength, 4, 64, 8, 256,
       256},
      {"cross-attention", 1, 2, false, AttentionScale::kStandard, 8, 64, 128, 48, 40},
      {"cross-attention, folded q", 1, 2, false, AttentionScale::kLogLength, 8, 128, 64, 40, 48},
      {"causal self-attention, head size 8", 3, 3, true, AttentionScale::kStandard, 3, 8, 5, 13,
       13},
      // Prepared classes of a GPT-2-width run on buckets up to 128 tokens
      // (--max-tokens 32768): many short sequences, and the longest class.
      {"causal self-attention, short bucket class", 3, 3, true, AttentionScale::kStandard, 12, 64,
       4096, 8, 8},
      {"causal self-attention, long bucket class", 3, 3, true, AttentionScale::kStandard, 12, 64,
       289, 113, 113},
  };
  std::vector<std::string> failures;
  for (const Case& c : cases) {
    const int C = c.heads * c.head_dim;
    const Ragged qs{nullptr, nullptr, c.batch, c.batch * c.q_len, c.q_len, 0};
    const Ragged ks{nullptr, nullptr, c.batch, c.batch * c.k_len, c.k_len, 0};
    const AttentionConfig cfg{c.heads, c.head_dim, c.causal, c.scale, 512.0f};
    const GraphLayout layout = layout_of(cfg, c.q_stride * C, c.kv_stride * C);
    PlannedShapes planned;
    planned.add(layout, SideBound{c.batch, c.q_len, int64_t{c.batch} * c.q_len},
                SideBound{c.batch, c.k_len, int64_t{c.batch} * c.k_len});
    for (bool backward : {false, true}) {
      for (DType dtype : {DType::kBF16, DType::kF16}) {
        // The shape of an unprepared call, of a prepared class, and the
        // batch's own in the dense layout (attention=dense). Deterministic:
        // the default of a training run.
        for (const GraphKey& key :
             {key_of(backward, dtype, layout, rounded_shape(qs, ks, c.causal), true),
              key_of(backward, dtype, layout, planned.entries()[0].shape, true),
              dense_key_of(backward, dtype, layout, dense_shape(qs, ks), true)}) {
          fe::error_t status = describe(key, sm)->validate();
          if (status.is_bad())
            failures.push_back(std::string(c.name) + ", " + describe_key(key) + ": " +
                               status.get_message());
        }
      }
    }
  }
  return failures;
}

#endif

}  // namespace mpiformer::cuda
