// Counter-based dropout mask: element `index` of `stream` is kept or dropped
// by a hash of (seed, stream, index) alone, so the backward pass regenerates
// the mask instead of storing it, and every backend and thread count agrees.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define MPIFORMER_HOST_DEVICE __host__ __device__
#else
#define MPIFORMER_HOST_DEVICE
#endif

namespace mpiformer {

// splitmix64 finaliser: a bijective 64-bit mix with good avalanche.
MPIFORMER_HOST_DEVICE inline uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// True when the element survives dropout with drop probability p.
MPIFORMER_HOST_DEVICE inline bool dropout_keep(uint64_t seed, uint64_t stream, uint64_t index,
                                               float p) {
  const uint64_t h = mix64(mix64(seed ^ mix64(stream)) + index);
  // top 24 bits as a uniform in [0, 1)
  const float u = static_cast<float>(h >> 40) * (1.0f / 16777216.0f);
  return u >= p;
}

}  // namespace mpiformer
