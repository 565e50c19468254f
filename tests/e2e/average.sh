#!/usr/bin/env bash
# Checkpoint averaging and architecture presets on real shards (KJV):
#   - `train --arch tiny` trains, and config.ini records `arch = tiny` with
#     the preset's effective values;
#   - `mpiformer average --run RUNDIR --last 3` writes a checkpoint whose
#     every tensor is the mean of the three newest checkpoints' (numpy, in
#     float64, within 1 ulp of float32), with the newest's moments and step
#     and the inputs in averaged_from; the files form gives the same mean;
#     under mpirun rank 0 alone writes it;
#   - `train --average-checkpoints 3` leaves checkpoints/average_last_3.h5
#     with the same contents, and its last line names it;
#   - eval and generate take the average; training resumes from it with
#     `latest` naming a step file, and with --resume auto from the preset or
#     from config.ini;
#   - refusals are one line, exit 2, nothing written: inputs of another
#     model, a missing or damaged input, --last beyond the checkpoints,
#     --average-checkpoints beyond --keep-checkpoints, a preset of another
#     kind than the shards', a preset too big for the memory there is.
source "$(dirname "$0")/common.sh"
bin=$1 work=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$work" && mkdir -p "$work" && cd "$work"
mpirun=("${MPIEXEC:-mpirun}" -q)
failures=0 out=$work/out.txt err=$work/err.txt

"$root/data/extract-kjv.sh" kjv-all.txt >/dev/null
head -n 3000 kjv-all.txt >kjv.txt
"$bin" prepare --kind lm --input kjv.txt --out kjv --shards 1 --vocab-size 500 \
  --valid-lines 100 >prepare.log

# The tiny preset with fewer tokens a step: 6 steps, a checkpoint every 2.
train=(--arch tiny --model lm --data kjv --max-tokens 1024 --log-every 2 --eval-batches 2
  --threads 1 --checkpoint-every 2)
try "$bin" train "${train[@]}" --out run --steps 6 --average-checkpoints 3
check "train --arch tiny --average-checkpoints 3 exits 0" test "$rc" -eq 0
for line in "arch = tiny" "d-model = 128" "heads = 4" "d-ff = 512" "max-len = 128" \
  "dropout = 0.1"; do
  check "config.ini records '$line'" grep -qx "$line" run/config.ini
done
check "the last line names the average" \
  grep -q "^average: the mean of 3 checkpoint(s) (steps 6, 4, 2; [0-9]* parameters): run/checkpoints/average_last_3.h5" \
  <(tail -n 1 "$out")

try "$bin" average --run run --last 3 --out average.h5
check "average --run run --last 3 exits 0" test "$rc" -eq 0
check "average says what it wrote" grep -q "^mpiformer average: the mean of 3 checkpoint(s)" "$out"
try "$bin" average --out files.h5 run/checkpoints/step_00000002.h5 run/checkpoints/step_00000004.h5 \
  run/checkpoints/step_00000006.h5
check "average of three files exits 0" test "$rc" -eq 0
rm -f two-ranks.h5
try "${mpirun[@]}" -np 2 "$bin" average --run run --last 3 --out two-ranks.h5
check "average under mpirun -np 2 exits 0 with one line" test "$rc" -eq 0 -a "$(wc -l <"$out")" -eq 1

# Each tensor against numpy's mean; the files are alike but for their inputs' order.
if python3 - <<'PY' >"$out" 2>"$err"; then echo "PASS: $(cat "$out")"; else fail "averages' contents"; fi
import h5py
import numpy as np

ckpt = "run/checkpoints/step_{:08d}.h5"
inputs = [h5py.File(ckpt.format(s), "r") for s in (6, 4, 2)]
newest = inputs[0]


def tensors(f):
    return {g + "/" + n: np.asarray(f[g][n]) for g in ("params", "optimizer/m", "optimizer/v")
            for n in f[g]}


def attributes(f):
    return {k: f.attrs[k] for k in f.attrs}


cmd, at_end, files, two = (h5py.File(p, "r") for p in (
    "average.h5", "run/checkpoints/average_last_3.h5", "files.h5", "two-ranks.h5"))
worst = 0
for name in cmd["params"]:
    stacked = np.stack([np.asarray(f["params"][name], dtype=np.float64) for f in inputs])
    mean = stacked.mean(axis=0).astype(np.float32)
    got = np.asarray(cmd["params"][name])
    assert got.dtype == np.float32 and got.shape == mean.shape, name
    ulps = np.abs(got.view(np.int32).astype(np.int64) - mean.view(np.int32).astype(np.int64))
    worst = max(worst, int(ulps.max()))
    assert ulps.max() <= 1, f"{name}: {ulps.max()} ulps from numpy's mean"
    assert not np.array_equal(got, np.asarray(newest["params"][name])) or name.endswith(
        ("gamma", "beta", "bias")), f"{name}: the newest's, not a mean"
    assert np.abs(np.asarray(files["params"][name]) - got).max() <= np.spacing(np.abs(got)).max()
for group in ("optimizer/m", "optimizer/v"):
    for name in newest[group]:
        assert np.array_equal(np.asarray(cmd[group][name]), np.asarray(newest[group][name])), name
        assert np.array_equal(np.asarray(files[group][name]), np.asarray(newest[group][name]))
assert cmd.attrs["step"] == 6 and files.attrs["step"] == 6
assert cmd.attrs["averaged_from"].decode().split("\n") == [ckpt.format(s) for s in (6, 4, 2)]
assert files.attrs["averaged_from"].decode().split("\n") == [ckpt.format(s) for s in (2, 4, 6)]
for k, v in attributes(newest).items():
    assert np.array_equal(cmd.attrs[k], v), k
# train --average-checkpoints 3 and the command under 1 or 2 ranks: the same file contents.
for other in (at_end, two):
    a, b = tensors(cmd), tensors(other)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    assert attributes(cmd).keys() == attributes(other).keys()
    assert all(np.array_equal(cmd.attrs[k], other.attrs[k]) for k in attributes(cmd))
    assert np.array_equal(np.asarray(cmd["tokenizer"]), np.asarray(other["tokenizer"]))
print(f"every tensor within {worst} ulp of numpy's float64 mean of steps 6, 4, 2; moments and "
      "attributes the newest's; --average-checkpoints 3, -np 2 and the command agree bitwise")
PY

try "$bin" inspect average.h5
check "inspect lists the averaged checkpoints" grep -q "^averaged     run/checkpoints/step_00000006.h5" "$out"
try "$bin" eval --checkpoint average.h5 --data kjv --batches 2 --threads 1
check "eval takes the average" grep -q "^eval | loss [0-9.]*" "$out"
try "$bin" generate --checkpoint average.h5 --prompt "In the beginning" --max-new-tokens 4 --threads 1
check "generate takes the average" test "$rc" -eq 0 -a -s "$out"

# Resuming from an average: its step, data cursor and moments are the
# newest's; training goes on from the averaged weights, and `latest` keeps
# naming a step file.
try "$bin" train "${train[@]}" --out run --steps 8 --resume run/checkpoints/average_last_3.h5
check "train --resume AVERAGE continues at step 7" grep -q "^resumed from run/checkpoints/average_last_3.h5: step 6" "$out"
check "latest names step 8" grep -qx "step_00000008.h5" run/checkpoints/latest
# The preset again, or the run's config.ini (which records it and every
# value): --resume auto goes on with the same model.
try "$bin" train "${train[@]}" --out run --steps 10 --resume auto
check "--arch tiny --resume auto continues at step 9" grep -q "^resumed from run/checkpoints: step 8" "$out"
try "$bin" train --config run/config.ini --steps 12 --resume auto
check "--config RUNDIR/config.ini --resume auto continues at step 11" \
  grep -q "^resumed from run/checkpoints: step 10" "$out"

# Refusals: one line, exit 2, nothing written.
"$bin" train "${train[@]}" --out wide --steps 2 --d-ff 256 >wide.log
try "$bin" average --out refused.h5 run/checkpoints/step_00000006.h5 wide/checkpoints/step_00000002.h5
refused "another model" 2 "wide/checkpoints/step_00000002.h5: another model than run/checkpoints/step_00000006.h5, the newest input: --d-ff 256 (not 512)"
try "$bin" average --out refused.h5 run/checkpoints/step_00000006.h5 run/checkpoints/step_00000099.h5
refused "a missing input" 2 "run/checkpoints/step_00000099.h5: no such file"
head -c 20000 run/checkpoints/step_00000006.h5 >damaged.h5
try "$bin" average --out refused.h5 run/checkpoints/step_00000004.h5 damaged.h5
refused "a damaged input" 2 "damaged.h5: " "truncated"
try "$bin" average --run run --last 9 --out refused.h5
refused "--last beyond the checkpoints" 2 "--last: 9: run/checkpoints holds 5 checkpoint(s)"
try "$bin" average --out run/checkpoints/step_00000010.h5 run/checkpoints/step_00000006.h5
refused "an output named as a training checkpoint" 2 "--out: " "names a training checkpoint"
check "no refused average was written" test -z "$(compgen -G 'refused.h5*')"
try "$bin" train "${train[@]}" --out too-many --steps 2 --average-checkpoints 6
refused "--average-checkpoints beyond --keep-checkpoints" 2 \
  "--average-checkpoints: 6 exceeds --keep-checkpoints (5)"
check "the refused run left no directory" test ! -e too-many

# Presets against the data and the machine.
try "$bin" train --arch transformer-base --data kjv --out seq2seq --steps 1 --threads 1
refused "a seq2seq preset on lm shards" 2 "--model: seq2seq reads seq2seq shards" \
  "(--arch transformer-base sets --model seq2seq"
try "$bin" train --arch gpt2-small --model seq2seq --data kjv --out seq2seq --steps 1
refused "--model against the preset's kind" 2 "--model: seq2seq contradicts --arch gpt2-small"
try "$bin" train --arch nope --data kjv --out seq2seq --steps 1
refused "an unknown preset" 2 "--arch: expected gpt2-small, gpt2-medium, transformer-base" "got 'nope'"
try_memory_kb=2097152 try "$bin" train --arch gpt2-medium --data kjv --out medium --steps 1 \
  --threads 1
refused "gpt2-medium in 2 GiB" 2 "mpiformer train: the model needs about" "ulimit -v"
try "$bin" train --arch list
check "train --arch list prints the table" grep -q "^  transformer-big   " "$out"

exit_on_failures
echo "PASS: average.sh"
