#!/usr/bin/env bash
# The tokenizer analysis/export_hf.py writes beside a GPT-2 export
# (tokenizer.json, converted from the run's SentencePiece model by
# analysis/sentencepiece_model.py): AutoTokenizer.from_pretrained(OUTDIR)
# loads it with transformers and tokenizers alone (the sentencepiece module
# blocked) and, on every held-out line of two demo corpora, gives the ids
# mpiformer's test shards hold, BOS first by default and without it with
# add_special_tokens=False; decoding them gives SentencePiece's text (the
# test helper decode_shards). The King James Bible's test split with the
# README's unigram tokenizer of 4,000 pieces, the German gettext messages'
# with a bpe one; then lines made to catch the whitespace, user-defined
# symbol, unknown character and normalisation rules, encoded by both
# tokenizers through `prepare --tokenizer`. Batches pad on the left with
# the pad id. A tokenizer that would not convert exactly is refused with one
# line, exit 2, nothing written.
#
# transformers runs on the Python of .deps/torch-venv, or
# MPIFORMER_HF_PYTHON; without it the comparison is skipped (exit 77) after
# the refusals, which need only python3 with h5py and numpy.
source "$(dirname "$0")/common.sh"
bin=$1 work=$2
src=$(cd "$(dirname "$0")/../.." && pwd)
decoder=$(dirname "$bin")/tests/decode_shards
if [[ ! -x $decoder ]]; then
  echo "FAIL: $decoder is missing (it is built with the tests)" >&2
  exit 1
fi
rm -rf "$work" && mkdir -p "$work" && cd "$work"
failures=0 out=$work/out.txt err=$work/err.txt
touch "$out" "$err"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HOME=$work/hf-home
hf_python=${MPIFORMER_HF_PYTHON:-$src/.deps/torch-venv/bin/python}

"$src/data/extract-kjv.sh" kjv.txt >/dev/null
"$src/data/extract-gettext-de.sh" messages.en messages.de >/dev/null
"$bin" prepare --kind lm --input kjv.txt --out kjv --shards 1 --vocab-size 4000 \
  --valid-lines 500 --test-lines 500 >prepare-kjv.log
"$bin" prepare --kind lm --input messages.de --out de --shards 1 --vocab-size 4000 \
  --valid-lines 500 --test-lines 3000 --model-type bpe >prepare-de.log

# Lines SentencePiece treats in its own ways. Not here: a line that is only
# [MASK] or [SEP] (bpe keeps no U+2581 before it) and a cluster of combining
# marks of 6 bytes or more (tokenizers normalises it per character), the
# differences analysis/sentencepiece_model.py documents.
python3 - <<'PY'
lines = [
    "  leading, trailing  and   inner spaces  ", "tabs\tand\u3000an ideographic space",
    "a [MASK] b", "a[MASK]b", "[MASK] at the start", "at the end [SEP]", "[SEP][MASK]",
    "x [MASK][MASK] y", "\u2581a literal U+2581", "x \u2581 y", "\ufb01 ligature",
    "\uff26\uff55\uff4c\uff4c width \uff21\uff22\uff23\uff11\uff12\uff13",
    "e\u0301 decomposed, \u00e9 composed", "\u01c4 \u216b \u2460 \u2026 \u2126 \u212b",
    "a control\x07character", "unknown: \U0001F600 \u4e2d\u6587 \uac00 \U0001d400",
    "\u200bzero width, a\u00a0no-break space, x\u00adsoft hyphen, \ufeffBOM",
    "\uff76\uff80\uff76\uff85 half-width kana", "\u0130stanbul \u00df \u1e9e",
    'say "hi" \u201equote\u201c %s %d {0}', "\u00a8 a diaeresis alone",
]
with open("edge.txt", "w", encoding="utf-8", newline="\n") as f:
    f.write("".join(line + "\n" for line in lines))
PY
# prepare --tokenizer encodes them; it wants training lines too.
head -n 200 kjv.txt >text.txt
for set in kjv de; do
  "$bin" prepare --kind lm --input text.txt --tokenizer $set/tokenizer.model --out edge-$set \
    --shards 1 --vocab-size 4000 --valid-lines 1 --test edge.txt >prepare-edge-$set.log
  "$decoder" $set --split test >$set-decoded.txt
  "$decoder" edge-$set --split test >edge-$set-decoded.txt
  # A model of one step: the export is for its tokenizer.
  "$bin" train --model lm --data $set --out run-$set --output-bias false --layers 1 \
    --d-model 16 --heads 2 --d-ff 32 --max-len 32 --max-tokens 512 --steps 1 --threads 1 \
    >train-$set.log
  python3 "$src/analysis/export_hf.py" run-$set/checkpoints/step_00000001.h5 $set-hf >/dev/null
  holds_only $set-hf config.json generation_config.json model.safetensors tokenizer.model \
    tokenizer.json tokenizer_config.json special_tokens_map.json
done

# ---- tokenizers that do not convert exactly: refused, nothing written
# with_tokenizer NAME PYTHON-BYTES-EXPRESSION: a copy of the kjv checkpoint
# whose /tokenizer holds the bytes (of the kjv model, `model`).
with_tokenizer() {
  cp run-kjv/checkpoints/step_00000001.h5 "$1.h5"
  python3 - "$1.h5" kjv/tokenizer.model "$2" <<'PY'
import sys

import h5py
import numpy as np
from mpiformer_checksum import seal

model = open(sys.argv[2], "rb").read()
data = eval(sys.argv[3])
with h5py.File(sys.argv[1], "r+") as f:
    del f["tokenizer"]
    f.create_dataset("tokenizer", data=np.frombuffer(data, dtype=np.uint8), chunks=True,
                     fletcher32=True)
    seal(f["tokenizer"])
PY
}
refuse_tokenizer() { # refuse_tokenizer NAME BYTES NEEDLE
  with_tokenizer "$1" "$2"
  rc=0
  python3 "$src/analysis/export_hf.py" "$1.h5" "$1-hf" >"$out" 2>"$err" || rc=$?
  if expect_one_line_error "$1" 2 "$3" "$1.h5"; then
    if [[ -e $1-hf ]]; then fail "$1: refused, but $1-hf was created"; else
      echo "PASS: $1 refused: $(cat "$err")"
    fi
  fi
}
# Fields appended to a protobuf message merge into it: trainer_spec (2)
# with byte_fallback (35) true, or model_type (3) word; a piece (1) unused.
refuse_tokenizer byte-fallback "model + bytes([0x12, 3, 0x98, 0x02, 1])" "byte fallback"
refuse_tokenizer word-model "model + bytes([0x12, 2, 0x18, 3])" "a word model"
refuse_tokenizer unused "model + bytes([0x0a, 7, 0x0a, 3]) + b'xyz' + bytes([0x18, 5])" \
  "unused pieces"
refuse_tokenizer not-a-model "b'not a model'" "is no SentencePiece model"

if [[ ! -x $hf_python ]] || ! "$hf_python" -c "import transformers, tokenizers" 2>/dev/null; then
  exit_on_failures
  echo "SKIP: no transformers on $hf_python: the tokenizers were not loaded"
  exit 77
fi
rc=0
"$hf_python" - kjv-hf kjv.txt kjv kjv-decoded.txt de-hf messages.de de de-decoded.txt \
  kjv-hf edge.txt edge-kjv edge-kjv-decoded.txt de-hf edge.txt edge-de edge-de-decoded.txt \
  <<'PY' || rc=$?
import sys
import time
import warnings

sys.modules["sentencepiece"] = None  # transformers and tokenizers alone

import h5py  # noqa: E402
import numpy as np  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402
from transformers.utils import logging  # noqa: E402

warnings.simplefilter("ignore")
logging.set_verbosity_error()
failures = 0


def say(ok, message):
    global failures
    failures += not ok
    print(f"{'PASS' if ok else 'FAIL'}: {message}", file=sys.stdout if ok else sys.stderr)


def held_out(text, shards):
    """The test split's lines (the last non-blank lines of the text, or all
    of a --test file) and their ids in the shard, in order."""
    with h5py.File(f"{shards}/test-00000.h5", "r") as f:
        tokens, offsets = np.asarray(f["tokens"]), np.asarray(f["offsets"])
    ids = [tokens[offsets[i]:offsets[i + 1]].tolist() for i in range(len(offsets) - 1)]
    with open(text, encoding="utf-8", newline="\n") as f:
        lines = [line for line in f.read().split("\n") if line.strip(" \t\r\v\f")]
    return lines[-len(ids):], ids


args = sys.argv[1:]
for outdir, text, shards, decoded in zip(args[0::4], args[1::4], args[2::4], args[3::4]):
    tokenizer = AutoTokenizer.from_pretrained(outdir)
    lines, want = held_out(text, shards)
    with open(decoded, encoding="utf-8", newline="\n") as f:
        spm_text = f.read().split("\n")[:-1]
    bos, pad = tokenizer.bos_token_id, tokenizer.pad_token_id
    start = time.time()
    with_bos = tokenizer(lines)["input_ids"]
    plain = tokenizer(lines, add_special_tokens=False)["input_ids"]
    wrong = [k for k in range(len(lines))
             if with_bos[k] != [bos] + want[k] or plain[k] != want[k]]
    for k in wrong[:3]:
        print(f"  line {k + 1} {lines[k]!r}: mpiformer {want[k]}, transformers {plain[k]}",
              file=sys.stderr)
    say(not wrong and len(lines) == len(spm_text),
        f"{outdir} encodes the {len(lines)} held-out lines of {shards} to mpiformer's ids, BOS "
        f"first ({len(wrong)} differ; {sum(map(len, want))} tokens in "
        f"{time.time() - start:.1f} s)")
    texts = tokenizer.batch_decode([[bos] + w for w in want], skip_special_tokens=True)
    kept = tokenizer.batch_decode(want, skip_special_tokens=False)
    wrong = [k for k in range(len(texts)) if texts[k] != spm_text[k] or kept[k] != spm_text[k]]
    for k in wrong[:3]:
        print(f"  line {k + 1}: SentencePiece {spm_text[k]!r}, transformers {texts[k]!r}",
              file=sys.stderr)
    say(not wrong, f"{outdir} decodes them to SentencePiece's text ({len(wrong)} differ)")
    batch = tokenizer(lines[:3], padding=True)
    longest = max(len(w) for w in want[:3]) + 1
    rows_ok = all(row[longest - len(w) - 1:] == [bos] + w
                  and set(row[:longest - len(w) - 1]) <= {pad}
                  and mask == [0] * (longest - len(w) - 1) + [1] * (len(w) + 1)
                  for row, mask, w in zip(batch["input_ids"], batch["attention_mask"], want))
    say(rows_ok and set(batch) == {"input_ids", "attention_mask"},
        f"{outdir} pads a batch on the left with pad id {pad}, input_ids and attention_mask only")
sys.exit(1 if failures else 0)
PY
[[ $rc -eq 0 ]] || fail "transformers' tokenizer differs from mpiformer's (exit $rc)"
exit_on_failures
