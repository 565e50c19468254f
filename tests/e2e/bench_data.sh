#!/usr/bin/env bash
# bench --data times train's own batches. On small lm, mlm, seq2seq and
# classify shards, a tiny model on the CPU:
#   - the timed steps' real, padded and target tokens in bench's JSON are
#     what train counts for the same steps (the progress window behind its
#     tok/s, pad-eff and `tokens`, which a checkpoint keeps exactly): bench's
#     warm-up steps are train's first steps, its timed ones the next;
#   - batch_shapes and startup_seconds are there and sane, padded >= real,
#     and tokens_per_s is real tokens over the timed steps' time;
#   - on 2 ranks (each its share of the global step) the same;
#   - --data's faults are one line and exit 2.
source "$(dirname "$0")/common.sh"
bin=$1 work=$2
rm -rf "$work" && mkdir -p "$work" && cd "$work"
launcher=${MPIEXEC:-$(command -v mpirun)}
mpirun() { "$launcher" -q -np "$@"; }
failures=0

# The corpus: the GPL's non-empty lines; seq2seq pairs each line with its
# words reversed, classify labels each line by its place.
awk 'NF && ++n <= 400' /usr/share/common-licenses/GPL-3 >text.txt
awk '{ for (i = NF; i > 0; i--) printf "%s%s", $i, (i > 1 ? " " : "\n") }' text.txt >reversed.txt
awk '{ n = NR % 3; print (n == 0 ? "law" : n == 1 ? "code user:0.5" : "user") }' text.txt >labels.txt
"$bin" prepare --kind lm --input text.txt --out lm --shards 1 --vocab-size 200 \
  --valid-lines 20 >prepare-lm.log
"$bin" prepare --kind seq2seq --input text.txt --target reversed.txt --out pairs --shards 1 \
  --tokenizer lm/tokenizer.model --valid-lines 20 >prepare-pairs.log
"$bin" prepare --kind classify --input text.txt --labels labels.txt --out tagged --shards 1 \
  --tokenizer lm/tokenizer.model --valid-lines 20 >prepare-tagged.log

# train logs every `warmup` steps and writes a checkpoint at step warmup +
# steps, before its next progress line (steps < warmup): that checkpoint
# keeps the window of the timed steps alone.
warmup=3 steps=2
checkpoint_step=$(printf '%08d' $((warmup + steps)))
tiny=(--layers 1 --d-model 32 --heads 2 --d-ff 64 --max-len 64 --max-tokens 256 --seed 3
  --threads 1)

# bench_and_train NAME RANKS KIND DIR [FLAGS...]: bench's JSON in NAME.json,
# and train of the same flags in run-NAME.
bench_and_train() {
  local name=$1 ranks=$2 kind=$3 data=$4
  shift 4
  out=$name.json err=$name.err
  if ! mpirun "$ranks" "$bin" bench --model "$kind" --data "$data" "${tiny[@]}" "$@" \
    --warmup-steps "$warmup" --steps "$steps" >"$out" 2>"$err"; then
    fail "$name: bench exited non-zero"
    return
  fi
  out=run-$name.log err=run-$name.log
  if ! mpirun "$ranks" "$bin" train --model "$kind" --data "$data" "${tiny[@]}" "$@" \
    --out "run-$name" --steps $((warmup + steps + 1)) --log-every "$warmup" \
    --checkpoint-every $((warmup + steps)) --eval-batches 1 >"$out" 2>&1; then
    fail "$name: train exited non-zero"
    return
  fi
  compare "$name" "$ranks" "run-$name/checkpoints/step_$checkpoint_step.h5"
}

# compare NAME RANKS CHECKPOINT: NAME.json against train's window.
compare() {
  out=$1.json err=$1.err
  local verdict
  if verdict=$(python3 - "$1.json" "$3" "$steps" "$2" <<'PY'
import json, sys
import h5py

line, checkpoint, steps, ranks = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
with open(line) as f:
    lines = f.read().splitlines()
assert len(lines) == 1, f"{len(lines)} lines on stdout"
b = json.loads(lines[0])
# ProgressWindow::save's text: a header, "ranks W labels L", then a row per
# rank of hexadecimal floats: loss, nll, tokens, correct, real tokens,
# padded tokens, ... (the figures of src/train/progress.cpp).
with h5py.File(checkpoint, "r") as h5:
    text = h5.attrs["progress_window"]
text = text.decode() if isinstance(text, bytes) else text
rows = [[float.fromhex(v) for v in row.split()] for row in text.splitlines()[2:]]
assert len(rows) == ranks, f"{len(rows)} rank rows in the window"
train = {"target_tokens": sum(r[2] for r in rows), "real_tokens": sum(r[4] for r in rows),
         "padded_tokens": sum(r[5] for r in rows)}
for field, count in train.items():
    assert b[field] == count, f"{field} {b[field]}, train counted {count:.0f}"
assert b["batches"] == "data" and b["ranks"] == ranks, b
assert b["padded_tokens"] >= b["real_tokens"] > 0, b
assert 1 <= b["batch_shapes"] <= steps * ranks, b
assert 0 < b["startup_seconds"] < 60, b
tok_s = b["real_tokens"] / (steps * b["step_ms"] / 1000)
assert abs(b["tokens_per_s"] / tok_s - 1) < 0.02, f"tokens_per_s {b['tokens_per_s']}, {tok_s}"
print(f"real {b['real_tokens']}, padded {b['padded_tokens']}, targets {b['target_tokens']}, "
      f"{b['batch_shapes']} shape(s), start-up {b['startup_seconds']} s")
PY
  ); then
    echo "PASS: $1: bench --data counts what train counts ($verdict)"
  else
    fail "$1: bench --data against train"
  fi
}

bench_and_train lm 1 lm lm
bench_and_train mlm 1 mlm lm
bench_and_train seq2seq 1 seq2seq pairs
bench_and_train classify 1 classify tagged --loss zlpr
bench_and_train lm-2ranks 2 lm lm

# bench_refuses WHAT NEEDLE ARGS...: bench ARGS is one line holding NEEDLE, exit 2.
bench_refuses() {
  local what=$1 needle=$2
  shift 2
  out=refused.out err=refused.err
  try "$bin" bench "$@"
  expect_one_line_error "$what" 2 "$needle" && echo "PASS: $what: $(cat "$err")"
}
bench_refuses "a missing --data" "mpiformer bench: --data: " --data no-such-dir
bench_refuses "--data with the synthetic shape" "mpiformer bench: --batch: not with --data" \
  --data lm --batch 4
bench_refuses "a data flag without --data" "mpiformer bench: --max-tokens: only with --data" \
  --max-tokens 256
bench_refuses "shards of another kind" "mpiformer bench: --model: " --model seq2seq --data lm \
  "${tiny[@]}"

exit_on_failures
