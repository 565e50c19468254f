#!/usr/bin/env bash
# A run directory knows which run it holds (docs/DESIGN.md section 7), and a
# classifier knows its labels:
#   - each run has an id, in config.ini, metrics.h5 and every checkpoint;
#   - --resume auto refuses a checkpoint or a metrics.h5 of another run
#     copied in, and a `latest` that is empty, names a missing file or one
#     outside checkpoints/ (exit 2, nothing changed);
#   - --resume PATH of another run's checkpoint into a directory that holds
#     a run needs --resume-other-run; a new directory takes it as a new run;
#     rolling back within the run keeps working;
#   - a deleted metrics.h5 (or metrics.jsonl) is rebuilt from the other on
#     resume, every row once;
#   - a run directory of a version without ids resumes and is given one;
#   - eval and resume refuse shards whose label names differ from the
#     checkpoint's, renamed or reordered.
source "$(dirname "$0")/common.sh"
bin=$1 work=$2
rm -rf "$work" && mkdir -p "$work" && cd "$work"
failures=0 out=$work/out.txt err=$work/err.txt

model=(--model lm --synthetic copy --layers 1 --heads 2 --d-model 32 --d-ff 64 --max-len 32
  --max-tokens 256 --threads 1 --eval-batches 2)
# train ARGS...: one rank, a time limit; the exit code in $rc.
train() {
  rc=0
  timeout 60 "$bin" train "${model[@]}" "$@" >"$out" 2>"$err" || rc=$?
}
# state DIR: a fingerprint of every file of a run directory but the lock.
state() { (cd "$1" && find . -type f ! -name .lock -print0 | sort -z | xargs -0 cksum); }
unchanged() { check "$1: nothing changed" test "$(state "$2")" == "$3"; }
config_id() { sed -n 's/^# run-id = //p' "$1/config.ini" 2>/dev/null; }
# attr FILE: the run_id attribute of an HDF5 file ("" when none).
attr() {
  python3 - "$1" <<'EOF'
import sys, h5py
with h5py.File(sys.argv[1], "r") as f:
    v = f.attrs.get("run_id", b"")
    print(v.decode() if isinstance(v, bytes) else v)
EOF
}
# rows DIR: "train 5 train 10 ... eval 10" of metrics.h5, then the same of
# metrics.jsonl, on two lines (each group in step order).
rows() {
  python3 - "$1" <<'EOF'
import json, sys, h5py
d = sys.argv[1]
with h5py.File(f"{d}/metrics.h5", "r") as f:
    print(" ".join(f"{g} {s}" for g in ("train", "eval") for s in f[f"{g}/step"][:]))
lines = [json.loads(l) for l in open(f"{d}/metrics.jsonl")]
print(" ".join(f"{g} {r['step']}" for g in ("train", "eval") for r in lines if r["group"] == g))
EOF
}

# ---- two runs, a and b
train --steps 10 --log-every 5 --eval-every 10 --checkpoint-every 5 --out a
[[ $rc -eq 0 ]] || fail "run a: exit $rc"
train --steps 30 --log-every 10 --checkpoint-every 10 --seed 2 --out b
[[ $rc -eq 0 ]] || fail "run b: exit $rc"
ida=$(config_id a) idb=$(config_id b)
check "each run has an id of its own in config.ini ('$ida', '$idb')" \
  test -n "$ida" -a -n "$idb" -a "$ida" != "$idb"
check "a's checkpoints and metrics.h5 record its id" \
  test -n "$ida" -a "$(attr a/checkpoints/step_00000010.h5) $(attr a/checkpoints/step_00000005.h5) $(attr a/metrics.h5)" == "$ida $ida $ida"
foreign=b/checkpoints/step_00000030.h5

# ---- a checkpoint of another run copied in: refused, later or named by latest
cp -r a fc && cp "$foreign" fc/checkpoints/
before=$(state fc)
train --steps 40 --resume auto --out fc
refused "a foreign checkpoint copied in" 2 \
  "--resume auto: fc/checkpoints/step_00000030.h5 is a checkpoint of run $idb, but fc holds run $ida (config.ini)"
unchanged "a foreign checkpoint copied in" fc "$before"
echo step_00000030.h5 >fc/checkpoints/latest
before=$(state fc)
train --steps 40 --resume auto --out fc
refused "a foreign checkpoint named by latest" 2 "fc/checkpoints/step_00000030.h5 is a checkpoint of run $idb"
unchanged "a foreign checkpoint named by latest" fc "$before"

# ---- a metrics.h5 of another run copied in
cp -r a fm && cp b/metrics.h5 fm/
before=$(state fm)
train --steps 20 --resume auto --out fm
refused "a foreign metrics.h5" 2 "fm/metrics.h5 holds the metrics of run $idb, but fm holds run $ida"
unchanged "a foreign metrics.h5" fm "$before"

# ---- --resume PATH of another run
cp -r a fp
before=$(state fp)
train --steps 40 --resume "$foreign" --out fp
refused "--resume of a foreign checkpoint into a run" 2 \
  "--resume: $foreign is a checkpoint of run $idb, but fp holds run $ida" "--resume-other-run"
unchanged "--resume of a foreign checkpoint" fp "$before"
train --steps 35 --log-every 5 --resume "$foreign" --resume-other-run --out fp
check "--resume-other-run continues it (exit $rc)" test "$rc" -eq 0
check "the directory keeps its id and records the origin" \
  test "$(config_id fp) $(sed -n 's/^# started-from = //p' fp/config.ini)" == "$ida $foreign (run $idb, step 30)"
check "its new checkpoint is of the directory's run" \
  test -n "$ida" -a "$(attr fp/checkpoints/step_00000035.h5)" == "$ida"
train --steps 35 --resume "$foreign" --out fresh
check "a new directory takes a foreign checkpoint (exit $rc)" test "$rc" -eq 0
idf=$(config_id fresh)
check "as a new run ('$idf') that records where it started" \
  test -n "$idf" -a "$idf" != "$idb" -a "$idf" != "$ida" -a \
  "$(sed -n 's/^# started-from = //p' fresh/config.ini)" == "$foreign (run $idb, step 30)"

# ---- rolling back within the run keeps working (and keeps the id)
cp -r b rb
train --steps 25 --log-every 5 --resume rb/checkpoints/step_00000020.h5 --out rb
check "a rollback trains (exit $rc)" test "$rc" -eq 0
train --steps 30 --log-every 5 --resume auto --out rb
check "--resume auto follows the branch (exit $rc)" test "$rc" -eq 0 -a -e rb/checkpoints/step_00000030.h5
check "the branch is the same run" \
  test -n "$idb" -a "$(config_id rb) $(attr rb/checkpoints/step_00000030.h5)" == "$idb $idb"

# ---- a bad latest: empty, a missing file, outside checkpoints/
mkdir -p elsewhere && cp "$foreign" elsewhere/step_00000099.h5
for bad in empty missing outside link; do
  rm -rf "lt-$bad" && cp -r a "lt-$bad"
  case $bad in
    empty) : >"lt-$bad/checkpoints/latest" ;;
    missing) echo step_00000099.h5 >"lt-$bad/checkpoints/latest" ;;
    outside) echo ../../b/checkpoints/step_00000030.h5 >"lt-$bad/checkpoints/latest" ;;
    link)
      ln -s "$work/elsewhere/step_00000099.h5" "lt-$bad/checkpoints/step_00000099.h5"
      echo step_00000099.h5 >"lt-$bad/checkpoints/latest"
      ;;
  esac
  before=$(state "lt-$bad")
  train --steps 20 --resume auto --out "lt-$bad"
  case $bad in
    empty) says="lt-$bad/checkpoints/latest: is empty (it should name the head checkpoint" ;;
    missing) says="lt-$bad/checkpoints/latest: names step_00000099.h5, which does not exist" ;;
    outside) says="lt-$bad/checkpoints/latest: names '../../b/checkpoints/step_00000030.h5', outside" ;;
    link) says="lt-$bad/checkpoints/latest: names step_00000099.h5, a link to $work/elsewhere/step_00000099.h5 outside" ;;
  esac
  refused "a latest that is $bad" 2 "mpiformer train: --resume auto: $says"
  unchanged "a latest that is $bad" "lt-$bad" "$before"
done

# ---- metrics.h5 deleted (and metrics.jsonl deleted): rebuilt, every row once
every="train 5 train 10 train 15 train 20 eval 10 eval 20"
for gone in metrics.h5 metrics.jsonl; do
  other=metrics.jsonl
  [[ $gone == metrics.h5 ]] || other=metrics.h5
  rm -rf "re-$gone" && cp -r a "re-$gone" && rm "re-$gone/$gone"
  train --steps 20 --log-every 5 --eval-every 10 --checkpoint-every 5 --resume auto --out "re-$gone"
  check "$gone deleted: the run resumes (exit $rc)" test "$rc" -eq 0
  check "$gone deleted: a note says it was rebuilt" \
    grep -qxF "note: $gone was missing: rebuilt from $other (2 train and 1 eval row(s) through step 10)" "$out"
  check "$gone deleted: both files hold every row once ($(rows "re-$gone" | tr '\n' '|'))" \
    test "$(rows "re-$gone" | tr '\n' '|')" == "$every|$every|"
done

# ---- a run directory of a version without ids resumes and gets one
cp -r a old
python3 - old/metrics.h5 old/checkpoints/*.h5 <<'EOF'
import sys, h5py
for path in sys.argv[1:]:
    with h5py.File(path, "r+") as f:
        if "run_id" in f.attrs:
            del f.attrs["run_id"]
EOF
sed -i '/^# run-id = /d' old/config.ini
train --steps 15 --log-every 5 --resume auto --out old
check "an old run directory resumes (exit $rc)" test "$rc" -eq 0
ido=$(config_id old)
check "and is given an id ('$ido') in config.ini, metrics.h5 and the new checkpoint" \
  test -n "$ido" -a "$(attr old/metrics.h5) $(attr old/checkpoints/step_00000015.h5)" == "$ido $ido"
check "its rows are kept" test "$(rows old | sed -n 1p)" == "train 5 train 10 train 15 eval 10 eval 15"
cp -r old old2
train --steps 20 --resume old/checkpoints/step_00000010.h5 --out old2
check "its checkpoints without an id resume anywhere (exit $rc)" test "$rc" -eq 0

# ---- a classifier's label set: renamed or reordered labels are refused
grep -v '^[[:space:]]*$' /usr/share/common-licenses/GPL-3 >gpl.txt
head -n 300 gpl.txt >text.txt
# alpha 3 in 6 lines, beta 2, gamma 1: ids in that order (most frequent first)
awk '{ r = NR % 6; print (r < 3 ? "alpha" : (r < 5 ? "beta" : "gamma")) }' text.txt >labels.txt
sed 's/gamma/delta/' labels.txt >renamed.txt
sed 's/alpha/x/; s/beta/alpha/; s/x/beta/' labels.txt >reordered.txt
prep() {
  timeout 60 "$bin" prepare --kind classify --input text.txt --labels "$1" --out "$2" --shards 1 \
    --valid-lines 30 "${@:3}" >"$out" 2>"$err" || fail "prepare $2"
}
prep labels.txt cls --vocab-size 200
prep renamed.txt cls-renamed --tokenizer cls/tokenizer.model
prep reordered.txt cls-reordered --tokenizer cls/tokenizer.model
model=(--model classify --loss softmax --pool mean --layers 1 --heads 2 --d-model 32 --d-ff 64
  --max-len 64 --max-tokens 512 --threads 1 --eval-batches 2)
train --data cls --steps 2 --out crun
[[ $rc -eq 0 ]] || fail "the classifier run: exit $rc"
ckpt=crun/checkpoints/step_00000002.h5
rc=0
timeout 60 "$bin" eval --checkpoint "$ckpt" --data cls >"$out" 2>"$err" || rc=$?
check "eval on the classifier's own shards (exit $rc)" test "$rc" -eq 0
for set in renamed:"label 2 is 'gamma' in the checkpoint and 'delta' in the shards of cls-renamed" \
  reordered:"label 0 is 'alpha' in the checkpoint and 'beta' in the shards of cls-reordered"; do
  name=${set%%:*} says=${set#*:}
  rc=0
  timeout 60 "$bin" eval --checkpoint "$ckpt" --data "cls-$name" >"$out" 2>"$err" || rc=$?
  refused "eval on $name labels" 2 "mpiformer eval: --data: the label sets differ: $says"
  rm -rf "cr-$name" && cp -r crun "cr-$name"
  before=$(state "cr-$name")
  train --data "cls-$name" --steps 4 --resume auto --out "cr-$name"
  refused "resume on $name labels" 2 "mpiformer train: --data: the label sets differ: $says"
  unchanged "resume on $name labels" "cr-$name" "$before"
done

exit_on_failures
echo "all run id and label set checks passed"
