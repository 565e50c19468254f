// CRC-32C (Castagnoli), the checksum stored beside every tensor of a
// checkpoint and every dataset of a shard (the attribute `crc32c`,
// data/FORMAT.md): polynomial 0x1EDC6F41 (reflected 0x82F63B78), initial
// value and final XOR 0xFFFFFFFF, over the values as stored. Unlike HDF5's
// Fletcher32 per chunk, it sees changes that cancel in a sum of words.
// crc32c("123456789") is 0xE3069283; analysis/mpiformer_checksum.py computes
// the same.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mpiformer {

// The CRC-32C of `crc`'s data followed by `data` (n bytes); `crc` is 0 for
// none. SSE4.2's crc32 instruction where the CPU has it, a table otherwise.
uint32_t crc32c_extend(uint32_t crc, const void* data, size_t n);

inline uint32_t crc32c(const void* data, size_t n) {
  return crc32c_extend(0, data, n);
}

// The table path alone, whatever the CPU: the tests compare the two.
uint32_t crc32c_extend_portable(uint32_t crc, const void* data, size_t n);

// The CRC-32C of A followed by B from A's, B's and B's length in bytes:
// the collective writer's ranks each sum their part of a tensor.
uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t length_b);

}  // namespace mpiformer
