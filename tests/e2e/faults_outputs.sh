#!/usr/bin/env bash
# Outputs are never lost nor half-written (docs/DESIGN.md sections 7 and 8):
# generate and classify write their files under a temporary name and rename
# them when complete, so a refused input or a stop signal leaves the previous
# file byte for byte, with one line saying so; prepare stopped while it
# trains its tokenizer (alone or under mpirun) leaves no temporary and no
# lock, and a later prepare into the directory clears the temporaries of one
# that was killed; SIGHUP stops train at a step boundary with a checkpoint,
# like SIGTERM.
source "$(dirname "$0")/common.sh"
bin=$1 work=$2
rm -rf "$work" && mkdir -p "$work" && cd "$work"
mpirun=("${MPIEXEC:-mpirun}" -q)
failures=0 out=$work/out.txt err=$work/err.txt

# Background jobs end with the test, however it ends.
cleanup() {
  local pids
  pids=$(jobs -p)
  [[ -z $pids ]] || kill -KILL $pids 2>/dev/null || true
}
trap cleanup EXIT

# signal_when_written SIGNAL FILES LINE CMD...: starts CMD (stdout in $out,
# stderr in $err), sends it SIGNAL once a file of the glob FILES exists and
# is not empty and $out holds LINE (or CMD has ended, or after 30 s), and
# waits; the exit code is in $rc.
signal_when_written() {
  local signal=$1 files=$2 line=$3 started f
  shift 3
  timeout 60 "$@" >"$out" 2>"$err" &
  started=$!
  for _ in $(seq 300); do
    kill -0 "$started" 2>/dev/null || break
    f=$(compgen -G "$files" | head -n 1 || true)
    [[ -n $f && -s $f ]] && { [[ -z $line ]] || grep -qF -- "$line" "$out"; } && break
    sleep 0.1
  done
  local target
  target=$(pgrep -P "$started" | sed -n 1p)
  # to_ranks=1: the processes mpirun started, each signalled (as scancel does)
  [[ ${to_ranks:-0} == 0 ]] || target=$(pgrep -P "$target" | tr '\n' ' ')
  kill -"$signal" $target 2>/dev/null || true
  rc=0
  wait "$started" || rc=$?
  [[ $rc -ne 124 ]] || fail "$*: hung (killed after 60 s)"
}

# unchanged FILE ORIGINAL: FILE is byte for byte ORIGINAL and no FILE.tmp-*
# is left beside it.
unchanged() { cmp -s "$1" "$2" && ! compgen -G "$1.tmp-*" >/dev/null; }
# empty_or_absent DIR: nothing is left in DIR (no temporary, no .lock).
empty_or_absent() { [[ ! -e $1 || -z $(ls -A "$1") ]]; }
# failed_leaving_nothing DIR: the command just run failed and left DIR empty.
failed_leaving_nothing() { [[ $rc -ne 0 ]] && empty_or_absent "$1"; }
# succeeded_saying LINE: the command just run succeeded and printed LINE.
succeeded_saying() { [[ $rc -eq 0 ]] && grep -qF -- "$1" "$out"; }

# ---- the fixtures: a text, an lm, a seq2seq and a classifier
grep -v '^[[:space:]]*$' /usr/share/common-licenses/GPL-3 >gpl.txt
cut -d' ' -f1-4 gpl.txt >src.txt
rev src.txt >tgt.txt
awk '{ print (NR % 2 ? "odd" : "even") (NR % 3 ? "" : " three") }' gpl.txt >gpl.labels
tiny=(--heads 2 --d-model 32 --d-ff 64 --max-len 32 --max-tokens 256 --threads 1)
"$bin" train --model lm --synthetic copy --layers 1 "${tiny[@]}" --steps 1 --out lm >/dev/null
"$bin" prepare --kind seq2seq --input src.txt --target tgt.txt --out s2s --shards 1 \
  --vocab-size 200 --valid-lines 10 --test-lines 10 >/dev/null
"$bin" train --model seq2seq --data s2s --enc-layers 1 --dec-layers 1 "${tiny[@]}" --steps 1 \
  --out s2s-run >/dev/null
"$bin" prepare --kind classify --input gpl.txt --labels gpl.labels --out cls --shards 1 \
  --vocab-size 300 --valid-lines 10 >/dev/null
# Wide enough that classifying thousands of lines takes seconds.
"$bin" train --model classify --loss zlpr --pool mean --data cls --layers 2 --heads 2 \
  --d-model 128 --d-ff 512 --max-len 64 --max-tokens 512 --threads 1 --steps 1 \
  --out cls-run >/dev/null
lm=lm/checkpoints/step_00000001.h5
s2s=s2s-run/checkpoints/step_00000001.h5
cls=cls-run/checkpoints/step_00000001.h5

# ---- generate: a bad --references is refused before --output is touched
echo "the hypotheses of an earlier run" >hyp_old.txt
cp hyp_old.txt hyp_old.orig
try "$bin" generate --checkpoint "$s2s" --data s2s --references /proc/nope/ref.txt \
  --output hyp_old.txt --max-new-tokens 4 --threads 1
refused "a --references in no directory" 2 \
  "mpiformer generate: --references: /proc/nope/ref.txt: its directory /proc/nope does not exist"
check "a refused --references leaves --output byte for byte" unchanged hyp_old.txt hyp_old.orig

# ---- generate and classify: SIGTERM in the middle leaves the previous file
for _ in $(seq 5000); do echo "7 8 9 10"; done >prompts.txt
echo "the outputs of an earlier run" >hyp.txt
cp hyp.txt hyp.orig
signal_when_written TERM 'hyp.txt.tmp-*' "" \
  "$bin" generate --checkpoint "$lm" --input prompts.txt --output hyp.txt --beam 4 --threads 1
refused "SIGTERM during generate" 143 "mpiformer generate: stopped by SIGTERM; hyp.txt was left unchanged"
check "SIGTERM during generate leaves --output byte for byte, no temporary" unchanged hyp.txt hyp.orig

for _ in $(seq 20); do cat gpl.txt; done >many.txt
echo "the labels of an earlier run" >labels.txt
cp labels.txt labels.orig
signal_when_written TERM 'labels.txt.tmp-*' "" \
  "$bin" classify --checkpoint "$cls" --input many.txt --output labels.txt --batch 1 --threads 1
# classify's memory estimate comes first on stderr; the stop is one line after it.
sed -i '/: memory about /d' "$err"
refused "SIGTERM during classify" 143 "mpiformer classify: stopped by SIGTERM; labels.txt was left unchanged"
check "SIGTERM during classify leaves --output byte for byte, no temporary" \
  unchanged labels.txt labels.orig

# ---- prepare: SIGTERM while SentencePiece trains, alone and under mpirun
# (a random text: a unigram model of 2000 pieces takes a while on it)
awk 'BEGIN { srand(7); for (i = 0; i < 20000; i++) { line = "";
  for (w = 0; w < 10; w++) { n = 2 + int(rand() * 7); word = "";
    for (c = 0; c < n; c++) word = word sprintf("%c", 97 + int(rand() * rand() * 26));
    line = line (w ? " " : "") word }
  print line } }' >random.txt
training="training a unigram tokenizer"
signal_when_written TERM 'stopped/tokenizer-input.txt.tmp-*' "$training" \
  "$bin" prepare --input random.txt --out stopped --vocab-size 2000 --shards 2
refused "SIGTERM during prepare's tokenizer training" 143 \
  "mpiformer prepare: stopped by SIGTERM; removed its unfinished files from stopped"
check "SIGTERM during prepare leaves no temporary and no lock" empty_or_absent stopped
mkdir -p stopped-np2
to_ranks=1 signal_when_written TERM 'stopped-np2/tokenizer-input.txt.tmp-*' "$training" \
  "${mpirun[@]}" -np 2 "$bin" prepare --input random.txt --out stopped-np2 --vocab-size 2000 \
  --shards 2
check "SIGTERM to both ranks during prepare fails (exit $rc), leaving no temporary and no lock" \
  failed_leaving_nothing stopped-np2
# SIGTERM to mpirun: it passes TERM on and kills a rank still running 1 s
# later (Open MPI's odls_base_sigkill_timeout), so a rank may be gone before
# it cleaned up; then the next prepare into the directory clears what it left.
signal_when_written TERM 'stopped-np2/tokenizer-input.txt.tmp-*' "$training" \
  "${mpirun[@]}" -np 2 "$bin" prepare --input random.txt --out stopped-np2 --vocab-size 2000 \
  --shards 2
check "SIGTERM to mpirun during prepare fails (exit $rc)" test "$rc" -ne 0
try "${mpirun[@]}" -np 2 "$bin" prepare --input gpl.txt --out stopped-np2 --vocab-size 200 \
  --shards 2 --valid-lines 10
check "the next prepare -np 2 into that directory succeeds (exit $rc)" test "$rc" -eq 0
holds_only stopped-np2 train-00000.h5 train-00001.h5 valid-00000.h5 \
  tokenizer.model

# A later prepare into the directory succeeds, and removes the temporaries
# of prepare's own files that a killed prepare left (a pid that is gone); a
# live process's, and names that are not prepare's, stay.
dead=$(sh -c 'echo $$')
mkdir -p stopped
head -c 100000 random.txt >"stopped/tokenizer-input.txt.tmp-$dead"
head -c 1000 /dev/zero >"stopped/train-00000.h5.tmp-$dead"
echo mine >"stopped/notes.txt.tmp-$dead"
echo alive >"stopped/tokenizer-input.txt.tmp-$$"
try "$bin" prepare --input gpl.txt --out stopped --vocab-size 200 --shards 1 --valid-lines 10
check "a later prepare into the directory succeeds (exit $rc) and says what it cleared" \
  succeeded_saying "removed 2 temporary file(s) left in stopped by a prepare that no longer runs" "$out"
holds_only stopped train-00000.h5 valid-00000.h5 tokenizer.model "notes.txt.tmp-$dead" \
  "tokenizer-input.txt.tmp-$$"

# ---- train: SIGHUP (a closed terminal) stops at a step boundary with a
# checkpoint, exit 75, and --resume auto goes on
timeout 60 "$bin" train --model lm --synthetic copy --layers 1 "${tiny[@]}" --steps 100000 \
  --log-every 10 --eval-every 0 --out hup >hup.out 2>hup.err &
started=$!
for _ in $(seq 300); do
  grep -q "^step [1-9][0-9]*0/" hup.out && break
  sleep 0.1
done
kill -HUP "$(pgrep -P "$started" | head -n 1)" 2>/dev/null || true
rc=0
wait "$started" || rc=$?
check "SIGHUP to train exits 75 (got $rc)" test "$rc" -eq 75
step=$(sed -n 's/^stopped by SIGHUP after step \([0-9]*\);.*(exit code 75)$/\1/p' hup.out)
check "SIGHUP to train: its stop line and the checkpoint of step ${step:-?}" \
  test -n "$step" -a -e "hup/checkpoints/$(printf 'step_%08d.h5' "${step:-0}")"
try "$bin" train --model lm --synthetic copy --layers 1 "${tiny[@]}" --log-every 10 \
  --eval-every 0 --out hup --resume auto --steps "$((${step:-0} + 2))"
check "after SIGHUP, --resume auto goes on (exit $rc)" \
  grep -qF "resumed from hup/checkpoints: step ${step:-none}" "$out"

exit_on_failures
echo "all output fault checks passed"
