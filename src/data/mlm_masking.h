// BERT-style masking for mlm batches, shared by the synthetic tasks and the
// shard loader, and the counter-based generator the data pipeline draws from.
#pragma once

#include <cstdint>

#include "kernels/dropout_mask.h"
#include "src/core/config.h"

namespace mpiformer {

// Counter-based generator (splitmix64): its numbers are a pure function of
// the key, so batch i of a stream never depends on the batches drawn before,
// on the thread that builds it, or on the standard library's distributions.
class KeyedRng {
 public:
  explicit KeyedRng(uint64_t key) : state_(key) {}

  uint64_t next() {
    const uint64_t out = mix64(state_);
    state_ += 0x9E3779B97F4A7C15ull;
    return out;
  }

  // Uniform in [0, n) for n > 0; the multiply-shift bias (n / 2^64) is negligible.
  uint64_t below(uint64_t n) {
    return static_cast<uint64_t>((static_cast<unsigned __int128>(next()) * n) >> 64);
  }

  // Uniform in [lo, hi].
  int uniform_int(int lo, int hi) {
    return lo + static_cast<int>(below(static_cast<uint64_t>(static_cast<int64_t>(hi) - lo + 1)));
  }

  double uniform01() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

 private:
  uint64_t state_;
};

// Ids that frame sequences rather than carry text (pad, bos, eos, [MASK],
// [SEP]): never chosen for prediction. [UNK] stands for text and may be.
bool is_structural_token(int id, const SpecialTokens& special);

struct MlmMasking {
  float probability = 0.15f;  // share of the choosable tokens predicted
  int vocab = 0;              // random replacements are drawn from [SpecialTokens::kCount, vocab)
  SpecialTokens special;
};

// Masks one sequence in place. Each non-structural token is chosen with
// `probability` (at least one per sequence when any is choosable); a chosen
// token becomes [MASK] 80% of the time, a random non-special id 10%, and
// stays 10%. targets (n) receives the original token at chosen positions and
// pad elsewhere. Draws from `rng` in a fixed order: the thresholds of every
// position, then the fallback pick, then one replacement draw per chosen.
void mask_sequence(const MlmMasking& rule, KeyedRng& rng, int32_t* tokens, int32_t* targets, int n);

// The key the masks of batch `index` of `stream` are drawn with under
// `seed`, apart from the synthetic tasks', dropout's and the epoch order's.
// A batch numbered per rank (--sharding file) passes its `rank`, so ranks
// never share masks; -1 for one numbered over all ranks.
uint64_t mask_key(uint64_t seed, uint64_t stream, uint64_t index, int rank);

}  // namespace mpiformer
