#include "src/data/mlm_masking.h"

namespace mpiformer {

bool is_structural_token(int id, const SpecialTokens& sp) {
  return id == sp.pad || id == sp.bos || id == sp.eos || id == sp.mask || id == sp.sep;
}

void mask_sequence(const MlmMasking& rule, KeyedRng& rng, int32_t* tokens, int32_t* targets,
                   int n) {
  const SpecialTokens& sp = rule.special;
  // Pass 1: choose. A chosen position is marked by its target (the original
  // token, never pad since pad is structural), so no list is needed.
  int choosable = 0, chosen = 0;
  for (int i = 0; i < n; ++i) {
    targets[i] = sp.pad;
    if (is_structural_token(tokens[i], sp)) continue;
    ++choosable;
    if (rng.uniform01() < rule.probability) {
      targets[i] = tokens[i];
      ++chosen;
    }
  }
  if (choosable == 0) return;
  if (chosen == 0) {
    // Every sequence contributes at least one prediction: the pick-th choosable token.
    int pick = rng.uniform_int(0, choosable - 1);
    for (int i = 0; i < n; ++i) {
      if (is_structural_token(tokens[i], sp)) continue;
      if (pick-- == 0) {
        targets[i] = tokens[i];
        break;
      }
    }
  }
  // Pass 2: corrupt the chosen inputs, in ascending position order.
  for (int i = 0; i < n; ++i) {
    if (targets[i] == sp.pad) continue;
    const double r = rng.uniform01();
    if (r < 0.8) {
      tokens[i] = sp.mask;
    } else if (r < 0.9) {
      tokens[i] = rng.uniform_int(SpecialTokens::kCount, rule.vocab - 1);
    }  // else: kept, but still predicted
  }
}

uint64_t mask_key(uint64_t seed, uint64_t stream, uint64_t index, int rank) {
  constexpr uint64_t kMaskDomain = 0x3A5C0DA7A0000002ull;
  const uint64_t key = mix64(mix64(mix64(seed ^ kMaskDomain) ^ stream) ^ index);
  return rank < 0 ? key : mix64(key ^ static_cast<uint64_t>(rank + 1));
}

}  // namespace mpiformer
