"""CRC-32C (Castagnoli), the checksum mpiformer stores beside every tensor
of a checkpoint and every dataset of a shard (the attribute `crc32c`,
data/FORMAT.md and data/CHECKPOINT.md): polynomial 0x1EDC6F41 (reflected
0x82F63B78), initial value and final XOR 0xFFFFFFFF, over the dataset's
values as stored (little-endian, row-major). crc32c(b"123456789") is
0xE3069283, as src/io/crc32c.cpp computes it.

numpy alone, and fast enough for a checkpoint: the bytes are cut into many
lanes of equal length whose registers advance together, four bytes a step,
and the lanes' registers are then folded into one (a CRC is linear over
GF(2): the register after A then B is A's register carried over B's length,
XOR B's register from zero).
"""
import numpy as np

_POLY = 0x82F63B78
_MASK = 0xFFFFFFFF
# Lanes a block is cut into, and the bytes of a block: bounds the copies
# made while a large tensor is summed.
_MAX_LANES = 1 << 16
_BLOCK_BYTES = 64 << 20


def _byte_tables():
    """Slicing-by-4 tables: T[k][i] is byte i's register k bytes on."""
    t0 = np.zeros(256, dtype=np.uint32)
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ _POLY if c & 1 else c >> 1
        t0[i] = c
    tables = [t0]
    for _ in range(3):
        prev = tables[-1]
        tables.append((prev >> np.uint32(8)) ^ t0[prev & np.uint32(0xFF)])
    return tables


_T0, _T1, _T2, _T3 = _byte_tables()


def _multiply(a, b):
    """a * b modulo the polynomial, bit-reflected (a: int; b: int or uint32
    array)."""
    poly = np.uint32(_POLY) if isinstance(b, np.ndarray) else _POLY
    one = np.uint32(1) if isinstance(b, np.ndarray) else 1
    product = b ^ b  # zero of b's kind
    m = 1 << 31
    while m:
        if a & m:
            product = product ^ b
        b = (b >> one) ^ (poly * (b & one))
        m >>= 1
    return product


def _x_to_8n(n):
    """x^(8n) modulo the polynomial: what carries a register over n bytes."""
    power, square = 1 << 31, 1 << 23  # x^0, x^8 (bit 31 - k is x^k)
    while n:
        if n & 1:
            power = _multiply(square, power)
        square = _multiply(square, square)
        n >>= 1
    return power


def _registers(words):
    """Each lane's register from zero over its words: words (steps, lanes)
    uint32, little-endian."""
    reg = np.zeros(words.shape[1], dtype=np.uint32)
    m = np.uint32(0xFF)
    s8, s16, s24 = np.uint32(8), np.uint32(16), np.uint32(24)
    for row in words:
        x = reg ^ row
        reg = _T3[x & m] ^ _T2[(x >> s8) & m] ^ _T1[(x >> s16) & m] ^ _T0[x >> s24]
    return reg


def _register_from_zero(data):
    """The register from zero over `data` (uint8, contiguous)."""
    n = data.size
    if n == 0:
        return 0
    lanes = 1
    while lanes < _MAX_LANES and lanes * 4 * 64 <= n:
        lanes *= 2
    # Zeros before the bytes leave a register from zero unchanged: pad in
    # front to whole lanes of whole words.
    padded = -n % (4 * lanes)
    if padded:
        data = np.concatenate([np.zeros(padded, dtype=np.uint8), data])
    steps = data.size // (4 * lanes)
    words = data.view("<u4").reshape(lanes, steps).T.copy()  # (steps, lanes)
    reg = _registers(words)
    carry = steps * 4  # bytes per lane
    while reg.size > 1:  # fold pairs: (left carried over right's bytes) ^ right
        reg = _multiply(_x_to_8n(carry), reg[0::2]) ^ reg[1::2]
        carry *= 2
    return int(reg[0])


def crc32c_combine(crc_a, crc_b, length_b):
    """The CRC-32C of A then B from A's, B's and B's length in bytes."""
    return _multiply(_x_to_8n(length_b), crc_a) ^ crc_b


def crc32c(data, crc=0):
    """CRC-32C of `data` (bytes or a numpy array, taken as its bytes in
    C order), continuing from `crc`, the CRC-32C of what came before."""
    if isinstance(data, np.ndarray):
        if data.dtype.byteorder == ">":
            data = data.astype(data.dtype.newbyteorder("<"))
        flat = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    else:
        flat = np.frombuffer(bytes(data), dtype=np.uint8)
    for start in range(0, flat.size, _BLOCK_BYTES):
        block = flat[start:start + _BLOCK_BYTES]
        # The standard CRC of the block: its register from the all-ones
        # start (all-ones carried over it, XOR its register from zero),
        # complemented.
        block_crc = (_multiply(_x_to_8n(block.size), _MASK)
                     ^ _register_from_zero(block) ^ _MASK)
        crc = crc32c_combine(crc, block_crc, block.size)
    return crc


def seal(dataset):
    """Stores the CRC-32C of an h5py dataset's values as its attribute
    crc32c: after editing a checkpoint's or a shard's values with h5py,
    seal each dataset changed or added, or readers refuse it as damaged."""
    dataset.attrs["crc32c"] = np.uint32(crc32c(np.asarray(dataset[()], dtype=dataset.dtype)))
