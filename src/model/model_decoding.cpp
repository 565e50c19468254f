// Model's decoding: the logits of the last positions, the encoder memory
// kept for the steps, and one incremental step over a key/value cache.
#include <stdexcept>
#include <string>
#include <vector>

#include "src/model/model_impl.h"

namespace mpiformer {

// logits: host (B, V)
void Model::Impl::last_logits(const Batch& batch, float* out) {
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

void Model::Impl::decode_sources(const PackedSequences& sources, const std::vector<int32_t>& rows) {
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
KeyLists Model::Impl::upload_lists(const std::vector<int32_t>& starts,
                                   const std::vector<int32_t>& rows, int R, int limit,
                                   int32_t* device_starts, int32_t* device_rows, const char* what) {
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
                               std::to_string(row) + " outside [0, " + std::to_string(limit) + ")");
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

void Model::Impl::check_decode_step(const DecodeStep& step) const {
  const int R = step.rows(), V = config.vocab;
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
}

// logits: host (step.logit_rows.size(), V)
void Model::Impl::decode_step(const DecodeStep& step, float* out) {
  const int R = step.rows();
  if (capacity.cache_rows <= 0) throw std::logic_error("decode_step: no key/value cache");
  if (R == 0) return;
  check_decode_step(step);
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
  decode_logits(h, step.logit_rows, R, out);
}

void Model::Impl::decode_logits(Act h, const std::vector<int32_t>& wanted, int R, float* out) {
  const int C = config.d_model, V = config.vocab;
  // The vocabulary projection of each run of wanted rows, chunk by chunk.
  // fp32 rows are written dense and copied straight into `out`; others
  // are staged and widened.
  const bool dense = logits.dtype == DType::kF32;
  const int stride = dense ? V : logits_stride;
  const size_t row_bytes = static_cast<size_t>(stride) * dtype_bytes(logits.dtype);
  if (!logits_staging) logits_staging = std::make_unique<HostBuffer>(ops.device());
  auto* stored = static_cast<unsigned char*>(
      dense ? nullptr : logits_staging->reserve(static_cast<size_t>(chunk_rows) * row_bytes));
  for (size_t w = 0; w < wanted.size();) {
    if (wanted[w] < 0 || wanted[w] >= R || (w > 0 && wanted[w] <= wanted[w - 1]))
      throw std::runtime_error("decode_step: logit rows must ascend within the step");
    size_t n = 1;
    while (w + n < wanted.size() && static_cast<int>(n) < chunk_rows &&
           wanted[w + n] == wanted[w] + static_cast<int32_t>(n))
      ++n;
    const Act x = h + static_cast<size_t>(wanted[w]) * C;
    ops.matmul_forward(logits, x, params.weight(output_weight), head_bias(), static_cast<int>(n), C,
                       V, {}, stride);
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

}  // namespace mpiformer
