#!/usr/bin/env bash
# Malformed shards through the real binary. `mpiformer inspect FILE` must
# exit non-zero with one stderr line naming the file and the fault; then
# `mpiformer train --data DIR` on two ranks must fail within 60 s, naming the
# faulty file, for a set with one broken shard, one with another vocabulary
# and one with another tokenizer.
#
# usage: bad_shards.sh /path/to/mpiformer WORKDIR
# The shards come from make_bad_shard, built next to the test binaries
# (BUILD/tests/make_bad_shard; $MAKE_BAD_SHARD overrides).
set -euo pipefail

bin=${1:?usage: bad_shards.sh /path/to/mpiformer WORKDIR}
work=${2:?usage: bad_shards.sh /path/to/mpiformer WORKDIR}
source "$(dirname "$0")/common.sh"
make_bad=${MAKE_BAD_SHARD:-$(dirname "$bin")/tests/make_bad_shard}
mpirun=${MPIEXEC:-mpirun}

if [[ ! -x $make_bad ]]; then
  echo "FAIL: $make_bad is not built (cmake --build BUILD --target make_bad_shard)" >&2
  exit 1
fi

rm -rf "$work"
mkdir -p "$work"
out=$work/stdout
err=$work/stderr
failures=0

# Runs a command; sets $rc without tripping set -e.
run() {
  rc=0
  "$@" >"$out" 2>"$err" || rc=$?
}

# ---- inspect: one line naming file and fault, exit 1 ----

# expect_inspect_fault FILE WORDS: exit 1, stderr exactly one line holding
# FILE and WORDS, nothing on stdout.
expect_inspect_fault() {
  local file=$1 words=$2
  run "$bin" inspect "$file"
  local what="mpiformer inspect $(basename "$file")"
  expect_one_line_error "$what" nonzero "$file" "$words" || return 0
  [[ ! -s $out ]] || fail "$what: unexpected stdout"
  echo "ok: $what -> $(cat "$err")"
}

declare -A words=(
  [missing-format]="not an mpiformer shard (no 'format' attribute)"
  [bad-version]="unsupported shard version 7 (this build reads version 1)"
  [truncated]="truncated or corrupt"
  [not-hdf5]="not an HDF5 file"
  [offsets-not-monotone]="offsets are not non-decreasing at sequence 3"
  [offsets-mismatch]="offsets end at 440 but"
  [token-out-of-range]="is not below vocab_size 64"
  [empty]="empty shard (0 sequences)"
  [bad-kind]="kind 'xyz' is not lm, seq2seq, classify or image"
  [bad-checksum]="Fletcher32 checksum"
  [sum-blind-change]="tokens is damaged: its CRC-32C checksum is"
  [count-mismatch]="/src holds 40 sequences but /tgt holds 39"
)

for kind in lm seq2seq; do
  mkdir -p "$work/$kind"
  valid=$work/$kind/valid.h5
  "$make_bad" "$kind" valid "$valid"
  run "$bin" inspect "$valid"
  if [[ $rc -ne 0 ]]; then
    fail "mpiformer inspect on a valid $kind shard: exit code $rc"
  else
    for needle in "kind         $kind" "sequences    40" "version 1" "vocab        64"; do
      grep -qF -- "$needle" "$out" || fail "inspect $kind: summary lacks '$needle'"
    done
  fi
  for fault in "${!words[@]}"; do
    [[ $fault == count-mismatch && $kind == lm ]] && continue
    file=$work/$kind/$fault.h5
    "$make_bad" "$kind" "$fault" "$file"
    expect_inspect_fault "$file" "${words[$fault]}"
  done
done
expect_inspect_fault "$work/absent.h5" "no such file"

# Under mpirun only rank 0 speaks, and the job fails.
if command -v "$mpirun" >/dev/null; then
  run "$mpirun" -n 2 "$bin" inspect "$work/lm/bad-version.h5"
  [[ $rc -ne 0 ]] || fail "mpirun -n 2 inspect of a bad shard: exit code 0"
  [[ $(grep -c 'mpiformer inspect: .*bad-version.h5: unsupported shard version 7' "$err") -eq 1 ]] ||
    fail "mpirun -n 2 inspect: expected the message once"
fi

# ---- train --data: a faulty member fails the whole set, naming it ----

train_args=(--model lm --layers 1 --d-model 16 --heads 2 --d-ff 32 --max-len 32
            --max-tokens 256 --steps 2)

# make_set DIR FAULT: train-00000 valid, train-00001 with FAULT, valid-00000 valid.
make_set() {
  local dir=$1 fault=$2
  rm -rf "$dir"
  mkdir -p "$dir"
  "$make_bad" lm valid "$dir/train-00000.h5"
  "$make_bad" lm "$fault" "$dir/train-00001.h5"
  "$make_bad" lm valid "$dir/valid-00000.h5"
  printf 'tokenizer-A' >"$dir/tokenizer.model"  # the bytes make_bad_shard stores
}

# train_on DIR: two ranks, at most 60 s; sets $rc.
train_on() {
  rm -rf "$work/run"
  run timeout 60 "$mpirun" -n 2 "$bin" train --data "$1" --out "$work/run" "${train_args[@]}"
}

make_set "$work/set-valid" valid
train_on "$work/set-valid"
if [[ $rc -ne 0 ]]; then
  # The checks below would prove nothing if a valid set failed too.
  fail "train --data on a valid set exited $rc"
else
  echo "ok: train --data on a valid set"
  for fault in missing-format bad-version truncated not-hdf5 offsets-not-monotone \
    offsets-mismatch token-out-of-range empty bad-kind bad-checksum sum-blind-change other-vocab \
    other-tokenizer; do
    make_set "$work/set-$fault" "$fault"
    train_on "$work/set-$fault"
    what="train --data with train-00001.h5 $fault"
    if [[ $rc -eq 0 ]]; then
      fail "$what: exit code 0"
    elif [[ $rc -eq 124 || $rc -eq 137 ]]; then
      fail "$what: still running after 60 s"
    elif ! grep -qF "train-00001.h5" "$err"; then
      fail "$what: stderr does not name train-00001.h5"
    else
      echo "ok: $what -> exit $rc: $(grep -m 1 -F train-00001.h5 "$err")"
    fi
  done
  # A broken validation shard is found before training too.
  make_set "$work/set-bad-valid" valid
  "$make_bad" lm bad-version "$work/set-bad-valid/valid-00000.h5"
  train_on "$work/set-bad-valid"
  if [[ $rc -eq 0 ]] || ! grep -qF "valid-00000.h5" "$err"; then
    fail "train --data with a bad valid-00000.h5: exit code $rc, or stderr does not name it"
  fi
fi

exit_on_failures
echo "bad_shards: all checks passed"
