#include "src/io/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace mpiformer {

namespace {

constexpr uint32_t kPoly = 0x82F63B78;  // 0x1EDC6F41 bit-reflected

// Slicing-by-8: table k maps a byte to its register k bytes further on.
using Tables = std::array<std::array<uint32_t, 256>, 8>;

constexpr Tables make_tables() {
  Tables t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int bit = 0; bit < 8; ++bit) c = c & 1 ? (c >> 1) ^ kPoly : c >> 1;
    t[0][i] = c;
  }
  for (size_t k = 1; k < 8; ++k) {
    for (size_t i = 0; i < 256; ++i) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xFF];
  }
  return t;
}

constexpr Tables kTables = make_tables();

// The register (not complemented) over n bytes.
uint32_t register_portable(uint32_t reg, const unsigned char* p, size_t n) {
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);  // little-endian hosts only (x86-64, aarch64)
    word ^= reg;
    reg = kTables[7][word & 0xFF] ^ kTables[6][(word >> 8) & 0xFF] ^
          kTables[5][(word >> 16) & 0xFF] ^ kTables[4][(word >> 24) & 0xFF] ^
          kTables[3][(word >> 32) & 0xFF] ^ kTables[2][(word >> 40) & 0xFF] ^
          kTables[1][(word >> 48) & 0xFF] ^ kTables[0][word >> 56];
  }
  for (; n > 0; --n, ++p) reg = (reg >> 8) ^ kTables[0][(reg ^ *p) & 0xFF];
  return reg;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t register_sse42(uint32_t reg, const unsigned char* p,
                                                          size_t n) {
  uint64_t r = reg;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    r = _mm_crc32_u64(r, word);
  }
  reg = static_cast<uint32_t>(r);
  for (; n > 0; --n, ++p) reg = _mm_crc32_u8(reg, *p);
  return reg;
}

bool has_sse42() {
  static const bool has = (__builtin_cpu_init(), __builtin_cpu_supports("sse4.2"));
  return has;
}
#endif

// a * b modulo the polynomial, both bit-reflected (bit 31 is x^0).
uint32_t multiply(uint32_t a, uint32_t b) {
  uint32_t product = 0;
  for (uint32_t m = 1u << 31; m != 0; m >>= 1) {
    if (a & m) product ^= b;
    b = b & 1 ? (b >> 1) ^ kPoly : b >> 1;
  }
  return product;
}

// x^(8n) modulo the polynomial: what carries a register over n bytes.
uint32_t x_to_8n(uint64_t n) {
  uint32_t power = 1u << 31, square = 1u << 23;  // x^0, x^8
  for (; n != 0; n >>= 1) {
    if (n & 1) power = multiply(square, power);
    square = multiply(square, square);
  }
  return power;
}

}  // namespace

uint32_t crc32c_extend_portable(uint32_t crc, const void* data, size_t n) {
  return ~register_portable(~crc, static_cast<const unsigned char*>(data), n);
}

uint32_t crc32c_extend(uint32_t crc, const void* data, size_t n) {
#if defined(__x86_64__)
  if (has_sse42()) return ~register_sse42(~crc, static_cast<const unsigned char*>(data), n);
#endif
  return crc32c_extend_portable(crc, data, n);
}

uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t length_b) {
  return multiply(x_to_8n(length_b), crc_a) ^ crc_b;
}

}  // namespace mpiformer
