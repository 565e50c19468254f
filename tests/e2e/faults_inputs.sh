#!/usr/bin/env bash
# Inputs a user gets wrong, each one line with the documented exit code
# (docs/DESIGN.md section 8), never a hang and never silence: a data set
# `train` would refuse, a pipe or a FIFO where a file belongs, a very long
# line, h5py's own string attributes, an output that cannot be written, an
# lm prompt longer than the model, a --config that is a directory or not
# text, flags that do not apply, and two prepare jobs into one directory.
source "$(dirname "$0")/common.sh"
bin=$1 work=$2
rm -rf "$work" && mkdir -p "$work" && cd "$work"
failures=0 out=$work/out.txt err=$work/err.txt

grep -v '^[[:space:]]*$' /usr/share/common-licenses/GPL-3 >gpl.txt
head -n 400 gpl.txt >text.txt

# ---- prepare: a set train would refuse is refused here
try "$bin" prepare --input text.txt --out none --vocab-size 200 --valid-lines 0
refused "--valid-lines 0" 2 "--valid-lines: must be at least 1"
head -n 6 text.txt >six.txt
try "$bin" prepare --input six.txt --out six --vocab-size 100 --shards 1
refused "six lines" 2 "six.txt has 6 usable lines; at least 10 are needed"
check "nothing is left of a refused prepare" test ! -e six

# a pipe or FIFO as --input: refused, not read (SentencePiece reads twice)
mkfifo fifo.txt
try "$bin" prepare --input fifo.txt --out piped --vocab-size 100
refused "a FIFO as --input" 2 "--input: fifo.txt is not a regular file"
try "$bin" prepare --input <(cat text.txt) --out piped --vocab-size 100
refused "a pipe as --input" 2 "is not a regular file"

# a 1 MB line among ordinary ones is left out of the tokenizer's training
# (and encoded); a text of nothing but such lines is named. (The long line
# comes first: the last lines are held out for validation, whose lines the
# tokenizer never reads.)
{
  head -c 1000000 /dev/zero | tr '\0' 'a'
  echo
  head -n 30 text.txt
} >long.txt
try "$bin" prepare --input long.txt --out long --vocab-size 100 --shards 1 --valid-lines 2
check "a 1 MB line prepares (exit $rc: $(head -c 300 "$err"))" test "$rc" -eq 0
check "the line is said to be left out of training" \
  grep -q "1 line(s) longer than 4192 bytes are left out of the tokenizer's training" "$out"
for _ in $(seq 12); do
  head -c 5000 /dev/zero | tr '\0' 'b'
  echo
done >wide.txt
try "$bin" prepare --input wide.txt --out wide --vocab-size 100 --shards 1
refused "only long lines" 2 "--input: wide.txt: every line is longer than the 4192 bytes"

# two prepare jobs into one --out: the second is refused and changes nothing
try "$bin" prepare --input text.txt --out shards --vocab-size 200 --shards 2 --valid-lines 20
[[ $rc -eq 0 ]] || fail "prepare: exit $rc"
mkdir -p busy && echo "otherhost 4242" >busy/.lock
try flock busy/.lock "$bin" prepare --input text.txt --out busy --vocab-size 200
refused "prepare into a locked --out" 2 \
  "--out: busy is in use by another process (host otherhost, pid 4242"
check "the refused prepare wrote nothing" test "$(ls -A busy)" == .lock

# ---- shards: h5py's variable-length UTF-8 strings are read; a FIFO is refused
cp -r shards h5py-shards
python3 - <<'EOF'
import glob, h5py
for path in glob.glob("h5py-shards/*.h5"):
    with h5py.File(path, "r+") as f:
        for name in ("format", "kind"):
            value = f.attrs[name]
            value = value.decode() if isinstance(value, bytes) else str(value)
            del f.attrs[name]
            f.attrs[name] = value  # h5py's default: variable-length UTF-8
EOF
try "$bin" inspect h5py-shards/train-00000.h5
check "inspect reads h5py's string attributes (exit $rc: $(head -c 200 "$err"))" test "$rc" -eq 0
try "$bin" train --model lm --data h5py-shards --out h5py-run --layers 1 --d-model 16 --heads 2 \
  --d-ff 32 --max-len 64 --max-tokens 512 --steps 2 --threads 1
check "train reads h5py's string attributes (exit $rc: $(head -c 200 "$err"))" test "$rc" -eq 0
try "$bin" eval --checkpoint h5py-run/checkpoints/step_00000002.h5 --data h5py-shards \
  --max-tokens 1000000000
refused "eval --max-tokens 1e9" 2 "mpiformer eval: --max-tokens: the model needs about"
mkdir -p fifo-shards && cp shards/valid-00000.h5 shards/train-00001.h5 fifo-shards/
mkfifo fifo-shards/train-00000.h5
try "$bin" train --model lm --data fifo-shards --out fifo-run --steps 2 --threads 1
refused "a FIFO named as a shard" nonzero "fifo-shards/train-00000.h5: not a regular file"

# ---- generate
"$bin" train --model lm --synthetic copy --layers 1 --d-model 16 --heads 2 --d-ff 32 --max-len 16 \
  --max-tokens 128 --steps 2 --threads 1 --out lm >/dev/null
"$bin" train --model seq2seq --synthetic reverse --enc-layers 1 --dec-layers 1 --d-model 16 \
  --heads 2 --d-ff 32 --max-len 16 --max-tokens 128 --steps 2 --threads 1 --out s2s >/dev/null
lm=lm/checkpoints/step_00000002.h5 s2s=s2s/checkpoints/step_00000002.h5
rc=0
timeout 60 "$bin" generate --checkpoint "$lm" --prompt "7 8 9" >/dev/full 2>"$err" || rc=$?
refused "generate to a full stdout" 1 \
  "mpiformer generate: cannot write the output (stdout: No space left on device)"
printf '7 8\n9 10 11\n%s\n7\n' "$(seq 6 30 | tr '\n' ' ')" >prompts.txt
try "$bin" generate --checkpoint "$lm" --input prompts.txt
refused "an lm prompt longer than max-len" 2 "--input: prompts.txt line 3: 25 tokens" \
  "max-len 16"
check "nothing was generated before the refusal" test ! -s "$out"
try "$bin" generate --checkpoint "$s2s" --prompt "7 8 9" --top-k 5
refused "--top-k with seq2seq" 2 "--top-k: top-k sampling is for lm checkpoints"

# ---- --config: a directory or bytes that are not text
mkdir -p confdir
try "$bin" train --config confdir --synthetic copy --steps 1 --out c1
refused "--config a directory" 2 "--config: confdir is a directory"
head -c 3000 /bin/sh >binary.ini
try "$bin" train --config binary.ini --synthetic copy --steps 1 --out c2
refused "--config not text" 2 "--config: binary.ini line 1 is not text"
check "no raw bytes are echoed" bash -c "! LC_ALL=C grep -q '[^[:print:][:space:]]' '$err'"

exit_on_failures
echo "all input fault checks passed"
