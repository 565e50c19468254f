#!/usr/bin/env bash
# Inputs of `prepare` whose sizes or values cannot be trusted, each refused
# with one line naming the flag and the file, exit 2, before --out exists
# (docs/DESIGN.md section 8): image labels far above the number of images,
# an .npz member that inflates past its array (a zip bomb) or declares an
# array its bytes cannot hold, images of no pixels, float images, label
# weights that are not plain numbers in [0, 1], label names that are not
# UTF-8 text, and a directory given as --labels. A held-out image split cut
# down says so, as for text. Each prepare runs under a 2 GB address-space
# limit, so a reader that believes a size fails fast instead of swapping.
source "$(dirname "$0")/common.sh"
bin=$1 work=$2
rm -rf "$work" && mkdir -p "$work" && cd "$work"
failures=0 out=$work/out.txt err=$work/err.txt

try_memory_kb=2000000  # `try` (common.sh) runs each command under 2 GB

# refused_image NAME NEEDLE...: prepare --kind image of NAME.npz (or NAME
# when it has a suffix) is refused and leaves no --out.
refused_image() {
  local file=$1
  shift
  [[ $file == *.* ]] || file=$file.npz
  try "$bin" prepare --kind image --input "$file" --out "out-$file" --shards 1
  refused "$file" 2 "--input: $file" "$@"
  check "$file: no --out is left behind" test ! -e "out-$file"
}

# ---- image files: arrays with a fault each, and an .npz written by hand
python3 - <<'EOF'
import struct
import zlib

import h5py
import numpy as np

rng = np.random.RandomState(0)
images = rng.randint(0, 256, (200, 8, 8)).astype(np.uint8)
labels = np.arange(200) % 10
np.savez("ok.npz", images=images, labels=labels)
for name, value in [("label-5e7", 50_000_000), ("label-2p40", 2**40), ("label-2p31", 2**31 + 5)]:
    bad = labels.copy()
    bad[7] = value
    np.savez(name, images=images, labels=bad)
np.savez("no-rows.npz", images=np.zeros((200, 0, 8), np.uint8), labels=labels)
np.savez("no-channels.npz", images=np.zeros((200, 8, 8, 0), np.uint8), labels=labels)
np.savez("float.npz", images=images.astype(np.float64), labels=labels)
with h5py.File("float.h5", "w") as f:
    f["images"] = images.astype(np.float64)
    f["labels"] = labels
# 64 TiB of images declared, none stored: HDF5 fills chunks never written.
with h5py.File("huge.h5", "w") as f:
    f.create_dataset("images", shape=(2**40, 8, 8), dtype=np.uint8, chunks=(1, 8, 8))
    f["labels"] = labels
names = [str(k) for k in range(10)]
for name, bad in [("name-nul", b"a\x00b"), ("name-utf8", b"\xff\xfe"), ("name-space", b"cat dog")]:
    np.savez(name, images=images, labels=labels,
             label_names=np.array([n.encode() for n in names[:9]] + [bad]))
np.savez("name-newline", images=images, labels=labels, label_names=np.array(names[:9] + ["a\nb"]))


def npy_header(shape, descr="|u1"):
    header = "{'descr': '%s', 'fortran_order': False, 'shape': %r, }" % (descr, shape)
    header = header.encode("latin1")
    header += b" " * (63 - (10 + len(header)) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header


def write_zip(path, members):
    """members: (name, deflated bytes, size it inflates to, crc)."""
    blob, directory = b"", b""
    for name, data, size, crc in members:
        name = name.encode()
        zip64 = size >= 0xFFFFFFFF
        extra = struct.pack("<HHQQ", 1, 16, size, len(data)) if zip64 else b""
        sizes = (0xFFFFFFFF, 0xFFFFFFFF) if zip64 else (len(data), size)
        common = struct.pack("<HHHHHIII", 45, 0, 8, 0, 0x21, crc, *sizes)
        directory += (struct.pack("<IH", 0x02014B50, 45) + common +
                      struct.pack("<HHHHHII", len(name), len(extra), 0, 0, 0, 0, len(blob)) +
                      name + extra)
        blob += struct.pack("<I", 0x04034B50) + common + struct.pack("<HH", len(name),
                                                                     len(extra)) + name + extra
        blob += data
    end = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(members), len(members), len(directory),
                      len(blob), 0)
    open(path, "wb").write(blob + directory + end)


def member(name, raw):
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    return (name, c.compress(raw) + c.flush(), len(raw), zlib.crc32(raw))


labels_npy = member("labels.npy", npy_header((200,), "<i8") + labels.astype("<i8").tobytes())

# A bomb: the images' header declares 200 8x8 images, the member inflates
# to 3 GiB. Identical flushed blocks of zeros make it in a moment.
c = zlib.compressobj(9, zlib.DEFLATED, -15)
head = npy_header((200, 8, 8)) + images.tobytes()
data = c.compress(head) + c.flush(zlib.Z_FULL_FLUSH)
zeros = b"\0" * 2**20
block = c.compress(zeros) + c.flush(zlib.Z_FULL_FLUSH)
assert c.compress(zeros) + c.flush(zlib.Z_FULL_FLUSH) == block
count = 3 * 1024
data += block * count + c.flush()
crc = zlib.crc32(head)
for _ in range(count):
    crc = zlib.crc32(zeros, crc)
write_zip("bomb.npz", [("images.npy", data, len(head) + count * 2**20, crc), labels_npy])

# Headers declaring arrays their few compressed bytes cannot hold: 1 GB,
# and 64 TiB (a Zip64 member that says so too).
for name, shape in [("declares-1g", (100000, 100, 100)), ("declares-64t", (2**40, 8, 8))]:
    raw = npy_header(shape) + images.tobytes()
    _, data, _, crc = member("images.npy", raw)
    size = len(raw) - images.nbytes + shape[0] * shape[1] * shape[2]
    write_zip(name + ".npz", [("images.npy", data, size, crc), labels_npy])
EOF

try "$bin" prepare --kind image --input ok.npz --out ok --shards 1
check "a sound .npz prepares (exit $rc: $(head -c 300 "$err"))" test "$rc" -eq 0

# labels far above the number of images, which would be as many labels
refused_image label-5e7 "labels[7] = 50000000 is not below the number of images (200)"
refused_image label-2p40 "labels[7] = 1099511627776 is not below the number of images (200)"
refused_image label-2p31 "labels[7] = 2147483653 is not below the number of images (200)"

# a zip bomb, and arrays declared larger than their bytes can hold
refused_image bomb "bomb.npz:images.npy: inflates to more than the 12800 bytes of the" \
  "(200, 8, 8) uint8 array its .npy header declares; not inflated further"
refused_image declares-1g "declares-1g.npz:images.npy: declares a (100000, 100, 100) uint8" \
  "array of 1000000000 bytes, more than its" "compressed bytes can inflate to"
refused_image declares-64t "declares-64t.npz:images.npy: declares a (1099511627776, 8, 8) uint8" \
  "array of 65536.0 GiB, more than the"
refused_image huge.h5 "huge.h5:/images: declares a (1099511627776, 8, 8) uint8 array of" \
  "65536.0 GiB, more than the"

# images of no pixels, in both layouts
refused_image no-rows "'images' of shape (200, 0, 8) are empty; an image needs at least one pixel"
refused_image no-channels "'images' of shape (200, 8, 8, 0) are empty"

# float images, named as such from either kind of file
refused_image float "'images' must hold uint8 pixels; got float64"
refused_image float.h5 "'images' must hold uint8 pixels; got float64"

# label names that are not one word of UTF-8 text
refused_image name-nul "'label_names' entry 9 'a\\x00b' holds control character 0x00 at byte 2"
refused_image name-utf8 "'label_names' entry 9 '\\xff\\xfe' is not UTF-8 (byte 0xff at byte 1)"
refused_image name-space "'label_names' entry 9 'cat dog' holds white space at byte 4"
refused_image name-newline "'label_names' entry 9 'a\\nb' holds control character 0x0a"

# a held-out split cut down to a tenth says so, as it does for text
try "$bin" prepare --kind image --input ok.npz --out capped --shards 1 --valid-lines 100 \
  --test-lines 50
check "a capped image split prepares (exit $rc)" test "$rc" -eq 0
check "a capped --valid-lines is named" grep -qF \
  "mpiformer prepare: warning: --valid-lines 100: holding out 20 images, a tenth of the 200 images of ok.npz" "$err"
check "a capped --test-lines is named" grep -qF \
  "mpiformer prepare: warning: --test-lines 50: holding out 20 images" "$err"

# ---- classify: label weights and names
grep -v '^[[:space:]]*$' /usr/share/common-licenses/GPL-3 >gpl.txt
head -n 100 gpl.txt >text.txt
# labels.txt: WORD on line 3 of 100 lines of labels.
labels_with() {
  {
    printf 'b c\nc\n%s d\n' "$1"
    for _ in $(seq 97); do echo "b d"; done
  } >labels.txt
}
cases=0
refused_labels() {
  local what=$1
  shift
  cases=$((cases + 1))
  try "$bin" prepare --kind classify --input text.txt --labels labels.txt --out "labels-$cases" \
    --shards 1 --vocab-size 200
  refused "$what" 2 "--labels: labels.txt:3: " "$@"
  check "$what: no --out is left behind" test ! -e "labels-$cases"
}
labels_with "a:1e400"
refused_labels "weight 1e400" "weight 1e400 of 'a' is not in [0, 1]"
labels_with "a:0x1p-1"
refused_labels "weight 0x1p-1" "weight '0x1p-1' of 'a' is not a decimal number"
labels_with "a:0.5abc"
refused_labels "weight 0.5abc" "weight '0.5abc' of 'a' is not a decimal number"
labels_with "a:"
refused_labels "an empty weight" "'a:' has no weight after its ':'"
labels_with $'a\x01b'
refused_labels "a control character in a name" "label 'a\\x01b' holds control character 0x01"
labels_with $'\xc3\x28'
refused_labels "a name not UTF-8" "label '\\xc3(' is not UTF-8 (byte 0xc3 at byte 1)"
{
  printf 'b c\nc\na\0z d\n'
  for _ in $(seq 97); do echo "b d"; done
} >labels.txt
refused_labels "a NUL in a name" "label 'a\\x00z' holds control character 0x00 at byte 2"

# -0 is 0; a name whose last part starts with a digit (a debtag) is a name
labels_with "a:-0 interface::3d"
try "$bin" prepare --kind classify --input text.txt --labels labels.txt --out signed --shards 1 \
  --vocab-size 200
check "a weight of -0 and interface::3d prepare (exit $rc: $(head -c 300 "$err"))" test "$rc" -eq 0
if [[ $rc -eq 0 ]]; then
  check "-0 is stored as 0, interface::3d as a hard label" python3 - signed/train-00000.h5 <<'EOF'
import math
import sys

import h5py

with h5py.File(sys.argv[1], "r") as f:
    names = bytes(f["label_names"][:]).decode().split("\n")
    ids, weights = f["labels/ids"][:], f["labels/weights"][:]
    offsets = f["labels/offsets"][:]
line = [(names[ids[j]], weights[j]) for j in range(offsets[2], offsets[3])]
assert [n for n, _ in line] == ["a", "interface::3d", "d"], line
assert line[0][1] == 0.0 and math.copysign(1, line[0][1]) == 1, line
assert line[1][1] == 1.0, line
EOF
fi

# a directory where the labels file belongs
mkdir -p labels-dir
try "$bin" prepare --kind classify --input text.txt --labels labels-dir --out out-dir --shards 1 \
  --vocab-size 200
refused "--labels a directory" 2 "--labels: labels-dir: is a directory, not a file"
check "--labels a directory: no --out is left behind" test ! -e out-dir
labels_with "a"
try "$bin" prepare --kind classify --input text.txt --labels labels.txt --out out-dir --shards 1 \
  --vocab-size 200 --valid text.txt,labels-dir
refused "--valid with a directory of labels" 2 "--valid: labels-dir: is a directory, not a file"
check "--valid with a directory of labels: no --out is left behind" test ! -e out-dir

exit_on_failures
echo "all prepare input bound checks passed"
