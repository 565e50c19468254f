#!/usr/bin/env bash
# Decoding with the key/value cache gives exactly the tokens of decoding
# that recomputes every prefix (--cache false), one sentence at a time
# (--max-tokens 1) and over two ranks (mpirun -np 2, one file from rank 0),
# on a prepared real corpus (gettext en -> de, and an lm of its English) and
# on a synthetic task: seq2seq greedy and beam 5, lm greedy, beam 4 and top-k
# sampling with a seed; in bf16 and fp16 as well. --min-new-tokens holds EOS
# back. Models of d-model 64 multiply on shapes whose
# OpenBLAS bits depend on the rows beside (src/model/decoding.h).
source "$(dirname "$0")/common.sh"
bin=$1 work=$2
repo=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
failures=0
mpirun() { "$MPIEXEC" -q -np "$@"; }

"$repo/data/extract-gettext-de.sh" gettext.en gettext.de >/dev/null
head -n 2000 gettext.en >src.txt
head -n 2000 gettext.de >tgt.txt
"$bin" prepare --kind seq2seq --input src.txt --target tgt.txt --out s2s --shards 2 \
  --vocab-size 800 --valid-lines 20 --test-lines 60 >/dev/null
"$bin" prepare --kind lm --input src.txt --out lm --shards 2 --vocab-size 800 \
  --valid-lines 20 >/dev/null
small=(--d-model 64 --heads 4 --d-ff 128 --max-tokens 2048 --steps 120 --lr 3e-3
  --log-every 60 --threads 1)
"$bin" train --model seq2seq --data s2s --out s2s-run --enc-layers 2 --dec-layers 2 \
  --max-len 40 "${small[@]}" >s2s-train.log
"$bin" train --model lm --data lm --out lm-run --layers 2 --max-len 64 "${small[@]}" \
  >lm-train.log
"$bin" train --model seq2seq --synthetic reverse --out rev-run --enc-layers 1 --dec-layers 1 \
  --vocab 24 --max-len 16 "${small[@]}" >rev-train.log
ckpt=checkpoints/step_00000120.h5
sed -n '1900,1930p' src.txt | cut -c1-30 >prompts.txt
awk 'BEGIN { srand(7); for (i = 0; i < 30; ++i) { n = 3 + int(rand() * 12); line = "";
  for (j = 0; j < n; ++j) line = line (j ? " " : "") (6 + int(rand() * 18)); print line } }' \
  >reverse.txt

# same NAME GENERATE-ARGS...: the cached output, then the same decoding
# recomputed, one sentence at a time and over two ranks, byte for byte.
same() {
  local name=$1
  shift
  "$bin" generate "$@" --threads 1 --output "$name.txt" 2>"$name.err" ||
    fail "$name: generate exited $? ($(head -c 300 "$name.err"))"
  check "$name: some output ($(wc -l <"$name.txt") lines)" grep -q '[^[:space:]]' "$name.txt"
  "$bin" generate "$@" --threads 1 --cache false --output "$name-recomputed.txt" 2>/dev/null
  check "$name: --cache false gives the same output" cmp -s "$name.txt" "$name-recomputed.txt"
  "$bin" generate "$@" --threads 1 --max-tokens 1 --output "$name-alone.txt" 2>/dev/null
  check "$name: one sentence at a time gives the same output" cmp -s "$name.txt" "$name-alone.txt"
  mpirun 2 "$bin" generate "$@" --threads 1 --max-tokens 400 --output "$name-np2.txt" \
    2>"$name-np2.err" || fail "$name: mpirun -np 2 generate exited $? ($(head -c 300 "$name-np2.err"))"
  check "$name: -np 2 gives the same file" cmp -s "$name.txt" "$name-np2.txt"
}

same s2s-greedy --checkpoint s2s-run/$ckpt --data s2s --split test --max-new-tokens 30
same s2s-beam5 --checkpoint s2s-run/$ckpt --data s2s --split test --beam 5 --max-new-tokens 30
same lm-greedy --checkpoint lm-run/$ckpt --input prompts.txt --max-new-tokens 30
same lm-beam4 --checkpoint lm-run/$ckpt --input prompts.txt --beam 4 --max-new-tokens 30
same lm-topk --checkpoint lm-run/$ckpt --input prompts.txt --top-k 20 --seed 9 --max-new-tokens 30
same rev-greedy --checkpoint rev-run/$ckpt --input reverse.txt
same rev-beam5 --checkpoint rev-run/$ckpt --input reverse.txt --beam 5
# bf16 and fp16 weights and activations decode batch-invariant as fp32 does.
same lm-greedy-bf16 --checkpoint lm-run/$ckpt --input prompts.txt --max-new-tokens 30 \
  --precision bf16
same s2s-beam5-fp16 --checkpoint s2s-run/$ckpt --data s2s --split test --beam 5 \
  --max-new-tokens 30 --precision fp16
# --min-new-tokens: no line of the reverse task ends before 12 ids (its
# inputs are 3 to 14 ids, and a model that learnt them stops after as many).
"$bin" generate --checkpoint rev-run/$ckpt --input reverse.txt --min-new-tokens 12 \
  --threads 1 --output rev-min12.txt 2>rev-min12.err
check "--min-new-tokens 12: every line has at least 12 ids" \
  awk 'NF < 12 { exit 1 }' rev-min12.txt
check "--min-new-tokens 12: the inputs' own lengths ended lines before 12 without it" \
  awk 'NF < 12 { found = 1 } END { exit !found }' rev-greedy.txt
# --profile: a table of decoding's op families on stderr, the output unchanged.
"$bin" generate --checkpoint lm-run/$ckpt --input prompts.txt --max-new-tokens 30 --threads 1 \
  --profile --output lm-profile.txt 2>lm-profile.err
check "--profile: the same output" cmp -s lm-greedy.txt lm-profile.txt
check "--profile: the decoding steps, then each op family's time per step" \
  grep -q "^generate --profile: [0-9]* decoding steps of [0-9.]* rows in [0-9.]* s" lm-profile.err
for family in gemm attention layernorm; do
  check "--profile: $family's time per step" grep -q "^  $family  *[0-9.]* ms  *[0-9.]*%" lm-profile.err
done
check "--profile: the time outside the ops" \
  grep -q "^  other  *[0-9.-]* ms  *[0-9.-]*%  (the choice of tokens" lm-profile.err
check "--profile: the costliest calls" \
  grep -q "^ *[0-9.]* ms  *[0-9.]*  *[0-9.]*%  attention_listed (fp32; R " lm-profile.err
check "the closing line gives tokens/s and where the time went" \
  grep -q "tokens/s; model calls [0-9.]* s, choice of tokens [0-9.]* s" rev-min12.err
check "the two-rank run says how it shares the work" grep -q "at a time as a key/value cache of [0-9]* rows holds, over 2 ranks" \
  s2s-beam5-np2.err

exit_on_failures
echo "cached, recomputed, one-at-a-time and two-rank decoding agree"
