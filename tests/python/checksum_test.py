"""analysis/mpiformer_checksum.py: CRC-32C's published check values and a
bit-by-bit reference at many lengths (the lanes, their padding and their
folding), continuing and combining sums, and the readers of
analysis/mpiformer_metrics.py refusing a dataset whose values differ from
its sum, or that lacks the sum its file promises, while seal() makes an
edit whole again."""

import os
import sys
import tempfile
import unittest

import h5py
import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "analysis"))
from mpiformer_checksum import crc32c, crc32c_combine, seal  # noqa: E402
from mpiformer_metrics import NotAsWritten, numbers  # noqa: E402


def bitwise(data):
    reg = 0xFFFFFFFF
    for byte in data:
        reg ^= byte
        for _ in range(8):
            reg = (reg >> 1) ^ 0x82F63B78 if reg & 1 else reg >> 1
    return reg ^ 0xFFFFFFFF


class Crc32cTest(unittest.TestCase):
    def test_check_values(self):
        self.assertEqual(crc32c(b"123456789"), 0xE3069283)
        self.assertEqual(crc32c(b""), 0)
        self.assertEqual(crc32c(bytes(32)), 0x8A9136AA)  # RFC 3720, B.4
        self.assertEqual(crc32c(b"\xff" * 32), 0x62A8AB43)

    def test_every_length_against_the_definition(self):
        rng = np.random.default_rng(7)
        for n in list(range(0, 70)) + [255, 256, 257, 1023, 4096, 4099, 65537, 262147]:
            data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
            self.assertEqual(crc32c(data), bitwise(data), n)

    def test_arrays_are_their_little_endian_bytes(self):
        values = np.arange(1000, dtype="<f4") / 7
        self.assertEqual(crc32c(values), crc32c(values.tobytes()))
        self.assertEqual(crc32c(values.astype(">f4")), crc32c(values.tobytes()))
        self.assertEqual(crc32c(values.reshape(10, 100)), crc32c(values.tobytes()))

    def test_continue_and_combine(self):
        data = np.random.default_rng(8).integers(0, 256, 100003, dtype=np.uint8).tobytes()
        whole = crc32c(data)
        for cut in (0, 1, 4096, 99999, len(data)):
            a, b = crc32c(data[:cut]), crc32c(data[cut:])
            self.assertEqual(crc32c(data[cut:], a), whole, cut)
            self.assertEqual(crc32c_combine(a, b, len(data) - cut), whole, cut)


class ReaderTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.dir.name, "x.h5")
        with h5py.File(self.path, "w") as f:
            f.attrs["checksum"] = np.bytes_(b"crc32c")
            d = f.create_dataset("w", data=np.arange(50, dtype="<f4"))
            seal(d)

    def tearDown(self):
        self.dir.cleanup()

    def test_a_sealed_dataset_reads(self):
        with h5py.File(self.path, "r") as f:
            np.testing.assert_array_equal(numbers(f["w"]), np.arange(50, dtype="<f4"))

    def test_a_changed_value_is_refused_until_sealed(self):
        with h5py.File(self.path, "r+") as f:
            f["w"][3] = 1e9
        with h5py.File(self.path, "r") as f, self.assertRaisesRegex(
                NotAsWritten, r"/w is damaged: its CRC-32C checksum is 0x[0-9a-f]{8} but"):
            numbers(f["w"])
        with h5py.File(self.path, "r+") as f:
            seal(f["w"])
        with h5py.File(self.path, "r") as f:
            self.assertEqual(numbers(f["w"])[3], 1e9)

    def test_a_promised_sum_must_be_there(self):
        with h5py.File(self.path, "r+") as f:
            del f["w"].attrs["crc32c"]
        with h5py.File(self.path, "r") as f, self.assertRaisesRegex(
                NotAsWritten, "/w has no 'crc32c' attribute"):
            numbers(f["w"])
        with h5py.File(self.path, "r+") as f:
            del f.attrs["checksum"]  # a file from before sums
        with h5py.File(self.path, "r") as f:
            self.assertEqual(len(numbers(f["w"])), 50)


if __name__ == "__main__":
    unittest.main()
