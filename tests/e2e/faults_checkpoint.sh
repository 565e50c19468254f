#!/usr/bin/env bash
# Checkpoints written and read by every rank through MPI-IO
# (src/parallel/collective_checkpoint.h), on -np 2 and -np 3, and on -np 3
# with a sharded optimizer (each rank writes the slice it owns; the slices'
# edges fall inside rows, so a rank's part of a tensor is up to three
# blocks):
#   - a checkpoint the ranks wrote together holds what the single writer
#     (src/io/checkpoint.h, via tests/rewrite_checkpoint) writes of the same
#     state: the same datasets, shapes, types, chunks, Fletcher32 checksums,
#     attributes and values, bit for bit; analysis/export_hf.py exports it;
#   - a rank that fails in the middle of the collective write
#     (MPIFORMER_TEST_FAIL_IN_CHECKPOINT=STEP:RANK) ends every rank with
#     exit 1 and one line, leaves the previous checkpoints and `latest` as
#     they were and no temporary file; --resume auto then goes on, and its
#     checkpoint is bitwise the one of a run that never failed;
#   - a kill -9 in the middle of the write (MPIFORMER_TEST_KILL_IN_CHECKPOINT)
#     leaves only a temporary file, which the next start removes;
#   - a damaged chunk that the ranks find while reading collectively is
#     passed over for the checkpoint before (--resume auto), one line.
source "$(dirname "$0")/common.sh"
bin=$1 work=$2
tools=$(dirname "$bin")/tests
src=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$work" && mkdir -p "$work" && cd "$work"
mpirun=("${MPIEXEC:-mpirun}" -q)
failures=0

fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}
pass() { echo "PASS: $*"; }

model=(--model lm --synthetic copy --layers 2 --d-model 32 --heads 4 --d-ff 64 --vocab 40
  --max-len 32 --max-tokens 128 --output-bias false --threads 1 --log-every 2
  --checkpoint-every 2)

# run NP OUT EXPECTED-RC ARGS...: train on NP ranks into OUT; OUT.out, OUT.err.
run() {
  local np=$1 out=$2 expected=$3
  shift 3
  local rc=0
  timeout 120 "${mpirun[@]}" -np "$np" "$bin" train "${model[@]}" --out "$out" "$@" \
    >"$out.out" 2>"$out.err" || rc=$?
  if [[ $rc -ne $expected ]]; then
    fail "train -np $np --out $out $*: exit code $rc, expected $expected (124: hung)"
    sed -n 1,20p "$out.err" >&2
    return 1
  fi
}

# The two files hold the same objects, layout and values.
same_files() {
  python3 - "$1" "$2" <<'EOF'
import sys
import h5py
import numpy as np

a, b = (h5py.File(p, "r") for p in sys.argv[1:3])

def objects(f):
    found = {}
    f.visititems(lambda name, obj: found.__setitem__(name, obj))
    return found

oa, ob = objects(a), objects(b)
assert sorted(oa) == sorted(ob), f"objects differ: {sorted(set(oa) ^ set(ob))}"
for name, x in oa.items():
    y = ob[name]
    assert type(x) is type(y), name
    if isinstance(x, h5py.Dataset):
        for what in ("shape", "dtype", "chunks", "fletcher32", "compression", "shuffle"):
            assert getattr(x, what) == getattr(y, what), (name, what, getattr(x, what), getattr(y, what))
        assert x.fletcher32 and x.chunks, name
        assert np.array_equal(x[()].view(np.uint8), y[()].view(np.uint8)), f"{name}: values differ"
assert sorted(a.attrs) == sorted(b.attrs), "root attributes differ"
for key in a.attrs:
    x, y = a.attrs[key], b.attrs[key]
    assert x == y and np.asarray(x).dtype == np.asarray(y).dtype, (key, x, y)
print(f"{len(oa)} objects, {len(a.attrs)} attributes alike")
EOF
}

# Each case: NP, or NPs for --shard-optimizer true.
for case in 2 3 3s; do
  np=${case%s} sharded=()
  [[ $case == *s ]] && sharded=(--shard-optimizer true)
  r=run$case
  # ---- written collectively: the single writer's file, exported as before
  run "$np" "$r" 0 --steps 6 "${sharded[@]}" || continue
  expect=$r/checkpoints/step_00000006.h5
  grep -E "^checkpoint step 6: $expect \([0-9.]+ s, [0-9.]+ [MG]iB\)$" "$r.out" >/dev/null ||
    fail "-np $np${sharded:+ sharded}: no timed checkpoint line in $r.out"
  "$tools/rewrite_checkpoint" "$expect" "single$case.h5"
  if same_files "$expect" "single$case.h5" >"same$case.txt" 2>&1; then
    pass "-np $np${sharded:+ sharded}: collective checkpoint = single writer's ($(cat "same$case.txt"))"
  else
    fail "-np $np${sharded:+ sharded}: collective checkpoint differs from the single writer's: $(tail -n 1 "same$case.txt")"
  fi
  if python3 "$src/analysis/export_hf.py" "$expect" "hf$case" >"hf$case.out" 2>&1 &&
    python3 "$src/analysis/export_hf.py" "single$case.h5" "hf-single$case" >>"hf$case.out" 2>&1 &&
    diff -r "hf$case" "hf-single$case" >/dev/null; then
    pass "-np $np${sharded:+ sharded}: export_hf.py exports it, the same files as the single writer's"
  else
    fail "-np $np${sharded:+ sharded}: export_hf.py: $(tail -n 1 "hf$case.out")"
  fi

  # ---- a rank fails in the middle of the write of step 8
  before=$(cksum "$r"/checkpoints/*)
  MPIFORMER_TEST_FAIL_IN_CHECKPOINT=8:$((np - 1)) run "$np" "$r" 1 --steps 10 --resume auto \
    "${sharded[@]}" ||
    continue
  after=$(cksum "$r"/checkpoints/*)
  if [[ $(wc -l <"$r.err") -ne 1 ]]; then
    fail "-np $np${sharded:+ sharded}, fault in the write: expected one line on stderr, got: $(cat "$r.err")"
  elif ! grep -F "[rank $((np - 1))] $r/checkpoints/step_00000008.h5: cannot write" "$r.err" \
    >/dev/null; then
    fail "-np $np${sharded:+ sharded}, fault in the write: unexpected line: $(cat "$r.err")"
  elif [[ $before != "$after" ]]; then
    fail "-np $np${sharded:+ sharded}, fault in the write: the checkpoints or latest changed (or a temporary is left): $(ls "$r/checkpoints")"
  else
    pass "-np $np${sharded:+ sharded}: a rank failing in the write: exit 1, one line, checkpoints and latest intact"
  fi
  run "$np" "$r" 0 --steps 10 --resume auto "${sharded[@]}" || continue
  grep -F "resumed from $r/checkpoints: step 6" "$r.out" >/dev/null ||
    fail "-np $np${sharded:+ sharded}: the resume after the fault did not start from step 6"
  run "$np" "straight$case" 0 --steps 10 "${sharded[@]}" || continue
  if "$tools/compare_params" --bitwise "$r/checkpoints/step_00000010.h5" \
    "straight$case/checkpoints/step_00000010.h5" >/dev/null &&
    "$tools/compare_params" --bitwise --group optimizer/v "$r/checkpoints/step_00000010.h5" \
      "straight$case/checkpoints/step_00000010.h5" >/dev/null; then
    pass "-np $np${sharded:+ sharded}: resumed after the fault, step 10 bitwise as a run without it"
  else
    fail "-np $np${sharded:+ sharded}: resumed after the fault, step 10 differs from a run without it"
  fi

  # ---- kill -9 in the middle of the write of step 12: only its temporary
  # (step_00000012.h5.tmp-HOST-PID) is left
  before=$(cat "$r/checkpoints/latest")
  rc=0
  MPIFORMER_TEST_KILL_IN_CHECKPOINT=12 timeout 120 "${mpirun[@]}" -np "$np" "$bin" train \
    "${model[@]}" --out "$r" --steps 12 --resume auto "${sharded[@]}" >"$r.out" 2>"$r.err" || rc=$?
  if [[ $rc -eq 0 || $rc -eq 124 ]]; then
    fail "-np $np${sharded:+ sharded}, killed in the write: exit code $rc"
  elif ! compgen -G "$r/checkpoints/step_00000012.h5.tmp-*" >/dev/null ||
    [[ -e $r/checkpoints/step_00000012.h5 ||
    $(cat "$r/checkpoints/latest") != "$before" ]]; then
    fail "-np $np${sharded:+ sharded}, killed in the write: expected only step 12's temporary: $(ls "$r/checkpoints")"
  else
    run "$np" "$r" 0 --steps 12 --resume auto "${sharded[@]}" || continue
    if grep -F "removed 1 unfinished write(s)" "$r.out" >/dev/null &&
      ! compgen -G "$r/checkpoints/*.tmp*" >/dev/null && [[ -f $r/checkpoints/step_00000012.h5 ]]; then
      pass "-np $np${sharded:+ sharded}: killed in the write: a temporary only, removed by the next start"
    else
      fail "-np $np${sharded:+ sharded}: after the kill, the temporary was not removed or step 12 not written"
    fi
  fi

  # ---- a damaged chunk found while the ranks read: the one before is used
  cp -r "$r" damaged$case
  "$tools/make_bad_shard" --corrupt-chunk /optimizer/v/embed.tokens \
    damaged$case/checkpoints/step_00000012.h5
  run "$np" "damaged$case" 0 --steps 14 --resume auto "${sharded[@]}" || continue
  if [[ $(wc -l <damaged$case.err) -eq 1 ]] &&
    grep -F "skipping a damaged checkpoint: damaged$case/checkpoints/step_00000012.h5: truncated or corrupt" \
      damaged$case.err >/dev/null &&
    grep -F "resumed from damaged$case/checkpoints: step 10" damaged$case.out >/dev/null; then
    pass "-np $np${sharded:+ sharded}: a damaged chunk read collectively: one line, resumed from step 10"
  else
    fail "-np $np${sharded:+ sharded}: damaged chunk: $(cat damaged$case.err)"
  fi
done

if [[ $failures -ne 0 ]]; then
  echo "$failures failure(s)" >&2
  exit 1
fi
echo "all collective checkpoint checks passed"
