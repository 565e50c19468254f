// CRC-32C: the published check value, the SSE4.2 path against the table
// path, combining parts as the collective writer does, and the sums of
// datasets stored narrower than they are held (int32 ids as uint16).
#include "src/io/crc32c.h"

#include <gtest/gtest.h>
#include <hdf5.h>

#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "src/io/dataset_checksum.h"

namespace mpiformer {
namespace {

std::vector<unsigned char> random_bytes(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<unsigned char> bytes(n);
  for (unsigned char& b : bytes) b = static_cast<unsigned char>(rng());
  return bytes;
}

// Bit by bit from the definition: the reference for both fast paths.
uint32_t crc32c_bitwise(const unsigned char* p, size_t n) {
  uint32_t reg = 0xFFFFFFFF;
  for (size_t i = 0; i < n; ++i) {
    reg ^= p[i];
    for (int bit = 0; bit < 8; ++bit) reg = reg & 1 ? (reg >> 1) ^ 0x82F63B78 : reg >> 1;
  }
  return ~reg;
}

TEST(Crc32c, CheckValues) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c("", 0), 0u);
  // RFC 3720 (iSCSI), B.4: 32 bytes of zeros, and of 0xFF.
  const std::vector<unsigned char> zeros(32, 0), ones(32, 0xFF);
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
  EXPECT_EQ(crc32c(ones.data(), ones.size()), 0x62A8AB43u);
}

TEST(Crc32c, FastPathsMatchTheDefinitionAtEveryLengthAndAlignment) {
  const std::vector<unsigned char> bytes = random_bytes(300, 1);
  for (size_t start = 0; start < 8; ++start) {
    for (size_t n = 0; start + n <= bytes.size(); n += 1 + n / 8) {
      const uint32_t want = crc32c_bitwise(bytes.data() + start, n);
      EXPECT_EQ(crc32c(bytes.data() + start, n), want) << start << " " << n;
      EXPECT_EQ(crc32c_extend_portable(0, bytes.data() + start, n), want) << start << " " << n;
    }
  }
}

TEST(Crc32c, ExtendAndCombineEqualTheWhole) {
  const std::vector<unsigned char> bytes = random_bytes(100003, 2);
  const uint32_t whole = crc32c(bytes.data(), bytes.size());
  for (const size_t cut : {size_t{0}, size_t{1}, size_t{4096}, size_t{99999}, bytes.size()}) {
    const uint32_t a = crc32c(bytes.data(), cut);
    const uint32_t b = crc32c(bytes.data() + cut, bytes.size() - cut);
    EXPECT_EQ(crc32c_extend(a, bytes.data() + cut, bytes.size() - cut), whole) << cut;
    EXPECT_EQ(crc32c_combine(a, b, bytes.size() - cut), whole) << cut;
  }
  // Three ranks' parts, chained.
  const uint32_t p0 = crc32c(bytes.data(), 10), p1 = crc32c(bytes.data() + 10, 50000),
                 p2 = crc32c(bytes.data() + 50010, bytes.size() - 50010);
  EXPECT_EQ(crc32c_combine(crc32c_combine(p0, p1, 50000), p2, bytes.size() - 50010), whole);
}

TEST(Crc32c, ChangesFletcher32CannotSeeChangeTheSum) {
  // +1, -2, +1 on three consecutive big-endian 16-bit words leaves both of
  // Fletcher32's sums as they were.
  std::vector<unsigned char> bytes = random_bytes(64, 3);
  bytes[11] = bytes[13] = bytes[15] = 0x40;  // low bytes of words 5, 6, 7: no carry
  const uint32_t before = crc32c(bytes.data(), bytes.size());
  bytes[11] += 1, bytes[13] -= 2, bytes[15] += 1;
  EXPECT_NE(crc32c(bytes.data(), bytes.size()), before);
}

TEST(Crc32c, StoredSumIsOfTheStoredType) {
  const hdf5::Faults faults = hdf5::Faults::of<std::runtime_error>("memory");
  const std::vector<int32_t> ids = {6, 7, 300, 65535, 0};
  std::vector<uint16_t> narrow(ids.begin(), ids.end());
  EXPECT_EQ(
      hdf5::stored_crc32c(ids.data(), H5T_NATIVE_INT32, H5T_STD_U16LE, ids.size(), faults, "ids"),
      crc32c(narrow.data(), narrow.size() * sizeof(uint16_t)));
  const std::vector<float> values = {1.5f, -2.0f, 3.25f};
  EXPECT_EQ(hdf5::stored_crc32c(values.data(), H5T_NATIVE_FLOAT, H5T_IEEE_F32LE, values.size(),
                                faults, "values"),
            crc32c(values.data(), values.size() * sizeof(float)));
}

TEST(Crc32c, VerifyReadSumsLittleEndianBytesWhateverTheStoredOrder) {
  const hdf5::Faults faults = hdf5::Faults::of<std::runtime_error>("memory");
  const hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  H5Pset_fapl_core(fapl, 1 << 16, 0);  // in memory, never on disk
  const hid_t file = H5Fcreate("in-memory.h5", H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
  ASSERT_GE(file, 0);
  const std::vector<int32_t> values = {1, -2, 300000, 7};
  const hsize_t n = values.size();
  const hid_t space = H5Screate_simple(1, &n, nullptr);
  const hid_t dset =
      H5Dcreate2(file, "big_endian", H5T_STD_I32BE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(H5Dwrite(dset, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), 0);
  hdf5::write_crc32c(dset, crc32c(values.data(), n * sizeof(int32_t)), faults);
  std::vector<int64_t> wide(n);  // read converted: the sum is of the stored values
  ASSERT_GE(H5Dread(dset, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, wide.data()), 0);
  EXPECT_NO_THROW(hdf5::verify_read(dset, wide.data(), H5T_NATIVE_INT64, n, "/big_endian", faults));
  H5Adelete(dset, "crc32c");
  hdf5::write_crc32c(dset, crc32c(values.data(), 8), faults);  // the sum of half of them
  EXPECT_THROW(hdf5::verify_read(dset, wide.data(), H5T_NATIVE_INT64, n, "/big_endian", faults),
               std::runtime_error);
  H5Dclose(dset);
  H5Sclose(space);
  H5Fclose(file);
  H5Pclose(fapl);
}

}  // namespace
}  // namespace mpiformer
