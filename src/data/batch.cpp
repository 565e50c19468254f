#include "src/data/batch.h"

#include <algorithm>

namespace mpiformer {

int PackedSequences::max_len() const {
  int m = 0;
  for (int b = 0; b < batch(); ++b) m = std::max(m, length(b));
  return m;
}

void PackedSequences::append(const int32_t* ids, int n) {
  tokens.insert(tokens.end(), ids, ids + n);
  for (int i = 0; i < n; ++i) positions.push_back(i);
  offsets.push_back(offsets.back() + n);
}

void PackedSequences::clear() {
  offsets.assign(1, 0);
  tokens.clear();
  positions.clear();
}

int64_t Batch::padded_tokens() const {
  return static_cast<int64_t>(encoder.batch()) * encoder.max_len() +
         static_cast<int64_t>(decoder.batch()) * decoder.max_len();
}

int64_t Batch::real_tokens() const {
  return encoder.total() + decoder.total();
}

int64_t Batch::target_tokens(int pad_id) const {
  if (per_sequence) return decoder.batch();
  return std::count_if(targets.begin(), targets.end(), [&](int32_t t) { return t != pad_id; });
}

void Batch::clear() {
  encoder.clear();
  decoder.clear();
  targets.clear();
  label_targets.clear();
  patches.clear();
}

}  // namespace mpiformer
