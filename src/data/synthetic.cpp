#include "src/data/synthetic.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/dropout_mask.h"
#include "src/data/mlm_masking.h"

namespace mpiformer {
namespace {

// Distinct from the dropout masks' key schedule so data and masks never share
// random numbers, even under the same seed.
uint64_t batch_key(uint64_t seed, uint64_t stream, uint64_t index) {
  constexpr uint64_t kDataDomain = 0x5EED0DA7A0000001ull;
  return mix64(mix64(mix64(seed ^ kDataDomain) ^ stream) ^ index);
}

// Sequence lengths an example with |x| = n occupies on each side.
int encoder_len(ModelKind k, int n) {
  return k == ModelKind::kSeq2seq ? n : 0;
}
int decoder_len(ModelKind k, int n) {
  return k == ModelKind::kSeq2seq ? n + 1 : 2 * n + 1;
}

// Padded tokens of `count` examples whose longest x has length n (both sides
// grow with n, so the longest x sets both padded lengths).
int64_t padded_tokens(ModelKind k, int64_t count, int n) {
  return count * (encoder_len(k, n) + decoder_len(k, n));
}

}  // namespace

SyntheticSource::SyntheticSource(SyntheticTask task, const ModelConfig& model, int max_tokens,
                                 int max_sentences, int min_len, float mlm_probability,
                                 uint64_t seed)
    : task_(task),
      model_(model),
      max_tokens_(max_tokens),
      max_sentences_(max_sentences),
      min_len_(min_len),
      mlm_probability_(mlm_probability),
      seed_(seed) {
  // Messages name the flags: the CLI passes them on as usage errors.
  if (task == SyntheticTask::kNone) throw std::invalid_argument("--synthetic: no task given");
  if (model.vocab <= SpecialTokens::kCount) {
    throw std::invalid_argument("--vocab: no data symbols above the " +
                                std::to_string(SpecialTokens::kCount) + " reserved ids");
  }
  if (min_len < 1) {
    throw std::invalid_argument("--min-len: must be positive; got " + std::to_string(min_len));
  }
  if (max_sentences < 0) {
    throw std::invalid_argument("--max-sentences: must not be negative");
  }
  if (model.kind == ModelKind::kMlm && !(mlm_probability > 0 && mlm_probability <= 1)) {
    throw std::invalid_argument("--mlm-probability: must be in (0, 1]");
  }
  max_x_len_ = model.kind == ModelKind::kSeq2seq ? model.max_len - 1 : (model.max_len - 1) / 2;
  if (max_x_len_ < min_len) {
    throw std::invalid_argument("--min-len: must be at most " + std::to_string(max_x_len_) +
                                ", the longest example that fits --max-len " +
                                std::to_string(model.max_len) + " for " + to_string(model.kind) +
                                "; got " + std::to_string(min_len));
  }
  const int64_t one_longest = padded_tokens(model.kind, 1, max_x_len_);
  if (one_longest > max_tokens) {
    throw std::invalid_argument("--max-tokens: must be at least " + std::to_string(one_longest) +
                                ", the padded size of one longest example (--max-len " +
                                std::to_string(model.max_len) + "); got " +
                                std::to_string(max_tokens));
  }
}

void SyntheticSource::make_batch(uint64_t stream, uint64_t index, Batch* out) {
  out->clear();
  const SpecialTokens& sp = model_.special;
  const ModelKind kind = model_.kind;
  const int first_symbol = SpecialTokens::kCount;
  const int last_symbol = model_.vocab - 1;
  KeyedRng rng(batch_key(seed_, stream, index));
  const MlmMasking masking{mlm_probability_, model_.vocab, sp};

  std::vector<int32_t> x, y, input, target;
  int count = 0;
  int longest = 0;
  while (max_sentences_ == 0 || count < max_sentences_) {
    const int n = rng.uniform_int(min_len_, max_x_len_);
    const int longer = std::max(longest, n);
    if (count > 0 && padded_tokens(kind, count + 1, longer) > max_tokens_) break;
    ++count;
    longest = longer;

    x.resize(n);
    for (int& s : x) s = rng.uniform_int(first_symbol, last_symbol);
    y = x;
    if (task_ == SyntheticTask::kReverse) std::reverse(y.begin(), y.end());
    if (task_ == SyntheticTask::kSort) std::sort(y.begin(), y.end());

    input.clear();
    target.clear();
    if (kind == ModelKind::kSeq2seq) {
      out->encoder.append(x.data(), n);
      input.push_back(sp.bos);
      input.insert(input.end(), y.begin(), y.end());
      target = y;
      target.push_back(sp.eos);
    } else {
      input = x;
      input.push_back(sp.sep);
      input.insert(input.end(), y.begin(), y.end());
      if (kind == ModelKind::kLm) {
        // Input position i predicts token i+1 of x SEP y EOS; only y EOS is
        // predictable, so the x part carries no loss.
        target.assign(n, sp.pad);
        target.insert(target.end(), y.begin(), y.end());
        target.push_back(sp.eos);
      } else {
        // MLM: choose among the real tokens (SEP is structural: never chosen).
        target.resize(input.size());
        mask_sequence(masking, rng, input.data(), target.data(), static_cast<int>(input.size()));
      }
    }
    out->decoder.append(input.data(), static_cast<int>(input.size()));
    out->targets.insert(out->targets.end(), target.begin(), target.end());
  }
}

}  // namespace mpiformer
