#!/usr/bin/env bash
# `mpiformer prepare` under mpirun -np 2 on samples of the two demo corpora,
# lm (King James Bible verses) and seq2seq (English->German gettext
# messages): decoding every sequence of the shards, train shards then the
# validation shard, with the tokenizer they carry gives back the input lines,
# in order, as SentencePiece's normalisation leaves them. Also: blank lines
# and pairs with a blank side are skipped, -np 1 writes the same tokenizer and
# text as -np 2, and --tokenizer reuses a model unchanged.
#
# usage: prepare_roundtrip.sh /path/to/mpiformer WORKDIR
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

bin=${1:?usage: prepare_roundtrip.sh /path/to/mpiformer WORKDIR}
work=${2:?usage: prepare_roundtrip.sh /path/to/mpiformer WORKDIR}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
decoder=$(dirname "$bin")/tests/decode_shards
mpiexec=${MPIEXEC:-$(command -v mpirun)}

if [[ ! -x $decoder ]]; then
  echo "FAIL: $decoder is missing (it is built with the tests)" >&2
  exit 1
fi
rm -rf "$work"
mkdir -p "$work"
cd "$work" || exit 1

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# prepare NP ARGS...: runs prepare under mpirun; a hang fails after 60 s.
prepare() {
  local np=$1
  shift
  run_logged "prepare-$np-$(basename "${*: -1}").log" \
    timeout 60 "$mpiexec" -q -n "$np" "$bin" prepare "$@" ||
    fail "prepare $* exited with $?"
}

squeeze_spaces() { sed 's/\r$//; s/  */ /g; s/^ //; s/ $//'; }

# ---- the corpora: 3,000 lines of each, with blank lines and CRLF mixed in ----
"$repo/data/extract-kjv.sh" kjv-all.txt
"$repo/data/extract-gettext-de.sh" gettext-all.en gettext-all.de
# Lines 101-102 blank, line 200 ends in CRLF: prepare must skip and strip them.
head -n 3000 kjv-all.txt | sed '100a\
\
   ' | sed '200s/$/\r/' >lm.txt
# The gettext corpus is shuffled with a fixed seed, so its head is a fair sample.
head -n 3000 gettext-all.en >src.txt
head -n 3000 gettext-all.de >tgt.txt
# Pairs with a blank side: prepare skips both lines.
sed -i '10s/.*//' tgt.txt
sed -i '20s/.*/   /' src.txt

# ---- lm ----
prepare 2 --kind lm --input lm.txt --shards 3 --vocab-size 2000 --valid-lines 200 --out lm
grep -q "2,800 training sequences in 3 shard(s), 200 validation" "prepare-2-lm.log" ||
  fail "lm: expected 2,800 training and 200 validation sequences"
holds_only lm tokenizer.model train-00000.h5 train-00001.h5 train-00002.h5 valid-00000.h5
grep -v '^[[:space:]]*$' lm.txt | squeeze_spaces >lm.expected
"$decoder" lm >lm.decoded
# The verses are ASCII: the text comes back exactly, but for runs of spaces.
same lm.decoded lm.expected "lm: decoded shards equal the input"
"$decoder" lm --normalize lm.txt >lm.normalized
same lm.decoded lm.normalized "lm: decoded shards equal the normalised input"

# The same shards from one rank, and from the tokenizer just trained.
prepare 1 --kind lm --input lm.txt --shards 3 --vocab-size 2000 --valid-lines 200 --out lm-np1
cmp -s lm/tokenizer.model lm-np1/tokenizer.model || fail "-np 1 trained another tokenizer"
"$decoder" lm-np1 >lm-np1.decoded
same lm-np1.decoded lm.decoded "lm: -np 1 and -np 2 write the same text"
prepare 2 --kind lm --input lm.txt --shards 2 --valid-lines 200 --tokenizer lm/tokenizer.model \
  --out lm-reuse
cmp -s lm/tokenizer.model lm-reuse/tokenizer.model || fail "--tokenizer: model not kept as is"
"$decoder" lm-reuse >lm-reuse.decoded
same lm-reuse.decoded lm.decoded "lm: --tokenizer gives the same text"

# ---- seq2seq ----
prepare 2 --kind seq2seq --input src.txt --target tgt.txt --shards 4 --vocab-size 4000 \
  --valid-lines 100 --out s2s
grep -q "2,898 training sequences in 4 shard(s), 100 validation" "prepare-2-s2s.log" ||
  fail "seq2seq: expected 2,898 training and 100 validation pairs"
grep -q "2 skipped" "prepare-2-s2s.log" || fail "seq2seq: expected 2 skipped pairs"
holds_only s2s tokenizer.model train-00000.h5 train-00001.h5 train-00002.h5 train-00003.h5 \
  valid-00000.h5
# The pairs prepare keeps, each side normalised by the shards' own tokenizer
# (NFKC turns some characters of the German side, such as no-break spaces,
# into others; the order and the pairing are what this checks).
paste src.txt tgt.txt | awk -F'\t' '$1 !~ /^[ \t]*$/ && $2 !~ /^[ \t]*$/' >pairs.kept
cut -f1 pairs.kept >src.kept
cut -f2 pairs.kept >tgt.kept
"$decoder" s2s --normalize src.kept >src.normalized
"$decoder" s2s --normalize tgt.kept >tgt.normalized
"$decoder" s2s source >src.decoded
"$decoder" s2s target >tgt.decoded
same src.decoded src.normalized "seq2seq: decoded sources equal the normalised input"
same tgt.decoded tgt.normalized "seq2seq: decoded targets equal the normalised target"
changed=$(squeeze_spaces <tgt.kept | diff - tgt.decoded | grep -c '^>' || true)
echo "note: NFKC changed $changed of $(wc -l <tgt.kept) target lines beyond spaces"

echo "prepare_roundtrip: all checks passed"
