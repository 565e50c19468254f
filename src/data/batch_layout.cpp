#include "src/data/batch_layout.h"

#include <string>

#include "src/core/error.h"

namespace mpiformer {

namespace {

// Appends [prefix] ids[0, n) [suffix] as one sequence; a marker < 0 is absent.
void append_sequence(PackedSequences* p, int prefix, const int32_t* ids, int n, int suffix) {
  const int length = n + (prefix >= 0) + (suffix >= 0);
  if (prefix >= 0) p->tokens.push_back(prefix);
  p->tokens.insert(p->tokens.end(), ids, ids + n);
  if (suffix >= 0) p->tokens.push_back(suffix);
  for (int i = 0; i < length; ++i) p->positions.push_back(i);
  p->offsets.push_back(p->offsets.back() + length);
}

}  // namespace

BatchLayout::BatchLayout(const ModelConfig& model, const MlmMasking& masking, int64_t max_tokens)
    : model_(model), masking_(masking), max_tokens_(max_tokens) {}

int BatchLayout::encoder_length(const Example& e) const {
  if (model_.kind != ModelKind::kSeq2seq) return 0;
  return e.source_kept + ((e.flags & Example::kSourceEnds) ? 1 : 0);
}

int BatchLayout::decoder_length(const Example& e) const {
  if (model_.kind == ModelKind::kMlm || model_.images()) return e.target_kept;
  if (model_.kind == ModelKind::kClassify) {
    return e.target_kept + (model_.pool == PoolKind::kCls ? 1 : 0);
  }
  return e.target_kept + ((e.flags & Example::kTargetEnds) ? 1 : 0);
}

void BatchLayout::fill(const std::vector<Shard>& shards, const std::vector<Example>& examples,
                       const uint32_t* ids, uint32_t count, uint64_t key, int max_sequences,
                       Batch* out) const {
  out->clear();  // keeps the vectors' capacity
  reserve_for_budget(max_sequences, out);
  const SpecialTokens& sp = model_.special;
  KeyedRng rng(key);
  out->per_sequence = model_.kind == ModelKind::kClassify;
  for (uint32_t k = 0; k < count; ++k) {
    const Example& e = examples[ids[k]];
    const Shard& shard = shards[e.shard];
    if (model_.kind == ModelKind::kClassify) {
      add_example(shard, e, out);
      continue;
    }
    const int32_t* target = shard.target.tokens.data() + shard.target.offsets[e.sequence];
    if (model_.kind == ModelKind::kMlm) {
      const size_t at = out->targets.size();  // == decoder.total()
      append_sequence(&out->decoder, -1, target, e.target_kept, -1);
      out->targets.resize(at + e.target_kept);
      mask_sequence(masking_, rng, out->decoder.tokens.data() + at, out->targets.data() + at,
                    e.target_kept);
      continue;
    }
    if (model_.kind == ModelKind::kSeq2seq) {
      const int32_t* source = shard.source.tokens.data() + shard.source.offsets[e.sequence];
      append_sequence(&out->encoder, -1, source, e.source_kept,
                      (e.flags & Example::kSourceEnds) ? sp.eos : -1);
    }
    // Decoder BOS t[0, n-1) predicts t[0, n) then EOS when the sequence ends here.
    append_sequence(&out->decoder, sp.bos, target, decoder_length(e) - 1, -1);
    out->targets.insert(out->targets.end(), target, target + e.target_kept);
    if (e.flags & Example::kTargetEnds) out->targets.push_back(sp.eos);
  }
}

void BatchLayout::check_labels(const Shard& shard, const std::string& file) const {
  if (model_.loss != ClassifyLoss::kSoftmax) return;
  const ShardLabels& labels = shard.labels;
  for (size_t i = 0; i < labels.count(); ++i) {
    const uint64_t n = labels.offsets[i + 1] - labels.offsets[i];
    if (n != 1 || labels.weights[labels.offsets[i]] != 1.0f) {
      usage_error("--loss", "softmax needs exactly one hard label per example; " + file +
                                ": example " + std::to_string(i) + " has " + std::to_string(n) +
                                (n == 1 ? " soft label" : " labels") +
                                " (use --loss zlpr for multi-label or soft targets)");
    }
  }
}

void BatchLayout::add_example(const Shard& shard, const Example& e, Batch* out) const {
  const bool cls = model_.pool == PoolKind::kCls;
  if (model_.images()) {
    // Rows: [CLS: no pixels], then the patches in raster order, each its P x
    // P x C pixels mapped to [-1, 1] and a one-hot of its position.
    const int P = model_.patch, C = model_.image_channels, W = model_.image_width;
    const int F = model_.patch_features(), pixels = P * P * C;
    const int rows = model_.image_rows(), across = W / P;
    const uint8_t* image =
        shard.images.data() + e.sequence * shard.header.image_bytes();  // (H, W, C)
    const size_t at = out->patches.size();
    out->patches.resize(at + static_cast<size_t>(rows) * F, 0.0f);
    for (int r = 0; r < rows; ++r) {
      float* row = out->patches.data() + at + static_cast<size_t>(r) * F;  // (F)
      row[pixels + r] = 1.0f;
      const int patch = r - (cls ? 1 : 0);
      if (patch < 0) continue;
      const int y0 = (patch / across) * P, x0 = (patch % across) * P;
      int f = 0;
      for (int dy = 0; dy < P; ++dy) {
        for (int dx = 0; dx < P; ++dx) {
          const uint8_t* px = image + (static_cast<size_t>(y0 + dy) * W + x0 + dx) * C;
          for (int c = 0; c < C; ++c) row[f++] = px[c] / 127.5f - 1.0f;
        }
      }
    }
    out->decoder.tokens.insert(out->decoder.tokens.end(), rows, 0);
    for (int i = 0; i < rows; ++i) out->decoder.positions.push_back(i);
    out->decoder.offsets.push_back(out->decoder.offsets.back() + rows);
  } else {
    const int32_t* tokens = shard.target.tokens.data() + shard.target.offsets[e.sequence];
    append_sequence(&out->decoder, cls ? model_.special.bos : -1, tokens, e.target_kept, -1);
  }
  const ShardLabels& labels = shard.labels;
  const uint64_t first = labels.offsets[e.sequence], last = labels.offsets[e.sequence + 1];
  if (model_.loss == ClassifyLoss::kSoftmax) {
    out->targets.push_back(labels.ids[first]);  // one hard label: check_labels
    return;
  }
  const int K = model_.num_labels;
  const size_t at = out->label_targets.size();
  out->label_targets.resize(at + K, 0.0f);
  for (uint64_t j = first; j < last; ++j)
    out->label_targets[at + labels.ids[j]] = labels.weights[j];
}

void BatchLayout::reserve_for_budget(int max_sequences, Batch* out) const {
  // Every batch fits in this, so a buffer allocates once, on its first use,
  // and never again whichever batches pass through it.
  const size_t tokens = static_cast<size_t>(max_tokens_);
  const size_t offsets = static_cast<size_t>(max_sequences) + 1;
  out->decoder.tokens.reserve(tokens);
  out->decoder.positions.reserve(tokens);
  out->decoder.offsets.reserve(offsets);
  out->targets.reserve(tokens);
  if (model_.kind == ModelKind::kClassify) {
    out->label_targets.reserve(offsets * static_cast<size_t>(model_.num_labels));
    if (model_.images())
      out->patches.reserve(tokens * static_cast<size_t>(model_.patch_features()));
  }
  if (model_.kind == ModelKind::kSeq2seq) {
    out->encoder.tokens.reserve(tokens);
    out->encoder.positions.reserve(tokens);
    out->encoder.offsets.reserve(offsets);
  }
}

}  // namespace mpiformer
