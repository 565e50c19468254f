#!/usr/bin/env bash
# analysis/import_hf.py: a Hugging Face GPT-2 directory becomes an mpiformer
# lm checkpoint that eval, generate and train --resume take.
#   - mpiformer -> export_hf.py -> import_hf.py gives back every tensor of
#     the trained checkpoint bit for bit and its tokenizer byte for byte, at
#     step 0 with AdamW moments of zero, every dataset chunked and
#     checksummed; eval and generate print what they print for the original.
#   - What does not map (another model type or activation, scaled or
#     cross-attention variants, another epsilon, tensors that disagree with
#     config.json, float16 or non-finite tensors, extra tensors, a GPT-2
#     byte-level BPE, a tokenizer of another vocabulary or special ids) is
#     refused with one line, exit 2, and nothing written.
#   - transformers -> import_hf.py: two GPT2LMHeadModels made in
#     transformers (random weights, fixed seed; tied with gelu_new, untied
#     with relu and the default n_inner), saved with safetensors beside the
#     shards' tokenizer: `eval` on the test split gives transformers' loss
#     on the same sequences, tests/dump_step --logits transformers' logits,
#     to 1e-4 relative; greedy `generate` gives transformers' generate()
#     text; `train --resume` with the flags the importer prints fine-tunes
#     2 steps into a new run, whose export transformers loads with the
#     logits of the fine-tuned checkpoint; import -> export gives the
#     original model's logits back.
#
# transformers runs on the Python of .deps/torch-venv, or
# MPIFORMER_HF_PYTHON; without it that last part is skipped (exit 77).
source "$(dirname "$0")/common.sh"
bin=$1 work=$2
src=$(cd "$(dirname "$0")/../.." && pwd)
dump_step=$(dirname "$bin")/tests/dump_step
rm -rf "$work" && mkdir -p "$work" && cd "$work"
failures=0 out=$work/out.txt err=$work/err.txt
touch "$out" "$err"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HOME=$work/hf-home
hf_python=${MPIFORMER_HF_PYTHON:-$src/.deps/torch-venv/bin/python}
import_hf() { python3 "$src/analysis/import_hf.py" "$@"; }

grep -v '^[[:space:]]*$' /usr/share/common-licenses/GPL-3 >text.txt
"$bin" prepare --kind lm --input text.txt --out shards --shards 2 --vocab-size 300 \
  --valid-lines 50 --test-lines 50 >prepare.log

# ---- mpiformer -> export -> import: the same checkpoint
"$bin" train --model lm --data shards --out run --output-bias false --layers 2 --d-model 32 \
  --heads 4 --d-ff 64 --max-len 64 --max-tokens 512 --steps 30 --lr 3e-3 --warmup 10 \
  --dropout 0 --log-every 30 --eval-batches 2 --threads 1 >train.log
trained=run/checkpoints/step_00000030.h5
python3 "$src/analysis/export_hf.py" $trained run-hf >/dev/null
rc=0
import_hf run-hf back.h5 >"$out" 2>"$err" || rc=$?
check "import of an export (exit $rc: $(cat "$err"))" test "$rc" -eq 0
check "the importer names the flags to fine-tune with" \
  grep -qF -- "--resume back.h5 --data SHARDS --out RUNDIR --model lm --layers 2" "$out"
check "import -> export -> import gives the trained checkpoint back" \
  python3 - $trained back.h5 <<'PY'
import sys

import h5py
import numpy as np

with h5py.File(sys.argv[1], "r") as a, h5py.File(sys.argv[2], "r") as b:
    assert sorted(a["params"]) == sorted(b["params"]), "other tensors"
    for name in a["params"]:
        assert np.array_equal(a["params"][name][()], b["params"][name][()]), name
        for group in ("params", "optimizer/m", "optimizer/v"):
            d = b[group][name]
            assert d.dtype == np.float32 and d.fletcher32 and d.chunks, f"{group}/{name}"
            if group != "params":
                assert not np.any(d[()]), f"{group}/{name} is not zero"
    assert bytes(a["tokenizer"][()]) == bytes(b["tokenizer"][()]), "another tokenizer"
    assert b["tokenizer"].fletcher32
    for name in ("step", "optimizer_steps", "data_next_batch", "data_epoch"):
        assert b.attrs[name] == 0, name
    for name in ("vocab_size", "pad_id", "bos_id", "eos_id", "unk_id", "mask_id", "sep_id"):
        assert b.attrs[name] == a.attrs[name], name
PY
for ckpt in $trained back.h5; do
  "$bin" eval --checkpoint $ckpt --data shards --split test --threads 1 2>/dev/null |
    grep '^eval |' >"eval-$(basename $ckpt).txt"
  "$bin" generate --checkpoint $ckpt --prompt "This License" --max-new-tokens 20 --threads 1 \
    >"generate-$(basename $ckpt).txt" 2>/dev/null
done
check "eval of the import prints the original's figures: $(cat eval-back.h5.txt)" \
  cmp -s eval-back.h5.txt eval-step_00000030.h5.txt
check "generate of the import prints the original's text: $(cat generate-back.h5.txt)" \
  cmp -s generate-back.h5.txt generate-step_00000030.h5.txt
[[ -s generate-back.h5.txt && -s eval-back.h5.txt ]] || fail "eval or generate printed nothing"

# ---- what does not map: refused, nothing written
# refuse NAME NEEDLE PYTHON: imports a copy of run-hf that PYTHON changed
# (`d` is its directory, `config` its config.json, saved after it runs).
refuse() {
  local name=$1 needle=$2
  rm -rf "$name" && cp -r run-hf "$name"
  python3 - "$name" "$3" <<'PY'
import json
import os
import shutil
import struct
import sys

import numpy as np

d = sys.argv[1]
sys.path.insert(0, os.environ["ANALYSIS"])
from export_hf import safetensors_bytes  # noqa: E402


def tensors():
    data = open(f"{d}/model.safetensors", "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    return {k: np.frombuffer(data[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]],
                             dtype="<f4").reshape(v["shape"]).copy()
            for k, v in header.items() if k != "__metadata__"}


def save(t):
    open(f"{d}/model.safetensors", "wb").write(safetensors_bytes(t))


config = json.load(open(f"{d}/config.json"))
exec(sys.argv[2])
json.dump(config, open(f"{d}/config.json", "w"))
PY
  rc=0
  import_hf "$name" "$name.h5" >"$out" 2>"$err" || rc=$?
  if expect_one_line_error "$name" 2 "$needle"; then
    if [[ -e $name.h5 ]] || compgen -G ".$name.h5.*" >/dev/null; then
      fail "$name: refused, but something was written"
    else
      echo "PASS: $name refused: $(cat "$err")"
    fi
  fi
}
export ANALYSIS=$src/analysis
refuse neo "a model of type 'gpt_neo'" "config['model_type'] = 'gpt_neo'"
refuse erf-gelu "activation 'gelu'" "config['activation_function'] = 'gelu'"
refuse layer-scaled "scale_attn_by_inverse_layer_idx" \
  "config['scale_attn_by_inverse_layer_idx'] = True"
refuse unscaled "scale_attn_weights false" "config['scale_attn_weights'] = False"
refuse cross "cross-attention" "config['add_cross_attention'] = True"
refuse epsilon "layer_norm_epsilon 1e-06" "config['layer_norm_epsilon'] = 1e-6"
refuse n-inner "tensor transformer.h.0.mlp.c_fc.weight has shape (32, 64)" "config['n_inner'] = 48"
refuse vocab "tensor transformer.wte.weight has shape (300, 32)" "config['vocab_size'] = 301"
refuse eos-id "eos_token_id 50256 is not the tokenizer's eos id 2" \
  "config['eos_token_id'] = 50256"
refuse missing "has no tensor transformer.h.1.ln_2.bias" \
  "t = tensors(); del t['transformer.h.1.ln_2.bias']; save(t)"
refuse extra "holds tensor score.weight" \
  "t = tensors(); t['score.weight'] = np.zeros((2, 32), np.float32); save(t)"
refuse nan "tensor transformer.h.0.attn.c_attn.bias holds non-finite values" \
  "t = tensors(); t['transformer.h.0.attn.c_attn.bias'][3] = np.nan; save(t)"
refuse float16 "tensor transformer.wpe.weight is F16" "
data = bytearray(open(f'{d}/model.safetensors', 'rb').read())
n = struct.unpack('<Q', data[:8])[0]
head = json.loads(data[8:8 + n])
head['transformer.wpe.weight']['dtype'] = 'F16'
text = json.dumps(head, separators=(',', ':')).encode()
text += b' ' * (n - len(text))
data[8:8 + n] = text
open(f'{d}/model.safetensors', 'wb').write(data)"
refuse pickle "no model.safetensors" \
  "os.rename(f'{d}/model.safetensors', f'{d}/pytorch_model.bin')"
refuse byte-level-bpe "a byte-level BPE tokenizer (vocab.json, merges.txt)" "
for n in os.listdir(d):
    if n.startswith(('tokenizer', 'special')): os.remove(f'{d}/{n}')
open(f'{d}/vocab.json', 'w').write('{}'); open(f'{d}/merges.txt', 'w').write('')"
refuse json-only "tokenizer.json but no tokenizer.model" "os.remove(f'{d}/tokenizer.model')"
"$bin" prepare --kind lm --input text.txt --out shards-200 --shards 1 --vocab-size 200 \
  --valid-lines 5 >/dev/null
refuse other-vocab "it has 200 pieces, the model a vocabulary of 300" \
  "shutil.copy('shards-200/tokenizer.model', f'{d}/tokenizer.model')"
refuse special-ids "id 4 is not its mask [MASK]" "
data = open(f'{d}/tokenizer.model', 'rb').read()
data = data.replace(b'[MASK]', b'[MOSK]', 1)
open(f'{d}/tokenizer.model', 'wb').write(data)"
rc=0
import_hf nowhere x.h5 >"$out" 2>"$err" || rc=$?
expect_one_line_error "a missing HF_DIR" 2 "nowhere: no such directory" &&
  echo "PASS: a missing HF_DIR is refused: $(cat "$err")"
rc=0
import_hf run-hf back.h5 >"$out" 2>"$err" || rc=$?
expect_one_line_error "an existing OUT" 2 "back.h5: exists; pass --overwrite" &&
  echo "PASS: an existing OUT is kept without --overwrite"
rc=0
import_hf run-hf back.h5 --overwrite >"$out" 2>"$err" || rc=$?
check "--overwrite replaces OUT (exit $rc)" test "$rc" -eq 0

# ---- transformers -> import -> eval, generate, train --resume -> export -> transformers
if [[ ! -x $hf_python ]] || ! "$hf_python" -c "import torch, transformers" 2>/dev/null; then
  exit_on_failures
  echo "SKIP: no transformers on $hf_python: no model was made in transformers"
  exit 77
fi
rc=0
"$hf_python" - shards run-hf <<'PY' || rc=$?
import shutil
import sys
import warnings

import torch
from transformers import GPT2Config, GPT2LMHeadModel
from transformers.utils import logging

warnings.simplefilter("ignore")
logging.set_verbosity_error()
shards, tokenizer_dir = sys.argv[1:]
for name, options in (("tied", dict(activation_function="gelu_new", n_inner=64)),
                      ("untied", dict(activation_function="relu", tie_word_embeddings=False))):
    torch.manual_seed(7)
    config = GPT2Config(vocab_size=300, n_positions=256, n_embd=32, n_layer=2, n_head=4,
                        bos_token_id=1, eos_token_id=2, pad_token_id=0, **options)
    model = GPT2LMHeadModel(config)
    # Every tensor away from its initial value (biases 0, gains 1), so one
    # mapped to the wrong place shows.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(name, safe_serialization=True)
    # The shards' tokenizer, and the exported one of the same shards.
    for file in ("tokenizer.model", "tokenizer.json", "tokenizer_config.json",
                 "special_tokens_map.json"):
        shutil.copy(f"{tokenizer_dir}/{file}", name)
PY
[[ $rc -eq 0 ]] || { fail "transformers could not make the models (exit $rc)"; exit_on_failures; }
for model in tied untied; do
  import_hf $model $model.h5 >import-$model.log
  flags=$(sed -n 's/.*--out RUNDIR //p' import-$model.log)
  "$bin" eval --checkpoint $model.h5 --data shards --split test --threads 1 2>/dev/null |
    grep '^eval |' >eval-$model.txt
  "$dump_step" $model.h5 $model-logits.h5 --logits >/dev/null
  "$bin" generate --checkpoint $model.h5 --prompt "This License" --max-new-tokens 20 \
    --threads 1 >generate-$model.txt 2>/dev/null
  # shellcheck disable=SC2086 # the flags the importer printed, one word each
  "$bin" train --resume $model.h5 --out ft-$model --data shards --steps 2 --max-tokens 512 \
    --lr 3e-3 --warmup 1 --threads 1 --log-every 1 $flags >train-ft-$model.log
  "$dump_step" ft-$model/checkpoints/step_00000002.h5 ft-$model-logits.h5 --logits >/dev/null
  python3 "$src/analysis/export_hf.py" ft-$model/checkpoints/step_00000002.h5 ft-$model-hf \
    >/dev/null
  python3 "$src/analysis/export_hf.py" $model.h5 rt-$model-hf >/dev/null
done
rc=0
"$hf_python" - shards <<'PY' || rc=$?
import math
import re
import sys
import warnings

import h5py
import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging

warnings.simplefilter("ignore")
logging.set_verbosity_error()
TOLERANCE = 1e-4
shards = sys.argv[1]
failures = 0


def say(ok, message):
    global failures
    failures += not ok
    print(f"{'PASS' if ok else 'FAIL'}: {message}", file=sys.stdout if ok else sys.stderr)


def load(outdir):
    model, info = AutoModelForCausalLM.from_pretrained(outdir, output_loading_info=True)
    loading = {k: v for k, v in info.items() if v}
    say(not loading, f"{outdir} loads in transformers"
        + (f"; loading reports {loading}" if loading else ""))
    return model.eval().double()


def relative(ours, theirs):
    return float(np.abs(ours - theirs).max() / np.abs(theirs).max())


def logits_difference(model, dump):
    """max |a - b| / max |b| over the positions of dump_step's batch."""
    with h5py.File(dump, "r") as f:
        tokens, offsets = np.asarray(f["batch"]["tokens"]), np.asarray(f["batch"]["offsets"])
        ours = np.asarray(f["logits"], dtype=np.float64)
    worst = 0.0
    with torch.no_grad():
        for b in range(len(offsets) - 1):
            ids = torch.tensor(tokens[offsets[b]:offsets[b + 1]], dtype=torch.long)[None]
            theirs = model(ids).logits[0].numpy()
            worst = max(worst, relative(ours[offsets[b]:offsets[b + 1]], theirs))
    return worst


with h5py.File(f"{shards}/test-00000.h5", "r") as f:
    bos, eos = int(f.attrs["bos_id"]), int(f.attrs["eos_id"])
    tokens, offsets = np.asarray(f["tokens"]), np.asarray(f["offsets"])
test = [tokens[offsets[i]:offsets[i + 1]].tolist() for i in range(len(offsets) - 1)]

for name in ("tied", "untied"):
    model = load(name)
    # eval's loss: -log p of each sequence's tokens and EOS after BOS, over all
    # of them (the test split fits max-len: nothing truncated)
    total, count = 0.0, 0
    with torch.no_grad():
        for seq in test:
            assert len(seq) + 1 <= model.config.n_positions
            logits = model(torch.tensor([[bos] + seq])).logits[0]
            targets = torch.tensor(seq + [eos])
            total += float(torch.nn.functional.cross_entropy(logits, targets, reduction="sum"))
            count += len(targets)
    line = open(f"eval-{name}.txt").read()
    nll = float(re.search(r"\| nll ([0-9.]+) ", line).group(1))
    ppl = float(re.search(r"\| ppl ([0-9.]+) ", line).group(1))
    theirs = total / count
    say(abs(nll - theirs) <= TOLERANCE * theirs and abs(ppl - math.exp(theirs))
        <= TOLERANCE * math.exp(theirs) and f"| {count} tokens" in line,
        f"{name}: eval of the import on the test split gives nll {nll}, ppl {ppl}; "
        f"transformers {theirs:.6f}, {math.exp(theirs):.3f} over {count} tokens")
    worst = logits_difference(model, f"{name}-logits.h5")
    say(worst <= TOLERANCE, f"{name}: the import's logits (dump_step) are transformers' to "
        f"{worst:.2e} relative (tolerance {TOLERANCE:g})")

    tokenizer = AutoTokenizer.from_pretrained(name)
    inputs = tokenizer("This License", return_tensors="pt")
    with torch.no_grad():
        # save_pretrained's generation config has no suppress_tokens: the
        # ids mpiformer's decoder never emits are given here
        output = model.float().generate(**inputs, max_new_tokens=20, suppress_tokens=[0, 1, 4, 5])
    text = tokenizer.decode(output[0, inputs.input_ids.shape[1]:], skip_special_tokens=True)
    ours = open(f"generate-{name}.txt").read().rstrip("\n")
    say(text == ours and text, f"{name}: generate of the import prints transformers' greedy "
        f"text: {ours!r}")
    model.double()

    # fine-tuned 2 steps with train --resume, exported: transformers gives
    # the fine-tuned checkpoint's logits, which are not the original's
    tuned = load(f"ft-{name}-hf")
    worst = logits_difference(tuned, f"ft-{name}-logits.h5")
    moved = logits_difference(model, f"ft-{name}-logits.h5")
    say(worst <= TOLERANCE and moved > 100 * TOLERANCE,
        f"{name}: the fine-tuned run's export gives its logits to {worst:.2e} relative; "
        f"the imported model's differ by {moved:.2e}")
    # and import -> export gives the model transformers made
    back = load(f"rt-{name}-hf")
    worst = 0.0
    with torch.no_grad():
        for seq in test[:10]:
            ids = torch.tensor([[bos] + seq])
            worst = max(worst, relative(back(ids).logits[0].numpy(),
                                        model(ids).logits[0].numpy()))
    say(worst <= TOLERANCE, f"{name}: transformers -> import -> export -> transformers "
        f"gives the same logits ({worst:.2e} relative)")
sys.exit(1 if failures else 0)
PY
[[ $rc -eq 0 ]] || fail "an imported model differs from transformers' (exit $rc)"
for model in tied untied; do
  grep -q "resumed from $model.h5: step 0" train-ft-$model.log ||
    fail "train --resume $model.h5 did not resume it: $(head -c 500 train-ft-$model.log)"
done
exit_on_failures
