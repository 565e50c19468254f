#!/usr/bin/env bash
# Choosing a model on a real corpus (the gettext English-German pairs):
#  - --valid-bleu: the BLEU a seq2seq run reports for its validation split
#    is sacreBLEU's score of `mpiformer generate --split valid` on the same
#    checkpoint, the same on 2 ranks as on 1;
#  - --keep-best 2: checkpoints/best/ holds the checkpoints of the two best
#    evaluations of checkpoints/validation.tsv, even after --keep-checkpoints
#    pruned them from checkpoints/, and checkpoints/best.h5 is the best one
#    (eval gives its recorded nll);
#  - --early-stop 1: the run stops with a checkpoint at the first evaluation
#    that is not better than the best before it, and goes no further.
#
# usage: model_choice.sh /path/to/mpiformer WORKDIR
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

bin=${1:?usage: model_choice.sh /path/to/mpiformer WORKDIR}
work=${2:?usage: model_choice.sh /path/to/mpiformer WORKDIR}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
failures=0 out=$work/out.txt err=$work/err.txt
touch "$out" "$err"
mpirun=("${MPIEXEC:-mpirun}" -q)

"$repo/data/extract-gettext-de.sh" gettext.en gettext.de >/dev/null
head -n 4000 gettext.en >src.txt
head -n 4000 gettext.de >tgt.txt
"$bin" prepare --kind seq2seq --input src.txt --target tgt.txt --out s2s --shards 2 \
  --vocab-size 1000 --valid-lines 100 >prepare.log
"$bin" prepare --kind lm --input src.txt --out lm --shards 2 --vocab-size 800 \
  --valid-lines 200 >>prepare.log

# ---- --valid-bleu: the train's BLEU is sacreBLEU's of generate's translations
s2s=(train --model seq2seq --data s2s --enc-layers 2 --dec-layers 2 --d-model 64 --heads 2
  --d-ff 256 --max-len 48 --max-tokens 2048 --lr 5e-3 --warmup 50 --steps 300 --eval-every 150
  --log-every 50 --threads 1 --valid-bleu true)
"${mpirun[@]}" -np 2 "$bin" "${s2s[@]}" --out bleu2 >bleu2.log 2>&1 ||
  fail "seq2seq --valid-bleu on 2 ranks: exit $?: $(tail -n 3 bleu2.log)"
"$bin" "${s2s[@]}" --accum-steps 2 --out bleu1 >bleu1.log 2>&1 ||
  fail "seq2seq --valid-bleu on 1 rank: exit $?: $(tail -n 3 bleu1.log)"
# The eval rows' bleu column, every digit.
bleu_of() {
  python3 - "$1" <<'PY'
import sys
import h5py
with h5py.File(sys.argv[1], "r") as f:
    print(" ".join(f"{int(step)}:{float(bleu)!r}" for step, bleu in zip(f["eval/step"][:], f["eval/bleu"][:])))
PY
}
scores2=$(bleu_of bleu2/metrics.h5) scores1=$(bleu_of bleu1/metrics.h5)
check "valid BLEU at both evaluations on 2 ranks ($scores2) equals 1 rank's ($scores1)" \
  test -n "$scores2" -a "$scores2" = "$scores1"
final=${scores2##*:}
"$bin" generate --checkpoint bleu2/checkpoints/step_00000300.h5 --data s2s --split valid \
  --references ref.txt --output hyp.txt --threads 2 >generate.log 2>&1 ||
  fail "generate --split valid: $(tail -n 2 generate.log)"
sacre=$(python3 -m sacrebleu ref.txt -i hyp.txt -m bleu -b -w 6)
check "valid BLEU at step 300 ($final) is sacreBLEU's of generate's translations ($sacre)" \
  awk -v a="$final" -v b="$sacre" 'BEGIN { d = a - b; exit !(a > 0 && d * d < 1e-10) }'
check "the final eval line gives the BLEU" grep -q "^final eval | .* | BLEU [0-9.]*$" bleu2.log

# ---- --keep-best 2, pruned by --keep-checkpoints 1; --early-stop 1
lm=(train --model lm --data lm --layers 1 --d-model 32 --heads 2 --d-ff 64 --max-len 48
  --max-tokens 1024 --lr 3e-2 --steps 400 --eval-every 5 --log-every 50 --threads 2
  --checkpoint-every 5 --keep-checkpoints 1 --keep-best 2 --early-stop 1)
rc=0
"$bin" "${lm[@]}" --out best >best.log 2>&1 || rc=$?
check "the lm with --early-stop 1 ends 0 (got $rc)" test "$rc" -eq 0
# validation.tsv: every evaluation; the two best by nll (ties: the earlier).
mapfile -t rows < <(grep -v '^#' best/checkpoints/validation.tsv)
stopped=$(sed -n 's/^early stop after step \([0-9]*\):.*/\1/p' best.log)
check "the run stopped early (at step ${stopped:-none} of 400)" test -n "$stopped"
last=${rows[-1]%%$'\t'*}
check "the last evaluation recorded is the stop's ($last)" test "$last" = "$stopped"
best_two=$(printf '%s\n' "${rows[@]}" | sort -t $'\t' -k3,3g -k1,1n | head -n 2 | cut -f1 | sort -n)
kept=$(find best/checkpoints/best -name 'step_*.h5' -printf '%f\n' | sed 's/step_0*//; s/\.h5//' |
  sort -n)
check "best/ holds the two best evaluations' checkpoints ($(echo $kept))" \
  test "$kept" = "$best_two" -a -n "$kept"
first=$(echo "$best_two" | head -n 1)
best_step=$(printf '%s\n' "${rows[@]}" | sort -t $'\t' -k3,3g -k1,1n | head -n 1 | cut -f1)
check "best.h5 is the best one's checkpoint (step $best_step)" \
  cmp -s best/checkpoints/best.h5 "best/checkpoints/best/$(printf 'step_%08d.h5' "$best_step")"
check "pruning by --keep-checkpoints 1 left best/ whole: checkpoints/ holds one step file" \
  test "$(find best/checkpoints -maxdepth 1 -name 'step_*.h5' | wc -l)" -eq 1
recorded=$(printf '%s\n' "${rows[@]}" | awk -F '\t' -v s="$best_step" '$1 == s { printf "%.4f", $3 }')
evaluated=$("$bin" eval --checkpoint best/checkpoints/best.h5 --data lm --threads 2 2>&1 |
  sed -n 's/.* nll \([0-9.]*\) .*/\1/p')
check "eval of best.h5 gives the recorded nll ($recorded = $evaluated)" \
  test -n "$recorded" -a "$recorded" = "$evaluated"
# The stop: its evaluation is no better than the best before it; every
# earlier one improved on its best within the patience of 1.
verdict=$(printf '%s\n' "${rows[@]}" | awk -F '\t' '
  NR == 1 { best = $3; next }
  { if ($3 < best) { best = $3; better = 1 } else { better = 0 }
    if (!better && NR < n) { print "an earlier evaluation (step " $1 ") was not better"; exit } }
  END { if (better) print "the last evaluation was better" }' n="${#rows[@]}")
check "the stop came at the first evaluation without a better nll${verdict:+ ($verdict)}" \
  test -z "$verdict"
check "the stop wrote a checkpoint of its step" \
  test "$(cat best/checkpoints/latest)" = "$(printf 'step_%08d.h5' "$stopped")"

exit_on_failures
echo "model_choice: all checks passed"
