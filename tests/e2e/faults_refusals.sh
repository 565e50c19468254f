#!/usr/bin/env bash
# What the user gave that cannot work is refused before anything starts
# (docs/DESIGN.md section 8): exit 2, one line naming the flag and why, and
# no --out directory left behind; under mpirun one line for all ranks.
#   - train: flags the shards contradict (--num-labels, --vocab, --model,
#     --patch, --image-height, --max-len for images), a --max-tokens under
#     one sequence, --loss softmax on multi-label shards, --too-long skip
#     when no sequence fits; activations that fit only with --recompute
#     activation, which the refusal names; eval --max-tokens under one
#     sequence;
#   - classify: its memory is estimated and printed before anything is
#     allocated, a --batch that cannot fit is refused naming what fits, and
#     a model of many labels does not hold (tokens x labels) scores;
#   - generate: a classifier checkpoint, or shards of another kind, are
#     named for what they are.
source "$(dirname "$0")/common.sh"
bin=$1 work=$2
rm -rf "$work" && mkdir -p "$work" && cd "$work"
mpirun=("${MPIEXEC:-mpirun}" -q)
failures=0 out=$work/out.txt err=$work/err.txt

try_seconds=120  # the limit of `try` (common.sh)

# ---- fixtures: tiny shard sets of each kind and 1-step checkpoints
grep -v '^[[:space:]]*$' /usr/share/common-licenses/GPL-3 >gpl.txt
head -n 300 gpl.txt >text.txt
awk '{ print "L" (NR % 211) }' text.txt >one.labels                # 211 labels, one each
awk '{ print "A" (NR % 5) " B" (NR % 3) }' text.txt >multi.labels  # two labels each
prep=(--shards 1 --valid-lines 20)
"$bin" prepare --input text.txt --out lm --vocab-size 200 "${prep[@]}" >/dev/null
"$bin" prepare --kind classify --input text.txt --labels one.labels --out cls \
  --tokenizer lm/tokenizer.model "${prep[@]}" >/dev/null
"$bin" prepare --kind classify --input text.txt --labels multi.labels --out multi \
  --tokenizer lm/tokenizer.model "${prep[@]}" >/dev/null
"$bin" prepare --kind seq2seq --input text.txt --target text.txt --out s2s \
  --tokenizer lm/tokenizer.model "${prep[@]}" >/dev/null
python3 - <<'EOF'
import numpy as np
r = np.random.RandomState(0)
np.savez("img.npz", images=r.randint(0, 256, (200, 8, 8)).astype(np.uint8),
         labels=(np.arange(200) % 4).astype(np.int64))
EOF
"$bin" prepare --kind image --input img.npz --out img "${prep[@]}" >/dev/null
small=(--layers 1 --d-model 16 --heads 2 --d-ff 32 --steps 1 --threads 1 --eval-batches 1)
"$bin" train "${small[@]}" --model lm --data lm --max-len 64 --max-tokens 512 --out lm-run >/dev/null
"$bin" train "${small[@]}" --model classify --data cls --max-len 64 --max-tokens 512 \
  --out cls-run >/dev/null
"$bin" train "${small[@]}" --model classify --data img --patch 2 --max-len 17 --max-tokens 512 \
  --out img-run >/dev/null
"$bin" train --model seq2seq --enc-layers 1 --dec-layers 1 "${small[@]:2}" --data s2s \
  --max-len 64 --max-tokens 512 --out s2s-run >/dev/null
ckpt=checkpoints/step_00000001.h5

# ---- train: each refusal is exit 2, one line, and leaves no --out behind
# refused_train WHAT NEEDLE FLAGS...: train into a new run/sub (its parent
# is new too) is refused with NEEDLE, and neither directory is left.
refused_train() {
  local what=$1 needle=$2
  shift 2
  try "$bin" train "${small[@]}" --out run/sub "$@"
  refused "train $what" 2 "mpiformer train: $needle"
  check "train $what leaves no --out directory" test ! -e run
}
refused_train "--num-labels 10" "--num-labels: the shards in cls have 211 labels; got 10" \
  --model classify --data cls --num-labels 10 --max-len 64 --max-tokens 512
refused_train "--vocab 1000" "--vocab: the shards in lm have vocabulary 200; got 1000" \
  --model lm --data lm --vocab 1000 --max-len 64 --max-tokens 512
refused_train "--model classify on lm shards" \
  "--model: classify reads classify shards; the shards in lm are lm" \
  --model classify --data lm --max-len 64 --max-tokens 512
refused_train "--patch 3" "--patch: 3 does not divide the 8 x 8 images in img" \
  --model classify --data img --patch 3 --max-len 64 --max-tokens 512
refused_train "--image-height 16" "--image-height: the images in img have 8; got 16" \
  --model classify --data img --patch 2 --image-height 16 --max-len 64 --max-tokens 512
refused_train "--max-len 16 for images" "--max-len: must be at least 17, the rows of one image" \
  --model classify --data img --patch 2 --max-len 16 --max-tokens 512
refused_train "--max-tokens 10" "--max-tokens: must be at least 64" \
  --model lm --data lm --max-len 64 --max-tokens 10
refused_train "--loss softmax on multi-label shards" \
  "--loss: softmax needs exactly one hard label per example; multi/train-00000.h5: example 0 has 2 labels" \
  --model classify --data multi --loss softmax --max-len 64 --max-tokens 512
refused_train "--too-long skip when nothing fits" "--too-long: skip leaves nothing of the" \
  --model lm --data lm --max-len 4 --max-tokens 64 --too-long skip

# A refused start leaves a directory that was there as it was.
mkdir -p kept && echo note >kept/notes.txt
try "$bin" train "${small[@]}" --out kept --model lm --data lm --max-len 64 --max-tokens 10
refused "train into an existing --out, refused" 2 "mpiformer train: --max-tokens: must be at least 64"
check "the existing --out keeps its file and gains none" test "$(ls -A kept)" == notes.txt

# Under mpirun the ranks agree: one line, exit 2, no directory.
mpi_refused() {
  local what=$1 needle=$2
  shift 2
  try "${mpirun[@]}" -np 2 "$bin" train "${small[@]}" --out run "$@"
  refused "mpirun -np 2 train $what" 2 "mpiformer train: $needle"
  check "mpirun -np 2 train $what leaves no --out directory" test ! -e run
}
mpi_refused "--num-labels 10" "--num-labels: the shards in cls have 211 labels; got 10" \
  --model classify --data cls --num-labels 10 --max-len 64 --max-tokens 512
mpi_refused "--max-tokens 10" "--max-tokens: must be at least 64" \
  --model lm --data lm --max-len 64 --max-tokens 10
mpi_refused "--loss softmax on multi-label shards" \
  "--loss: softmax needs exactly one hard label per example" \
  --model classify --data multi --loss softmax --max-len 64 --max-tokens 512

# A run whose activations cannot fit is refused naming the cheapest
# recompute mode that fits: 8 MLPs of d-ff 8192 at 16,384 tokens keep 8 GiB
# of activations, half of them the activation --recompute activation makes
# again in backward; about 6.7 GiB are left under an 8 GiB address space.
try_memory_kb=8388608 try "$bin" train --model lm --synthetic copy --layers 8 --d-model 64 \
  --heads 4 --d-ff 8192 --max-len 64 --max-tokens 16384 --steps 1 --threads 1 --out run/sub
refused "train whose activations fit with --recompute activation" 2 \
  "mpiformer train: the model needs about" "or train with --recompute activation (about" \
  " per rank, which fits)"
check "that refusal leaves no --out directory" test ! -e run

# ---- eval
try "$bin" eval --checkpoint lm-run/$ckpt --data lm --max-tokens 1
refused "eval --max-tokens 1" 2 "mpiformer eval: --max-tokens: must be at least 64"
try "${mpirun[@]}" -np 2 "$bin" eval --checkpoint lm-run/$ckpt --data lm --max-tokens 1
refused "mpirun -np 2 eval --max-tokens 1" 2 "mpiformer eval: --max-tokens: must be at least 64"

# ---- classify: the estimate is printed; a --batch that cannot fit is refused
try "$bin" classify --checkpoint cls-run/$ckpt --text "the program" --threads 1
check "classify runs (exit $rc: $(head -c 300 "$err"))" test "$rc" -eq 0
check "classify prints its memory estimate" grep -q "^mpiformer classify: 1 line(s), 1 at a time (cpu[^)]*): memory about [0-9.]* [KMG]iB (" "$err"
# 60,000 lines at once need many GiB: refused before any is allocated, in
# a 4 GiB address space (ulimit -v) whatever the machine has.
awk '{ for (i = 0; i < 200; ++i) print }' text.txt >many-lines.txt
try_memory_kb=4194304 try_seconds=120 try "$bin" classify --checkpoint cls-run/$ckpt \
  --input many-lines.txt --batch 60000 --threads 1
refused "classify --batch 60000" 2 \
  "mpiformer classify: --batch: scoring 60000 lines at a time needs about" "; lower --batch (" \
  " fits)"
check "the refused classify printed no labels" test ! -s "$out"
# 60,000 labels at the default --batch: the scores are (lines, labels), not
# (tokens, labels) (2 GiB), so it runs in a 2 GiB address space.
awk '{ print "w" (NR % 7) " w" (NR % 11) " w" (NR % 13) }' <(seq 60100) >wide.txt
seq 60100 | awk '{ print "L" ($1 % 60000) }' >wide.labels
"$bin" prepare --kind classify --input wide.txt --labels wide.labels --out wide --shards 1 \
  --vocab-size 20 --valid-lines 100 >/dev/null
"$bin" train "${small[@]}" --model classify --data wide --max-len 128 --max-tokens 256 \
  --out wide-run >/dev/null 2>&1
try_memory_kb=2097152 try_seconds=120 try "$bin" classify --checkpoint wide-run/$ckpt \
  --input text.txt --threads 1 --top 1
check "classify of 60,000 labels at --batch 64 in 2 GiB (exit $rc: $(head -c 300 "$err"))" \
  test "$rc" -eq 0
check "it labels every line" test "$(wc -l <"$out")" -eq "$(wc -l <text.txt)"

# ---- generate names what the checkpoint and the shards are
try "$bin" generate --checkpoint cls-run/$ckpt --prompt "the program"
refused "generate with a text classifier" 2 \
  "mpiformer generate: --checkpoint: cls-run/$ckpt holds a text classifier" \
  "use \`mpiformer classify\`"
try "$bin" generate --checkpoint cls-run/$ckpt --data cls --split valid
refused "generate --data with a text classifier" 2 "holds a text classifier"
try "$bin" generate --checkpoint img-run/$ckpt --data img --split valid
refused "generate with an image classifier" 2 \
  "mpiformer generate: --checkpoint: img-run/$ckpt holds an image classifier" \
  "score image shards with \`mpiformer eval --data DIR\`"
check "an image classifier is not called a synthetic task" bash -c "! grep -q synthetic '$err'"
try "$bin" generate --checkpoint s2s-run/$ckpt --data cls --split valid
refused "generate --data of classify shards" 2 \
  "mpiformer generate: --data: cls/valid-00000.h5 is a shard of kind classify; a seq2seq checkpoint"

exit_on_failures
echo "all refusal checks passed"
