// The GEMMs' timed search (kernels/cuda/gemm.cu, MPIFORMER_KERNELS=
// gemm=timed), the parts that need no GPU: a digest of the bits a trial
// wrote, and which trial wins. Also checked on the CPU
// (tests/gemm_search_test.cpp), the digest's kernel under emulation.
//
// cuBLASLt's suggestions for one shape may sum in different orders (split
// K, another reduction of the bias gradient), and then give other bits.
// Deterministic runs keep the bits of its first suggestion, the one used
// without the search: a trial whose outputs' digest differs from the first
// one's is set aside untimed. Such runs then give the same bits whichever
// suggestion won, on any rank and in any run, and only the speed changes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/dropout_mask.h"  // MPIFORMER_HOST_DEVICE, mix64

namespace mpiformer::gemm_search {

// A digest is the sum, modulo 2^64, of a term per 16-bit unit of the
// outputs: any order of summing gives it, and a unit changed or moved
// changes it (but for a chance of 2^-64). Every element type the GEMMs
// write (fp32, bf16, fp16) is whole units.
MPIFORMER_HOST_DEVICE inline uint64_t digest_term(uint64_t index, uint16_t unit) {
  return mix64(index * 0x10001ull + unit);
}

// Where a second or third output's units are numbered from, so that the
// same bits in another output count differently.
constexpr uint64_t kOutputStride = uint64_t{1} << 40;

// The CPU's digest of `bytes` (even) at `data`, units numbered from
// first_index: what the device's kernel adds (kernels/cuda/digest_kernels.cuh).
inline uint64_t bits_digest(const void* data, size_t bytes, uint64_t first_index = 0) {
  uint64_t sum = 0;
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes / 2; ++i) {
    uint16_t unit;
    std::memcpy(&unit, p + 2 * i, sizeof unit);
    sum += digest_term(first_index + i, unit);
  }
  return sum;
}

// One suggestion's trial: whether cuBLASLt ran it, its outputs' digest
// (taken where the bits must match), and its milliseconds over the timed
// runs, negative where it was not timed.
struct Trial {
  bool ran = false;
  uint64_t digest = 0;
  float ms = -1.0f;
};

// Whether trial i (i > 0) gives other bits than the first: then, where the
// bits must match, it is not timed.
inline bool other_bits(const std::vector<Trial>& trials, size_t i) {
  return trials[i].ran && trials[0].ran && trials[i].digest != trials[0].digest;
}

// The index of the winner: the fastest timed trial, a tie going to the
// earlier (cuBLASLt's order); with same_bits, only among those with the
// first trial's digest. -1 when none qualifies (with same_bits, also when
// the first did not run: there are then no bits to keep).
inline int winner(const std::vector<Trial>& trials, bool same_bits) {
  if (same_bits && (trials.empty() || !trials[0].ran)) return -1;
  int best = -1;
  for (size_t i = 0; i < trials.size(); ++i) {
    const Trial& t = trials[i];
    if (!t.ran || t.ms < 0.0f) continue;
    if (same_bits && other_bits(trials, i)) continue;
    if (best < 0 || t.ms < trials[best].ms) best = static_cast<int>(i);
  }
  return best;
}

}  // namespace mpiformer::gemm_search
