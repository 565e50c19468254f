#!/usr/bin/env bash
# analysis/export_hf.py: an lm trained with --output-bias false, exported as
# a Hugging Face GPT-2 directory, loads in transformers (GPT2LMHeadModel,
# no missing or unexpected tensor) and gives the logits that mpiformer's
# C++ forward pass gives (tests/dump_step --logits) at every position of a
# few ragged sequences, to 1e-4 relative (max |a - b| / max |b|), in
# float32 and float64, one sequence at a time and as one right-padded
# batch. Two models: tied embeddings with GELU, trained on shards (its
# tokenizer.model is the shards' SentencePiece model), and untied
# embeddings with ReLU on a synthetic task (no tokenizer.model). Swapping
# two heads' query columns is caught. transformers' greedy generate(), told
# mpiformer's decoding rules by the export's generation_config.json, gives
# the tokens of `mpiformer generate`. (tests/e2e/hf_tokenizer.sh checks the
# tokenizer files, readme_hf.sh the example of docs/ANALYSIS.md.) What GPT-2 cannot express is refused
# with one line naming the flag, exit 2, and nothing written. OUTDIR is
# written whole or not at all, and an earlier export is replaced only with
# --overwrite.
#
# transformers runs on the Python of .deps/torch-venv (a venv over the
# system's, whose PyTorch scripts/setup installs), or MPIFORMER_HF_PYTHON;
# without transformers the comparison is skipped (exit 77) after the
# checks that need only the exporter (python3 with h5py and numpy).
source "$(dirname "$0")/common.sh"
bin=$1 work=$2
src=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$work" && mkdir -p "$work" && cd "$work"
failures=0 out=$work/out.txt err=$work/err.txt
touch "$out" "$err"
dump_step=$(dirname "$bin")/tests/dump_step
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HOME=$work/hf-home
hf_python=${MPIFORMER_HF_PYTHON:-$src/.deps/torch-venv/bin/python}

# A small English text every Debian system carries.
grep -v '^[[:space:]]*$' /usr/share/common-licenses/GPL-3 >text.txt
"$bin" prepare --kind lm --input text.txt --out shards --shards 2 --vocab-size 300 \
  --valid-lines 50 >prepare.log
# Steps enough at a high rate that no tensor is near its initial value.
"$bin" train --model lm --data shards --out tied --output-bias false --layers 2 --d-model 32 \
  --heads 4 --d-ff 64 --max-len 64 --max-tokens 512 --steps 60 --lr 3e-3 --warmup 10 \
  --dropout 0 --log-every 20 --eval-batches 2 --threads 1 >train-tied.log
"$bin" train --model lm --synthetic copy --out untied --output-bias false \
  --tied-embeddings false --activation relu --layers 2 --d-model 32 --heads 2 --d-ff 48 \
  --max-len 32 --max-tokens 256 --steps 60 --lr 3e-3 --warmup 10 --dropout 0 --log-every 20 \
  --threads 1 >train-untied.log
# Every tensor has left its initial value (biases and betas start at 0,
# gammas at 1), so a tensor mapped to the wrong place shows in the logits.
check "training moved every tensor away from its initial value" python3 - \
  tied/checkpoints/step_00000060.h5 untied/checkpoints/step_00000060.h5 <<'PY'
import sys

import h5py
import numpy as np

still = []
for path in sys.argv[1:]:
    with h5py.File(path, "r") as f:
        for name, t in f["params"].items():
            start = 1.0 if name.endswith(".gamma") else 0.0
            if np.abs(np.asarray(t) - start).max() < 1e-2:
                still.append(f"{path}: {name}")
for name in still:
    print(f"  still at its initial value: {name}", file=sys.stderr)
sys.exit(1 if still else 0)
PY
for model in tied untied; do
  "$dump_step" $model/checkpoints/step_00000060.h5 $model-logits.h5 --logits
  python3 "$src/analysis/export_hf.py" $model/checkpoints/step_00000060.h5 $model-hf
done
if cmp -s tied-hf/tokenizer.model shards/tokenizer.model; then
  echo "PASS: tokenizer.model holds the shards' SentencePiece model"
else
  fail "tied-hf/tokenizer.model differs from shards/tokenizer.model"
fi
if [[ -e untied-hf/tokenizer.model ]]; then
  fail "a synthetic task's export has a tokenizer.model"
fi

# ---- what GPT-2 cannot express: one line naming the flag, exit 2
tiny=(train --layers 1 --d-model 16 --heads 2 --d-ff 32 --max-len 16
  --max-tokens 64 --steps 1 --log-every 1 --threads 1)
refuse() { # refuse NAME NEEDLE TRAIN-FLAGS...: trains NAME, expects the export refused
  local name=$1 needle=$2
  shift 2
  "$bin" "${tiny[@]}" --out "$name" "$@" >"train-$name.log"
  rc=0
  python3 "$src/analysis/export_hf.py" "$name/checkpoints/step_00000001.h5" "$name-hf" \
    >"$out" 2>"$err" || rc=$?
  if expect_one_line_error "$name" 2 "$needle" "$name/checkpoints/step_00000001.h5"; then
    if [[ -e $name-hf ]]; then
      fail "$name: refused, but $name-hf was created"
    else
      echo "PASS: $name refused: $(cat "$err")"
    fi
  fi
}
refuse bias "--output-bias false" --model lm --synthetic copy
refuse post "--norm pre" --model lm --synthetic copy --output-bias false --norm post
refuse sinusoidal "--positions learned" --model lm --synthetic copy --output-bias false \
  --positions sinusoidal
refuse loglength "--attention-scale standard" --model lm --synthetic copy --output-bias false \
  --attention-scale log-length
refuse seq2seq "--model lm" --model seq2seq --synthetic reverse --output-bias false
refuse mlm "--model lm" --model mlm --synthetic copy --output-bias false
rc=0
python3 "$src/analysis/export_hf.py" text.txt text-hf >"$out" 2>"$err" || rc=$?
expect_one_line_error "a file that is not a checkpoint" 2 "text.txt: not a readable HDF5 file" &&
  echo "PASS: a file that is not a checkpoint is refused"

# ---- OUTDIR: written whole, in a temporary directory renamed into place; an
# earlier export is replaced only with --overwrite
ckpt=tied/checkpoints/step_00000060.h5
export_to() { # export_to ARGS...: runs the exporter on $ckpt, exit code in $rc
  rc=0
  python3 "$src/analysis/export_hf.py" "$ckpt" "$@" >"$out" 2>"$err" || rc=$?
}
before=$(cksum tied-hf/*)
export_to tied-hf
expect_one_line_error "an OUTDIR holding an export" 2 "tied-hf: is not empty" "--overwrite"
[[ $(cksum tied-hf/*) == "$before" ]] || fail "a refused export changed tied-hf"
echo "an earlier file" >tied-hf/stale.txt
export_to tied-hf --overwrite
check "--overwrite replaces an export (exit $rc: $(head -c 300 "$err"))" test "$rc" -eq 0
holds_only tied-hf config.json generation_config.json model.safetensors tokenizer.model \
  tokenizer.json tokenizer_config.json special_tokens_map.json
[[ $(cksum tied-hf/*) == "$before" ]] || fail "the export again differs from the first"
mkdir empty-hf
export_to empty-hf
check "an empty OUTDIR takes an export (exit $rc)" test "$rc" -eq 0
echo "not a directory" >file-hf
export_to file-hf
expect_one_line_error "OUTDIR a file" 2 "export_hf.py: file-hf: exists and is not a directory"
export_to /proc/nope/hf
expect_one_line_error "OUTDIR that cannot be made" 2 "export_hf.py: /proc/nope/hf: cannot create"
leftovers=$(find . -maxdepth 1 -name '.*-hf.*')
[[ -z $leftovers ]] || fail "temporary directories left: $leftovers"

# ---- transformers gives our logits
if [[ ! -x $hf_python ]] || ! "$hf_python" -c "import h5py, numpy, torch, transformers" 2>/dev/null
then
  exit_on_failures
  echo "SKIP: no transformers on $hf_python: the exported models were not loaded"
  exit 77
fi
rc=0
"$hf_python" - tied-logits.h5 tied-hf untied-logits.h5 untied-hf <<'PY' || rc=$?
import sys
import warnings

import h5py
import numpy as np
import torch
from transformers import GPT2LMHeadModel
from transformers.utils import logging

warnings.simplefilter("ignore")
logging.set_verbosity_error()
TOLERANCE = 1e-4


def relative(ours, theirs):
    return float(np.abs(ours - theirs).max() / np.abs(theirs).max())


def worst_difference(model, tokens, offsets, ours, dtype):
    """max |a-b| / max |b| over every position, running each sequence alone
    and all of them as one right-padded batch with an attention mask."""
    model = model.to(dtype)
    lengths = np.diff(offsets)
    worst = 0.0
    with torch.no_grad():
        padded = torch.zeros(len(lengths), lengths.max(), dtype=torch.long)
        mask = torch.zeros_like(padded)
        for b, n in enumerate(lengths):
            ids = torch.tensor(tokens[offsets[b]:offsets[b + 1]], dtype=torch.long)
            padded[b, :n], mask[b, :n] = ids, 1
            alone = model(ids[None]).logits[0].double().numpy()
            worst = max(worst, relative(ours[offsets[b]:offsets[b + 1]], alone))
        batched = model(padded, attention_mask=mask).logits.double().numpy()
        for b, n in enumerate(lengths):
            worst = max(worst, relative(ours[offsets[b]:offsets[b + 1]], batched[b, :n]))
    return worst


failures = 0
for dump, outdir in zip(sys.argv[1::2], sys.argv[2::2]):
    with h5py.File(dump, "r") as f:
        tokens = np.asarray(f["batch"]["tokens"])
        offsets = np.asarray(f["batch"]["offsets"])
        ours = np.asarray(f["logits"], dtype=np.float64)
    model, info = GPT2LMHeadModel.from_pretrained(outdir, output_loading_info=True)
    model.eval()
    loading = {k: v for k, v in info.items() if v}
    if loading:
        print(f"FAIL: {outdir}: loading reports {loading}", file=sys.stderr)
        failures += 1
    lengths = ", ".join(str(n) for n in np.diff(offsets))
    for dtype in (torch.float32, torch.float64):
        worst = worst_difference(model, tokens, offsets, ours, dtype)
        verdict = "PASS" if worst <= TOLERANCE else "FAIL"
        failures += verdict == "FAIL"
        print(f"{verdict}: {outdir} in transformers ({str(dtype)[6:]}) gives mpiformer's logits "
              f"on sequences of {lengths} tokens: max relative difference {worst:.2e} "
              f"(tolerance {TOLERANCE:g})", file=sys.stdout if verdict == "PASS" else sys.stderr)
    # The comparison sees the head order: swap the query columns of heads 0
    # and 1 in the first layer and the logits move far beyond the tolerance.
    attn = model.transformer.h[0].attn
    D = model.config.n_embd // model.config.n_head
    with torch.no_grad():
        w = attn.c_attn.weight
        w[:, :2 * D] = torch.cat([w[:, D:2 * D], w[:, :D]], dim=1)
    swapped = worst_difference(model, tokens, offsets, ours, torch.float64)
    if swapped > 100 * TOLERANCE:
        print(f"PASS: {outdir} with two heads swapped differs by {swapped:.2e}")
    else:
        print(f"FAIL: {outdir} with two heads swapped differs by only {swapped:.2e}",
              file=sys.stderr)
        failures += 1
sys.exit(1 if failures else 0)
PY
[[ $rc -eq 0 ]] || fail "transformers does not give mpiformer's logits (exit $rc)"

# Greedy decoding: transformers' generate() continues 5 prompts for up to
# 64 new tokens to the tokens `generate` gives (ids of a synthetic task,
# which carry no BOS: the exported model sees the prompt alone). Our
# decoder never emits pad, BOS, [MASK] or [SEP] and stops at EOS; the
# export's generation_config.json tells transformers the same. A second
# model, made to favour one of those ids at every step (its final norm
# gives that id's embedding whatever the input), shows the rule at work:
# both decoders choose the same other token, and transformers told nothing
# of it (suppress_tokens=[]) chooses the forbidden id.
"$bin" train --model lm --synthetic copy --out long --output-bias false --layers 2 --d-model 32 \
  --heads 4 --d-ff 64 --vocab 40 --max-len 96 --max-tokens 1024 --steps 400 --lr 3e-3 \
  --warmup 10 --dropout 0 --log-every 100 --threads 1 >train-long.log
cp long/checkpoints/step_00000400.h5 favours.h5
python3 - favours.h5 <<'PY'
import sys

import h5py
import numpy as np

from mpiformer_checksum import seal

with h5py.File(sys.argv[1], "r+") as f:
    p = f["params"]
    table = np.asarray(p["embed.tokens"], dtype=np.float64)
    # An id that scores highest against its own embedding among pad, BOS,
    # [MASK] and [SEP]: a constant final hidden state of its embedding
    # makes every step's logits favour it.
    for token in (5, 4, 1, 0):
        if np.argmax(table @ table[token]) == token:
            break
    else:
        sys.exit("no forbidden id scores highest against its own embedding")
    p["decoder.norm.gamma"][...] = 0
    p["decoder.norm.beta"][...] = 4 * table[token] / np.linalg.norm(table[token])
    for name in ("decoder.norm.gamma", "decoder.norm.beta"):
        seal(p[name])
PY
for model in long favours; do
  ckpt=long/checkpoints/step_00000400.h5
  [[ $model == long ]] || ckpt=favours.h5
  python3 "$src/analysis/export_hf.py" $ckpt $model-hf >/dev/null
  # The copy task's lm reads x SEP (5) and continues with x and EOS.
  printf '%s 5\n' "6 7 8" "20 21 22 23 24 25 26 27" "9" "30 12 30 12 30 12 30 12 30 12 30 12" \
    "39 38 37 36 35 34 33 32 31 30 29 28 27 26 25 24 23 22 21 20 19 18 17 16 15 14 13" \
    >prompts.txt
  "$bin" generate --checkpoint $ckpt --input prompts.txt --max-new-tokens 64 --threads 1 \
    --output ours-$model.txt 2>/dev/null
done
rc=0
"$hf_python" - prompts.txt long-hf ours-long.txt favours-hf ours-favours.txt <<'PY' || rc=$?
import sys
import warnings

import torch
from transformers import GenerationConfig, GPT2LMHeadModel
from transformers.utils import logging

warnings.simplefilter("ignore")
logging.set_verbosity_error()
EOS, NEVER = 2, [0, 1, 4, 5]  # generate's stop and the ids it never emits
prompts = [[int(w) for w in line.split()] for line in open(sys.argv[1])]
failures = 0


def say(ok, message):
    global failures
    failures += not ok
    print(f"{'PASS' if ok else 'FAIL'}: {message}", file=sys.stdout if ok else sys.stderr)


def decode(model, **options):
    """generate()'s new tokens for each prompt, EOS dropped."""
    outputs = []
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            new = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=64,
                                 **options)[0, len(prompt):].tolist()
            outputs.append(new[:new.index(EOS)] if EOS in new else new)
    return outputs


for outdir, ours_file in zip(sys.argv[2::2], sys.argv[3::2]):
    model = GPT2LMHeadModel.from_pretrained(outdir).eval()
    ours = [[int(w) for w in line.split()] for line in open(ours_file)]
    theirs = decode(model)  # with the export's generation_config.json
    for k, (mine, their) in enumerate(zip(ours, theirs)):
        if their != mine:
            print(f"  prompt {k + 1}: transformers gives {their}, generate {mine}",
                  file=sys.stderr)
    produced = sum(map(len, theirs))
    say(theirs == ours and len(ours) == len(prompts) and produced > 0,
        f"{outdir}: transformers' greedy generate() with the export's generation config "
        f"gives generate's tokens for {len(prompts)} prompts ({produced} new tokens)")
    config = GenerationConfig.from_pretrained(outdir)
    expected = {"do_sample": False, "num_beams": 1, "eos_token_id": EOS, "pad_token_id": 0,
                "bos_token_id": 1, "max_length": model.config.n_positions,
                "suppress_tokens": NEVER}
    differ = {k: getattr(config, k) for k, v in expected.items() if getattr(config, k) != v}
    say(not differ, f"{outdir}/generation_config.json holds {expected}"
        + (f"; differs in {differ}" if differ else ""))
    if outdir.startswith("favours"):
        free = decode(model, suppress_tokens=[])
        forbidden = sorted({t for row in free for t in row if t in NEVER})
        say(forbidden and not any(t in NEVER for row in theirs for t in row),
            f"{outdir}: generate() told nothing of the forbidden ids emits {forbidden}; with "
            "the export's generation config, as mpiformer, none")
sys.exit(1 if failures else 0)
PY
[[ $rc -eq 0 ]] || fail "transformers does not decode to generate's tokens (exit $rc)"

exit_on_failures
