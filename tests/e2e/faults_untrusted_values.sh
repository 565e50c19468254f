#!/usr/bin/env bash
# Values read from files are held to the rules of the flags, and bad data in
# the user's files is one line, exit 2 (docs/DESIGN.md section 8):
#   a checkpoint's config with a value its flag would refuse (heads 0, heads
#   not dividing d-model, layers -1, d-model 1e9), for eval (1 rank and
#   mpirun -np 2), generate and average; a model from a checkpoint too big
#   for memory, refused by the estimate;
#   sizes a file declares beyond what it can hold (a shard's /tokens of
#   3 x 10^8 ids, a /tokenizer of 10^12 bytes, a checkpoint tensor of 10^12
#   floats, a progress window's counts), refused before allocating;
#   a damaged shard, an id out of range and an int64 id past int32, naming
#   file, dataset, position and the value as stored (1 rank and -np 2);
#   training ids that are mostly reserved ids (a warning) or all of them
#   (refused);
#   a shard's and a checkpoint's strings (escape sequences, a forged line)
#   printed escaped by inspect and in messages;
#   a --config that starts with a UTF-8 byte order mark (read), an --out
#   with a line break (refused);
#   too few file descriptors (ulimit -n 20: one line of ours, exit 2, on 1
#   rank and on each rank of mpirun -np 2; a low soft limit is raised). With
#   the limit on mpirun itself, mpirun fails before mpiformer starts: not
#   tested here.
source "$(dirname "$0")/common.sh"
bin=$1 work=$2
rm -rf "$work" && mkdir -p "$work" && cd "$work"
failures=0 out=$work/out.txt err=$work/err.txt
mpirun=("${MPIEXEC:-mpirun}" -q)
try_seconds=60
# A reader that believes a declared size fails fast instead of swapping.
try_memory_kb=$((3 * 1024 * 1024))

grep -v '^[[:space:]]*$' /usr/share/common-licenses/GPL-3 | sed -n 1,400p >text.txt
timeout 300 "$bin" prepare --input text.txt --out shards --vocab-size 200 --shards 2 \
  --valid-lines 20 >prepare.log
lm=(--model lm --layers 1 --d-model 32 --heads 2 --d-ff 64 --max-len 64 --max-tokens 512
  --threads 1)
timeout 300 "$bin" train "${lm[@]}" --data shards --out run --steps 2 >train.log
ckpt=run/checkpoints/step_00000002.h5

# with_config KEY VALUE OUT: a copy of the checkpoint whose config says KEY = VALUE.
with_config() {
  cp "$ckpt" "$3"
  timeout 60 python3 - "$@" <<'PY'
import re
import sys

import h5py
import numpy as np

key, value, path = sys.argv[1:4]
with h5py.File(path, "r+") as f:
    ini = f.attrs["config"]
    ini = ini.decode() if isinstance(ini, bytes) else str(ini)
    ini, n = re.subn(r"(?m)^%s = .*$" % re.escape(key), "%s = %s" % (key, value), ini)
    assert n == 1, key
    del f.attrs["config"]
    f.attrs["config"] = np.bytes_(ini.encode())
PY
}

# ---- 1. a checkpoint's config keeps the rules of train's flags
for case in "heads 0 must be positive; got 0" \
  "heads 3 must divide --d-model (32); got 3" \
  "layers -1 must be positive; got -1" \
  "d-model 1000000000 must be at most 16777216; got 1000000000"; do
  read -r key value reason <<<"$case"
  with_config "$key" "$value" "bad-$key-$value.h5"
  line="bad-$key-$value.h5: config key '$key' = $value: $reason"
  try "$bin" eval --checkpoint "bad-$key-$value.h5" --data shards --threads 1
  refused "eval, config $key = $value" 2 "mpiformer eval: --checkpoint: $line"
  try "$bin" generate --checkpoint "bad-$key-$value.h5" --prompt "the" --max-new-tokens 2
  refused "generate, config $key = $value" 2 "mpiformer generate: --checkpoint: $line"
done
try "${mpirun[@]}" -np 2 "$bin" eval --checkpoint bad-heads-0.h5 --data shards --threads 1
refused "eval -np 2, config heads = 0" 2 \
  "mpiformer eval: --checkpoint: bad-heads-0.h5: config key 'heads' = 0: must be positive"
try "$bin" average --out avg.h5 bad-heads-0.h5 "$ckpt"
refused "average, config heads = 0" 2 "bad-heads-0.h5: config key 'heads' = 0: must be positive"
check "a refused average writes nothing" test ! -e avg.h5
# The flag says the same.
try "$bin" train --model lm --layers 1 --d-model 32 --heads 3 --data shards --out never
refused "train --heads 3" 2 "mpiformer train: --heads: must divide --d-model (32); got 3"
# A model too big for memory is the estimate's refusal, in one line.
with_config d-model 100000 huge-model.h5
try "$bin" eval --checkpoint huge-model.h5 --data shards --threads 1
refused "eval of a model too big for memory" 2 "mpiformer eval: --max-tokens: the model needs about"

# ---- 2. declared sizes against the file, before anything is allocated
cp -r shards declared
timeout 60 python3 - <<'PY'
import h5py

# Chunked datasets whose chunks were never written: they read as fill values.
with h5py.File("declared/train-00000.h5", "r+") as f:
    del f["tokens"]
    f.create_dataset("tokens", shape=(300000000,), dtype="<u2", chunks=(65536,), fletcher32=True)
with h5py.File("declared/train-00001.h5", "r+") as f:
    del f["tokenizer"]
    f.create_dataset("tokenizer", shape=(10**12,), dtype="u1", chunks=(65536,), fletcher32=True)
PY
try "$bin" inspect declared/train-00000.h5
refused "inspect of a shard declaring 3e8 ids" 2 \
  "declared/train-00000.h5: /tokens declares 300000000 elements of 2 bytes, more than the"
try "$bin" inspect declared/train-00001.h5
refused "inspect of a shard declaring a 1e12-byte tokenizer" 2 \
  "declared/train-00001.h5: /tokenizer declares 1000000000000 elements of 1 bytes"
try "$bin" train "${lm[@]}" --data declared --out never
refused "train on a shard declaring more than it holds" 2 "mpiformer train: --data: declared/" \
  "declares"
cp "$ckpt" huge-tensor.h5
timeout 60 python3 - <<'PY'
import h5py

with h5py.File("huge-tensor.h5", "r+") as f:
    del f["params/embed.tokens"]
    f["params"].create_dataset("embed.tokens", shape=(10**6, 10**6), dtype="<f4",
                               chunks=(64, 64), fletcher32=True)
PY
try "$bin" eval --checkpoint huge-tensor.h5 --data shards --threads 1
refused "eval of a checkpoint declaring a 1e12-float tensor" 2 \
  "mpiformer eval: --checkpoint: huge-tensor.h5: /params/embed.tokens declares" \
  "1000000000000 elements of 4 bytes"
try "$bin" inspect huge-tensor.h5
refused "inspect of a checkpoint declaring a 1e12-float tensor" 2 \
  "huge-tensor.h5: /params/embed.tokens declares 1000000000000 elements"
mkdir -p window/checkpoints
cp run/config.ini run/metrics.h5 window/ && cp "$ckpt" window/checkpoints/
echo step_00000002.h5 >window/checkpoints/latest
timeout 60 python3 - <<'PY'
import h5py
import numpy as np

with h5py.File("window/checkpoints/step_00000002.h5", "r+") as f:
    text = f.attrs["progress_window"].decode()
    head, _, rest = text.split("\n", 2)
    del f.attrs["progress_window"]
    f.attrs["progress_window"] = np.bytes_(f"{head}\nranks 2000000000 labels 0\n{rest}".encode())
PY
try "$bin" train "${lm[@]}" --data shards --out window --steps 4 --resume auto
refused "resume of a progress window declaring 2e9 ranks" 2 \
  "mpiformer train: window/checkpoints/step_00000002.h5: the checkpoint's progress_window:" \
  "'ranks 2000000000 labels 0' declares"

# ---- 3. damaged and out-of-range shards: the user's data, exit 2
# forge DIR PYTHON: a copy of the shard set, changed by PYTHON (f:
# train-00001.h5) and its /tokens sealed (their CRC-32C stored again), so
# that the values are the fault.
forge() {
  cp -r shards "$1"
  timeout 60 python3 -c "import h5py, numpy as np
from mpiformer_checksum import seal
with h5py.File('$1/train-00001.h5', 'r+') as f:
    $2
    seal(f['tokens'])"
}
forge range 'f["tokens"][50] = 500'
forge wide 't = f["tokens"][:].astype(np.int64); t[100] = 2**32 + 10; del f["tokens"]
    f.create_dataset("tokens", data=t, chunks=True, fletcher32=True)'
cp -r shards damaged
timeout 60 python3 - <<'PY'
import h5py

path = "damaged/train-00001.h5"
with h5py.File(path, "r") as f:
    offset = f["tokens"].id.get_chunk_info(0).byte_offset + 100
with open(path, "r+b") as g:
    g.seek(offset)
    byte = g.read(1)[0]
    g.seek(offset)
    g.write(bytes([byte ^ 0xFF]))
PY
for ranks in 1 2; do
  launch=("$bin")
  [[ $ranks -eq 1 ]] || launch=("${mpirun[@]}" -np 2 "$bin")
  try "${launch[@]}" train "${lm[@]}" --data range --out never
  refused "train, an id out of range, $ranks rank(s)" 2 \
    "mpiformer train: --data: range/train-00001.h5: token id 500 at position 50 of /tokens" \
    "is not below vocab_size 200"
  try "${launch[@]}" train "${lm[@]}" --data wide --out never
  refused "train, an int64 id past int32, $ranks rank(s)" 2 \
    "mpiformer train: --data: wide/train-00001.h5: token id 4294967306 at position 100 of /tokens"
  try "${launch[@]}" train "${lm[@]}" --data damaged --out never
  refused "train, a damaged chunk, $ranks rank(s)" 2 \
    "mpiformer train: --data: damaged/train-00001.h5: truncated or corrupt" "Fletcher32"
done
try "${mpirun[@]}" -np 2 "$bin" train "${lm[@]}" --data damaged --sharding file --out never
refused "train --sharding file, a damaged chunk one rank reads" 2 \
  "mpiformer train: --data: damaged/train-00001.h5: truncated or corrupt"
check "no run directory is left by a refused start" test ! -e never

# ---- 4. training ids that are reserved ids
for share in 1.0 0.7; do
  cp -r shards "pad-$share"
  timeout 60 python3 - "$share" <<'PY'
import glob
import sys

import h5py
from mpiformer_checksum import seal

share = float(sys.argv[1])
for path in glob.glob(f"pad-{sys.argv[1]}/train-*.h5"):
    with h5py.File(path, "r+") as f:
        t = f["tokens"][:]
        t[: int(len(t) * share)] = 0  # pad
        f["tokens"][:] = t
        seal(f["tokens"])
PY
done
try "$bin" train "${lm[@]}" --data pad-1.0 --out never --steps 2
refused "train on all-pad ids" 2 \
  "mpiformer train: --data: 100% of the training ids of pad-1.0 are reserved ids" \
  "at least 1% must be data symbols"
try "${mpirun[@]}" -np 2 "$bin" train "${lm[@]}" --data pad-1.0 --out never --steps 2
refused "train -np 2 on all-pad ids" 2 "100% of the training ids of pad-1.0 are reserved ids"
try "$bin" train "${lm[@]}" --data pad-0.7 --out mostly-pad --steps 2
check "train on 70% pad ids runs (exit $rc)" test "$rc" -eq 0
refused "train on 70% pad ids warns in one line" 0 \
  "% of the training ids of pad-0.7 are reserved ids (pad, bos, eos, unk, mask or sep)"

# ---- 5. a file's strings are printed escaped
cp shards/train-00000.h5 forged.h5
cp "$ckpt" forged-ckpt.h5
cp shards/train-00000.h5 forged-format.h5
timeout 60 python3 - <<'PY'
import h5py
import numpy as np

line = b"x\x1b[2J\x1b]0;title\x07\nfinal eval | loss 0.0001 | acc 100.00%"
with h5py.File("forged.h5", "r+") as f:
    del f.attrs["origin"]
    f.attrs["origin"] = np.bytes_(line)
with h5py.File("forged-ckpt.h5", "r+") as f:
    ini = f.attrs["config"].decode()
    del f.attrs["config"]
    f.attrs["config"] = np.bytes_(ini.encode() + b"# " + line + b"\n")
with h5py.File("forged-format.h5", "r+") as f:
    del f.attrs["format"]
    f.attrs["format"] = np.bytes_(b"\x1b[31mevil\nfinal eval | acc 100%")
PY
esc=$(printf '\033')
# no_line_starting TEXT FILE: no line of FILE starts with TEXT.
no_line_starting() { ! grep -q "^$1" "$2"; }
for file in forged.h5 forged-ckpt.h5; do
  try "$bin" inspect "$file"
  check "inspect $file (exit $rc)" test "$rc" -eq 0
  check "inspect $file prints no escape byte" not_in "$esc" "$out"
  check "inspect $file forges no line" no_line_starting "final eval" "$out"
  check "inspect $file shows the text escaped" grep -qF 'x\x1b[2J\x1b]0;title\x07' "$out"
  # An attribute is one line; a config, of many, is printed indented.
  [[ $file != forged.h5 ]] ||
    check "inspect $file shows the line break escaped" grep -qF '\x07\nfinal eval' "$out"
done
try "$bin" inspect forged-format.h5
refused "inspect of a shard whose format is forged" 2 \
  "not an mpiformer shard (format is '\x1b[31mevil\nfinal eval | acc 100%')"

# ---- 6. --config with a byte order mark; --out with a line break
printf '\xef\xbb\xbfmodel = lm\nlayers = 1\nd-model = 32\nheads = 2\nd-ff = 64\n' >bom.ini
try "$bin" train --config bom.ini --synthetic copy --max-len 32 --max-tokens 256 --steps 2 \
  --threads 1 --out bom-run
check "a --config starting with a byte order mark is read (exit $rc: $(head -c 200 "$err"))" \
  test "$rc" -eq 0
try "$bin" train --config bom.ini --synthetic copy --max-len 32 --steps 2 --out $'line\nbreak'
refused "--out with a line break" 2 \
  "mpiformer train: --out: a path with a line break cannot be recorded in the run's config.ini"
check "nothing is made for an --out with a line break" test ! -e $'line\nbreak'

# ---- 7. too few file descriptors
synthetic=(--model lm --synthetic copy --layers 1 --d-model 32 --heads 2 --d-ff 64 --max-len 32
  --max-tokens 256 --steps 2 --threads 1)
try bash -c 'ulimit -n 20 && exec "$@"' - "$bin" train "${synthetic[@]}" --out few-files
refused "ulimit -n 20, 1 rank" 2 \
  "mpiformer: only 20 files may be open (ulimit -n; the hard limit is 20)"
try "${mpirun[@]}" -np 2 bash -c 'ulimit -n 20 && exec "$@"' - "$bin" train "${synthetic[@]}" \
  --out few-files
refused "ulimit -n 20 on each of 2 ranks" 2 "mpiformer: only 20 files may be open"
check "no run directory with too few files" test ! -e few-files
try bash -c 'ulimit -Sn 20 && exec "$@"' - "$bin" train "${synthetic[@]}" --out soft-limit
check "a low soft limit is raised (exit $rc: $(head -c 300 "$err"))" test "$rc" -eq 0

exit_on_failures
echo "PASS: faults_untrusted_values"
