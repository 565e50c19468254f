#!/usr/bin/env bash
# analysis/to_tensorboard.py: a run on real shards over 2 ranks (label
# smoothing on, so loss and nll differ; an epoch and a hidden share are
# written), the same run's metrics without the label-figure columns
# (micro/macro P/R/F1), a synthetic run on 1 rank (no epoch, no hidden share)
# and a file as older versions wrote it (no nll, no elapsed_s, ...) are
# converted, and TensorBoard's own EventAccumulator reads back every column
# of /train and /eval but step as the tag GROUP/COLUMN with the file's steps
# and values (to float32), wall times from elapsed_s (0 without it), and the
# run's config as text; columns without a value are left out and said so.
# Converting again replaces the events (no point twice, one event file),
# also while a run trains (SWMR). A missing run directory or one without
# metrics.h5 is one line, exit 2, and nothing is converted. Skipped (exit
# 77) where the tensorboard package cannot be imported.
source "$(dirname "$0")/common.sh"
bin=$1 work=$2
src=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$work" && mkdir -p "$work" && cd "$work"
mpirun=("${MPIEXEC:-mpirun}" -q)
failures=0 out=$work/out.txt err=$work/err.txt
convert=(python3 "$src/analysis/to_tensorboard.py")

if ! python3 -c "import tensorboard.backend.event_processing.event_accumulator" 2>/dev/null; then
  echo "SKIP: the tensorboard package cannot be imported (python3 -m pip install tensorboard)"
  exit 77
fi

# A small English text every Debian system carries.
grep -v '^[[:space:]]*$' /usr/share/common-licenses/GPL-3 >text.txt
"$bin" prepare --kind lm --input text.txt --out shards --shards 2 --vocab-size 300 \
  --valid-lines 50 >prepare.log
tiny=(--layers 1 --d-model 32 --heads 2 --d-ff 64 --threads 1)
timeout 120 "${mpirun[@]}" -np 2 "$bin" train --model lm --data shards --out shards-run "${tiny[@]}" \
  --max-len 64 --max-tokens 512 --steps 30 --log-every 5 --eval-every 10 --eval-batches 2 \
  --label-smoothing 0.1 >shards-run.log
"$bin" train --model lm --synthetic copy --out synthetic-run "${tiny[@]}" --max-len 32 \
  --max-tokens 256 --steps 20 --log-every 4 --eval-every 10 >synthetic-run.log
# A file as mpiformer wrote it before metrics version 2: no nll, elapsed_s,
# epoch, comm_wait_ms, hidden_share (wall times are then 0).
mkdir old-run && cp synthetic-run/metrics.h5 old-run/
as_version_1 old-run/metrics.h5
# The real run's metrics without the label-figure columns.
mkdir nolabels-run && cp shards-run/metrics.h5 shards-run/metrics.jsonl nolabels-run/
without_label_columns nolabels-run

# readback RUNDIR...: the events under each RUNDIR/tensorboard against its
# metrics.h5. Read with purging off: a point written twice would show.
readback() {
  python3 - "$src/analysis" "$@" <<'PY'
import glob
import os
import sys

import numpy as np
from tensorboard.backend.event_processing import event_accumulator as ea

sys.path.insert(0, sys.argv[1])
from mpiformer_metrics import read_metrics  # noqa: E402

# Written by the version of mpiformer that wrote metrics.h5 version 2.
NEW = {"train/nll", "train/elapsed_s", "train/epoch", "train/comm_wait_ms", "train/hidden_share",
       "eval/nll", "eval/elapsed_s"}
problems = []


def short(values):
    values = list(values)
    return str(values if len(values) <= 8 else values[:8] + ["..."])


for rundir in sys.argv[2:]:
    files = glob.glob(os.path.join(rundir, "tensorboard", "events.out.tfevents.*"))
    if len(files) != 1:
        problems.append(f"{rundir}: {len(files)} event files, expected 1")
    acc = ea.EventAccumulator(os.path.join(rundir, "tensorboard"), purge_orphaned_data=False,
                              size_guidance={ea.SCALARS: 0, ea.TENSORS: 0})
    acc.Reload()
    m = read_metrics(rundir)
    expected, empty = {}, []
    for group in ("train", "eval"):
        columns = m[group]
        elapsed = columns.get("elapsed_s")
        for name, values in columns.items():
            if name == "step":
                continue
            values = np.asarray(values, dtype=np.float64)
            keep = ~np.isnan(values)
            if not keep.any():
                empty.append(f"{group}/{name}")
                continue
            walls = elapsed[keep] if elapsed is not None else np.zeros(keep.sum())
            expected[f"{group}/{name}"] = (columns["step"][keep], values[keep], walls)
    tags = set(acc.Tags()["scalars"])
    if tags != set(expected):
        problems.append(f"{rundir}: tags {sorted(tags)}, expected {sorted(expected)}")
    version = int(m["attrs"].get("version", 1))
    if version >= 2 and rundir in ("shards-run", "nolabels-run") and not NEW <= tags:
        problems.append(f"{rundir}: no tag for {sorted(NEW - tags)}")
    for tag in sorted(tags & set(expected)):
        steps, values, walls = expected[tag]
        events = acc.Scalars(tag)
        got_steps = np.array([e.step for e in events])
        got = np.array([e.value for e in events], dtype=np.float32)
        got_walls = np.array([e.wall_time for e in events])
        if len(events) != len(steps) or (got_steps != steps).any():
            problems.append(f"{rundir} {tag}: steps {short(got_steps.tolist())} ({len(events)}), "
                            f"expected {short(steps.tolist())} ({len(steps)})")
        elif (got != values.astype(np.float32)).any():
            problems.append(f"{rundir} {tag}: values {short(got.tolist())}, "
                            f"expected {short(values.tolist())}")
        elif not np.array_equal(got_walls, np.nan_to_num(walls, nan=0.0)):
            problems.append(f"{rundir} {tag}: wall times {short(got_walls.tolist())} != elapsed_s")
    config = acc.Tags()["tensors"]
    if config != ["run/config"]:
        problems.append(f"{rundir}: text tags {config}, expected ['run/config']")
    else:
        text = acc.Tensors("run/config")[0].tensor_proto.string_val[0].decode()
        first = m["attrs"]["config"].strip().splitlines()[0]
        if first not in text or f"**model**: {m['attrs']['model']}" not in text:
            problems.append(f"{rundir}: run/config lacks the config or the model: {text[:200]!r}")
    points = sum(len(acc.Scalars(t)) for t in tags)
    print(f"read back {rundir}: {len(tags)} scalar tags, {points} points; "
          f"no value, left out: {', '.join(empty) or 'none'}")
    print("EMPTY " + rundir + " " + " ".join(empty))
for problem in problems:
    print(f"FAIL: {problem}", file=sys.stderr)
sys.exit(1 if problems else 0)
PY
}

rc=0
"${convert[@]}" shards-run nolabels-run synthetic-run old-run >"$out" 2>"$err" || rc=$?
cat "$out"
check "to_tensorboard.py on four runs exits 0 (got $rc)" test "$rc" -eq 0
check "it says what it converted" grep -q "^converted 4 run(s): [0-9]* scalar tags, [0-9]* points$" "$out"
check "it names the tags of each run" grep -q "^  train ([0-9]* rows): .*grad_norm, .*loss" "$out"
if readback shards-run nolabels-run synthetic-run old-run >readback.txt; then
  echo "PASS: every column reads back from TensorBoard's events with its steps and values"
else
  fail "the events do not hold the metrics (see above)"
fi
cat readback.txt
# Columns without a value are named as left out.
while read -r _ run empty; do
  if [[ -n $empty ]]; then
    check "$run: left out columns named: $empty" \
      grep -qF "left out (no value written): ${empty// /, }" "$out"
  fi
done < <(grep '^EMPTY ' readback.txt)
check "no label-figure tag is written or named for the run without those columns" \
  not_in micro_ <(awk '/^nolabels-run:/ { on = 1; print; next } /^[^ ]/ { on = 0 } on' "$out")
if grep -q '^EMPTY synthetic-run .*train/epoch' readback.txt; then
  echo "PASS: the synthetic run has no epoch, and no tag for it"
else
  # metrics.h5 version 1 has no epoch column at all.
  echo "note: no all-NaN epoch column in synthetic-run (an mpiformer before metrics version 2)"
fi

first=$(ls shards-run/tensorboard)
rc=0
"${convert[@]}" shards-run nolabels-run synthetic-run old-run >"$out" 2>"$err" || rc=$?
check "converting again exits 0 (got $rc)" test "$rc" -eq 0
check "converting again replaced the event file" test "$(ls shards-run/tensorboard)" != "$first"
if readback shards-run nolabels-run synthetic-run old-run >/dev/null; then
  echo "PASS: converting again leaves one event file and every point once"
else
  fail "converting again duplicated or lost points"
fi

# Faults: nothing is converted when one run directory is bad.
before=$(ls shards-run/tensorboard)
mkdir -p not-a-run
rc=0
"${convert[@]}" shards-run no-such-run >"$out" 2>"$err" || rc=$?
expect_one_line_error "a missing run directory" 2 "to_tensorboard.py: no-such-run: no such run directory"
rc=0
"${convert[@]}" shards-run not-a-run >"$out" 2>"$err" || rc=$?
expect_one_line_error "a directory without metrics.h5" 2 \
  "to_tensorboard.py: not-a-run/metrics.h5: no such file"
check "a refused conversion converts nothing" test "$(ls shards-run/tensorboard)" == "$before"
check "and writes no events for the bad directory" test ! -e not-a-run/tensorboard

# While a run trains: conversions read metrics.h5 beside the writer (SWMR).
timeout 120 "$bin" train --model lm --synthetic copy --out live "${tiny[@]}" --max-len 32 \
  --max-tokens 256 --steps 4000 --log-every 10 --eval-every 1000 >live.log 2>&1 &
trainer=$!
# From the first progress line on, metrics.h5 is open for SWMR writing.
for _ in $(seq 300); do
  grep -q '^step ' live.log && break
  sleep 0.1
done
live_ok=0 live_done=0
while kill -0 "$trainer" 2>/dev/null; do
  rc=0
  "${convert[@]}" live >"$out" 2>"$err" || rc=$?
  if kill -0 "$trainer" 2>/dev/null; then
    if [[ $rc -eq 0 ]]; then live_ok=$((live_ok + 1)); else fail "conversion while training: exit $rc"; fi
    live_done=$((live_done + 1))
  fi
  sleep 0.2
done
wait "$trainer" || fail "the live run failed: $(tail -n 3 live.log)"
if [[ $live_done -eq 0 ]]; then
  echo "note: the live run ended before a conversion could overlap it"
else
  check "$live_ok of $live_done conversions while training succeeded" test "$live_ok" -eq "$live_done"
fi
rc=0
"${convert[@]}" live >"$out" 2>"$err" || rc=$?
check "the finished live run converts (got $rc)" test "$rc" -eq 0
if readback live >/dev/null; then
  echo "PASS: after conversions during training, the final one holds every row once"
else
  fail "the live run's events do not match its metrics"
fi

exit_on_failures
echo "tensorboard: all checks passed"
