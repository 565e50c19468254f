#!/usr/bin/env bash
# Integrity beyond Fletcher32: every checkpoint tensor carries a CRC-32C
# (attribute crc32c, data/CHECKPOINT.md), metrics.h5's columns are
# Fletcher32-checksummed.
#   - checkpoints written by 1 rank, 2 ranks (collective) and 3 ranks with a
#     sharded optimizer promise their sums (root attribute checksum) and hold
#     the CRC-32C that analysis/mpiformer_checksum.py computes from every
#     dataset's values; the three runs' states are bitwise equal, so are
#     their sums (the ranks' parts combined);
#   - a change of three 16-bit words by +1, -2, +1 that Fletcher32 cannot
#     see (h5py reads it without a word, the values changed) is refused by
#     inspect, eval, train --resume on 1 and 2 ranks (the collective reader;
#     resume auto falls back to the checkpoint before), average and
#     export_hf.py: one line naming the tensor, exit 2 (resume: exit 0 from
#     the checkpoint before, the damage named);
#   - a promised sum that is missing is refused; a checkpoint written before
#     sums (no promise, no crc32c) still reads;
#   - a byte flipped in a metrics.h5 loss is refused by inspect, the
#     Python tools and train --resume: one line, exit 2.
#   - so is a shard whose ids were changed that way (train on 1 and 2 ranks).
source "$(dirname "$0")/common.sh"
bin=$1 work=$2
src=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$work" && mkdir -p "$work" && cd "$work"
failures=0 out=$work/out.txt err=$work/err.txt
mpirun=("${MPIEXEC:-mpirun}" -q)

tiny=(--model lm --synthetic copy --layers 1 --d-model 32 --heads 2 --d-ff 64 --vocab 40
  --max-len 32 --max-tokens 256 --log-every 5 --checkpoint-every 5 --threads 1
  --output-bias false)
# Six micro-batches a step on each: the same state, bit for bit.
"$bin" train "${tiny[@]}" --steps 10 --accum-steps 6 --out one >one.log
"${mpirun[@]}" -np 2 "$bin" train "${tiny[@]}" --steps 10 --accum-steps 3 --out two >two.log
"${mpirun[@]}" -np 3 "$bin" train "${tiny[@]}" --steps 10 --accum-steps 2 \
  --shard-optimizer true --out three >three.log
ckpt=checkpoints/step_00000010.h5

# ---- what the writers store
check "every dataset's crc32c is the CRC-32C of its values, on 1, 2 and 3 ranks" \
  python3 - one/$ckpt two/$ckpt three/$ckpt <<'PY'
import sys

import h5py
import numpy as np
from mpiformer_checksum import crc32c

sums = []
for path in sys.argv[1:]:
    with h5py.File(path, "r") as f:
        assert f.attrs["checksum"] == b"crc32c", (path, f.attrs.get("checksum"))
        found = {}

        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                stored = obj.attrs["crc32c"]
                assert stored.dtype == np.uint32, (path, name, stored.dtype)
                assert int(stored) == crc32c(obj[()]), (path, name)
                found[name] = int(stored)

        f.visititems(visit)
        assert len(found) > 10 and any(n.startswith("optimizer/v/") for n in found), found
        sums.append(found)
assert sums[0] == sums[1] == sums[2], "the ranks' sums differ"
print(f"{len(sums[0])} datasets, the same sums on 1, 2 and 3 ranks")
PY

# sum_blind_change FILE DATASET: changes three 16-bit words of DATASET's
# first chunk in FILE's bytes by +1, -2, +1 (Fletcher32 adds big-endian
# words and their running sums: both are unchanged); fails unless h5py
# still reads the dataset and its values changed.
sum_blind_change() {
  python3 - "$@" <<'PY'
import sys

import h5py
import numpy as np

path, name = sys.argv[1], sys.argv[2]
with h5py.File(path, "r") as f:
    before = f[name][()]
    info = f[name].id.get_chunk_info(0)
data = bytearray(open(path, "rb").read())
start = info.byte_offset
for at in range(start, start + info.size - 4 - 6, 2):
    words = [int.from_bytes(data[at + 2 * k:at + 2 * k + 2], "big") for k in range(3)]
    if words[0] < 0xFFF0 and words[1] > 0x10 and words[2] < 0xFFF0:
        for k, delta in enumerate((1, -2, 1)):
            data[at + 2 * k:at + 2 * k + 2] = (words[k] + delta).to_bytes(2, "big")
        break
else:
    sys.exit(f"{name}: no three words to change")
open(path, "r+b").write(data)
with h5py.File(path, "r") as f:
    after = f[name][()]  # Fletcher32 passes
if np.array_equal(before.view(np.uint8), after.view(np.uint8)):
    sys.exit(f"{name}: the values did not change")
PY
}

tensor=params/decoder.layers.0.mlp.fc.weight
cp one/$ckpt blind.h5
check "a change Fletcher32 cannot see (h5py reads it)" sum_blind_change blind.h5 /$tensor
damaged="/$tensor is damaged: its CRC-32C checksum is"

try "$bin" inspect blind.h5
refused "inspect of a Fletcher32-blind change" 2 "mpiformer inspect: blind.h5: $damaged"
try "$bin" average --out avg.h5 blind.h5 one/checkpoints/step_00000005.h5
refused "average of it" 2 "blind.h5: $damaged"
[[ ! -e avg.h5 ]] || fail "average wrote avg.h5 from a damaged input"
try python3 "$src/analysis/export_hf.py" blind.h5 blind-hf
refused "export_hf.py of it" 2 "blind.h5: $damaged"
[[ ! -e blind-hf ]] || fail "export_hf.py wrote blind-hf from a damaged input"

# train --resume auto: the newest checkpoint damaged, on 1 rank (the single
# reader) and 2 ranks (the collective one): the one before is used.
for ranks in 1 2; do
  rm -rf resume-$ranks && cp -r one resume-$ranks && cp blind.h5 resume-$ranks/$ckpt
  launch=()
  [[ $ranks -eq 1 ]] || launch=("${mpirun[@]}" -np "$ranks")
  try "${launch[@]}" "$bin" train "${tiny[@]}" --steps 12 --out resume-$ranks --resume auto
  if [[ $rc -ne 0 ]]; then
    fail "resume on $ranks rank(s) past a damaged newest checkpoint: exit $rc ($(cat "$err"))"
  elif grep -qF "skipping a damaged checkpoint: resume-$ranks/$ckpt: $damaged" "$err" &&
    grep -qF "resumed from resume-$ranks/checkpoints: step 5," "$out"; then
    echo "PASS: resume on $ranks rank(s) names the damage and resumes from step 5"
  else
    fail "resume on $ranks rank(s): $(cat "$err" "$out" | head -5)"
  fi
done
# Told to resume from it: one line, exit 2.
try "${mpirun[@]}" -np 2 "$bin" train "${tiny[@]}" --steps 12 --out from-blind --resume blind.h5
refused "train --resume of the damaged checkpoint, 2 ranks" 2 "blind.h5: $damaged"

# ---- a promised sum missing; a checkpoint from before sums
cp one/$ckpt unsealed.h5
python3 -c "import h5py; del h5py.File('unsealed.h5', 'r+')['$tensor'].attrs['crc32c']"
try "$bin" inspect unsealed.h5
refused "inspect of a checkpoint missing a promised sum" 2 \
  "/$tensor has no 'crc32c' attribute, which its file's 'checksum' attribute promises"
cp one/$ckpt older.h5
python3 - older.h5 <<'PY'
import sys

import h5py

with h5py.File(sys.argv[1], "r+") as f:
    del f.attrs["checksum"]
    f.visititems(lambda n, o: o.attrs.__delitem__("crc32c")
                 if isinstance(o, h5py.Dataset) else None)
PY
try "$bin" inspect older.h5
check "a checkpoint from before sums still reads (inspect: exit $rc)" test "$rc" -eq 0
try python3 "$src/analysis/export_hf.py" older.h5 older-hf
check "export_hf.py reads it too (exit $rc)" test "$rc" -eq 0

# ---- shards: three ids of /tokens changed by +1, -2, +1 (still valid ids)
make_bad=$(dirname "$bin")/tests/make_bad_shard
mkdir -p shards
"$make_bad" lm valid shards/train-00000.h5
"$make_bad" lm sum-blind-change shards/train-00001.h5
"$make_bad" lm valid shards/valid-00000.h5
for ranks in 1 2; do
  launch=()
  [[ $ranks -eq 1 ]] || launch=("${mpirun[@]}" -np "$ranks")
  try "${launch[@]}" "$bin" train --model lm --data shards --layers 1 --d-model 16 --heads 2 \
    --d-ff 32 --max-len 32 --max-tokens 256 --steps 2 --threads 1 --out never
  refused "train on a shard with a Fletcher32-blind change, $ranks rank(s)" 2 \
    "shards/train-00001.h5: /tokens is damaged: its CRC-32C checksum is"
done
check "no run directory is left by the refused start" test ! -e never

# ---- a flipped byte in a loss of metrics.h5
rm -rf flipped && cp -r one flipped
python3 - flipped/metrics.h5 <<'PY'
import sys

import h5py

with h5py.File(sys.argv[1], "r") as f:
    info = f["train/loss"].id.get_chunk_info(0)
with open(sys.argv[1], "r+b") as f:
    f.seek(info.byte_offset + 13)  # in the second row's float64
    byte = f.read(1)
    f.seek(info.byte_offset + 13)
    f.write(bytes([byte[0] ^ 0x20]))
PY
try "$bin" inspect flipped/metrics.h5
refused "inspect of a flipped loss" 2 "flipped/metrics.h5: truncated or corrupt" \
  "/train/loss" "Fletcher32"
try python3 "$src/analysis/plot_run.py" flipped -o flipped.png
refused "plot_run.py of a flipped loss" 2 "flipped/metrics.h5: truncated or corrupt"
[[ ! -e flipped.png ]] || fail "plot_run.py drew a flipped loss"
try python3 "$src/analysis/to_tensorboard.py" flipped
refused "to_tensorboard.py of a flipped loss" 2 "flipped/metrics.h5: truncated or corrupt"
try "$bin" train "${tiny[@]}" --steps 12 --out flipped --resume auto
refused "train --resume with a flipped loss" 2 "flipped/metrics.h5: truncated or corrupt" \
  "Fletcher32"

exit_on_failures
