#!/usr/bin/env bash
# Bad inputs to `mpiformer prepare` under mpirun -np 2: each exits non-zero
# with one line on stderr naming the file and the fault, within 60 s (a hang
# fails), and leaves no shard, tokenizer or temporary file behind; shards
# already in the output directory are not touched.
#
# usage: prepare_errors.sh /path/to/mpiformer WORKDIR
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

bin=${1:?usage: prepare_errors.sh /path/to/mpiformer WORKDIR}
work=${2:?usage: prepare_errors.sh /path/to/mpiformer WORKDIR}
mpiexec=${MPIEXEC:-$(command -v mpirun)}

rm -rf "$work"
mkdir -p "$work"
cd "$work" || exit 1
out=stdout
err=stderr
failures=0

# expect_failure CODE OUTDIR NEEDLES... -- ARGS...: `prepare ARGS` under
# mpirun -np 2 exits with CODE, prints exactly one stderr line holding every
# NEEDLE, and OUTDIR holds no .h5, tokenizer or temporary file afterwards
# (OUTDIR '': not checked).
expect_failure() {
  local code=$1 dir=$2
  shift 2
  local needles=()
  while [[ $1 != -- ]]; do
    needles+=("$1")
    shift
  done
  shift
  local what="prepare $*"
  rc=0
  timeout 60 "$mpiexec" -q -n 2 "$bin" prepare "$@" >"$out" 2>"$err" || rc=$?
  if [[ $rc -eq 124 ]]; then
    fail "$what: hung (killed after 60 s)"
    return
  fi
  expect_one_line_error "$what" "$code" "${needles[@]}" || return 0
  local leftovers=
  if [[ -n $dir ]]; then
    leftovers=$(find "$dir" \( -name '*.h5' -o -name '*.tmp-*' -o -name '*.model' \) 2>/dev/null ||
      true)
  fi
  if [[ -n $leftovers ]]; then
    fail "$what: left behind: $(tr '\n' ' ' <<<"$leftovers")"
    return
  fi
  echo "PASS: exit $rc: $(cat "$err")"
}

# A small text the tokenizer can learn a vocabulary of 60 from.
for i in $(seq 1 300); do
  echo "line $i: the quick brown fox jumps over the lazy dog $((i * 7 % 13)) times"
done >good.txt
head -n 120 good.txt >lines120.txt
head -n 121 good.txt >lines121.txt
printf '\n   \n\t\n\n' >blank.txt
echo "this is not a SentencePiece model" >garbage.model
mkdir -p a_directory
echo "a file" >a_file
small=(--shards 2 --vocab-size 60)

# ---- faults of the inputs, found before any work: exit 2 ----
expect_failure 2 out-missing --input missing.txt "no such file" -- \
  --input missing.txt --out out-missing "${small[@]}"
[[ ! -e out-missing ]] || fail "missing input: created out-missing"
expect_failure 2 out-dir --input a_directory "not a file" -- \
  --input a_directory --out out-dir "${small[@]}"
expect_failure 2 out-blank blank.txt "empty input (no non-blank lines)" -- \
  --input blank.txt --out out-blank "${small[@]}"
[[ ! -e out-blank ]] || fail "empty input: created out-blank"
expect_failure 2 out-pairs "--target: lines120.txt has 120 lines but --input lines121.txt has 121" -- \
  --kind seq2seq --input lines121.txt --target lines120.txt --out out-pairs "${small[@]}"
expect_failure 2 out-pairs --target missing.de "no such file" -- \
  --kind seq2seq --input good.txt --target missing.de --out out-pairs "${small[@]}"
expect_failure 2 out-notarget --target "required with --kind seq2seq" -- \
  --kind seq2seq --input good.txt --out out-notarget "${small[@]}"
expect_failure 2 out-lmtarget --target "only for --kind seq2seq" -- \
  --kind lm --input good.txt --target good.txt --out out-lmtarget "${small[@]}"
expect_failure 2 out-garbage --tokenizer garbage.model "not a SentencePiece model" -- \
  --input good.txt --tokenizer garbage.model --out out-garbage --shards 2
expect_failure 2 out-nomodel --tokenizer missing.model "no such file" -- \
  --input good.txt --tokenizer missing.model --out out-nomodel --shards 2
expect_failure 2 out-vocab --vocab-size "Vocabulary size too high" good.txt -- \
  --input good.txt --out out-vocab --shards 2 --vocab-size 5000
[[ ! -e out-vocab ]] || fail "vocabulary too large: created out-vocab"
expect_failure 2 out-small --vocab-size "must be at least 8" -- \
  --input good.txt --out out-small --shards 2 --vocab-size 6
expect_failure 2 out-shards --shards "each shard needs at least one" -- \
  --input lines120.txt --out out-shards --shards 200 --vocab-size 60
expect_failure 2 a_file --out a_file "not a directory" -- --input good.txt --out a_file "${small[@]}"

# An output directory that already holds shards: refused, and left as it was.
rc=0
timeout 60 "$mpiexec" -q -n 2 "$bin" prepare --input good.txt --out old "${small[@]}" \
  >"$out" 2>"$err" || rc=$?
[[ $rc -eq 0 ]] || fail "preparing old/: exit code $rc"
before=$(cd old && md5sum ./*)
expect_failure 2 "" "already holds shards; choose another directory" old -- \
  --input good.txt --out old "${small[@]}"
[[ $(cd old && md5sum ./*) == "$before" ]] || fail "old/: its shards changed"

# ---- a fault while writing: exit 1, nothing left, not even the directory ----
# Lines of control characters alone are not blank, but encode to nothing: the
# second shard (rank 1's) would be empty, after rank 0 has written the first.
{
  head -n 10 good.txt
  for _ in $(seq 1 30); do printf '\001\002\n'; done
} >control.txt
expect_failure 1 out-control "[rank 1]" control.txt "encode to nothing" -- \
  --input control.txt --out out-control --shards 2 --tokenizer old/tokenizer.model
[[ ! -e out-control ]] || fail "fault while writing: left out-control behind"
# A directory that existed before stays, empty.
mkdir -p out-existing
expect_failure 1 out-existing "[rank 1]" "encode to nothing" -- \
  --input control.txt --out out-existing --shards 2 --tokenizer old/tokenizer.model
[[ -d out-existing && -z $(ls -A out-existing) ]] || fail "out-existing: not left empty"

# ---- flags: exit 2 without mpirun too, one line naming the flag ----
rc=0
"$bin" prepare --input good.txt --out out-flags --shards 0 >"$out" 2>"$err" || rc=$?
if [[ $rc -ne 2 || $(wc -l <"$err") -ne 1 ]] || ! grep -qF -- "--shards" "$err"; then
  fail "--shards 0: exit $rc"
else
  echo "PASS: exit 2: $(cat "$err")"
fi
rc=0
"$bin" prepare --kind text --input good.txt --out out-flags >"$out" 2>"$err" || rc=$?
if [[ $rc -ne 2 ]] || ! grep -qF -- "--kind: expected lm, seq2seq, classify or image; got 'text'" "$err"; then
  fail "--kind text: exit $rc"
else
  echo "PASS: exit 2: $(cat "$err")"
fi
[[ ! -e out-flags ]] || fail "bad flags: created out-flags"

exit_on_failures
echo "prepare_errors: all checks passed"
