#!/usr/bin/env python3
"""Writes an mpiformer lm checkpoint as a Hugging Face GPT-2 model directory.

usage: analysis/export_hf.py CHECKPOINT OUTDIR [--overwrite]

OUTDIR receives:
  config.json            GPT2LMHeadModel's configuration (model_type gpt2)
  model.safetensors      the weights in float32, mapped exactly (below)
  generation_config.json mpiformer generate's rules for model.generate():
                         greedy, at most max-len tokens in all, stop at
                         EOS, never emit pad, BOS, [MASK] or [SEP]
                         (suppress_tokens)
and, for a run on shards (a synthetic task has no tokenizer):
  tokenizer.model        the run's SentencePiece model (the checkpoint's
                         /tokenizer bytes), which analysis/import_hf.py
                         carries back
  tokenizer.json, tokenizer_config.json, special_tokens_map.json
                         the same tokenizer for transformers, converted by
                         analysis/sentencepiece_model.py (its docstring
                         says how, and what it cannot carry):
                         AutoTokenizer.from_pretrained(OUTDIR) loads it
                         with transformers and tokenizers alone, encodes a
                         line to the ids mpiformer's shards hold, with BOS
                         put first as the lm reads it in training and in
                         generate (add_special_tokens=False leaves it out),
                         and decodes ids as SentencePiece does. Its special
                         tokens are bos, eos and pad; it pads on the left,
                         for batched generation.
A tokenizer that does not convert exactly (byte fallback, a word or char
model, ...) is refused with one line naming what, exit 2.

OUTDIR must not exist (its parent directories are created) or be an
empty directory; --overwrite replaces one that holds files (an earlier
export). The files are written into a temporary directory beside OUTDIR,
renamed into place once complete: OUTDIR never holds half an export, and
a refused or failed export leaves it as it was.

`AutoModelForCausalLM.from_pretrained(OUTDIR)` then gives the logits
mpiformer gives, and its greedy generate() mpiformer generate's tokens
(tests/e2e/export_hf.sh checks both; hf_tokenizer.sh the tokenizer). GPT-2 is a pre-LN
decoder with learned positions, 1/sqrt(d_head) attention, tanh GELU
(gelu_new) or ReLU, and no bias on its output projection; a checkpoint
that differs is refused with one line naming the train flag that makes it
fit, exit 2:
  --model lm, --output-bias false, --norm pre, --positions learned,
  --attention-scale standard.

Mapping (per layer i; a Conv1D weight is (in, out), the transpose of ours):
  embed.tokens                           transformer.wte.weight
  embed.positions                        transformer.wpe.weight
  decoder.layers.i.self_attn.norm.*      transformer.h.i.ln_1.{weight,bias}
  decoder.layers.i.self_attn.qkv.weight  transformer.h.i.attn.c_attn.weight (transposed)
  decoder.layers.i.self_attn.qkv.bias    transformer.h.i.attn.c_attn.bias
  decoder.layers.i.self_attn.out.*       transformer.h.i.attn.c_proj.* (weight transposed)
  decoder.layers.i.mlp.norm.*            transformer.h.i.ln_2.{weight,bias}
  decoder.layers.i.mlp.fc.*              transformer.h.i.mlp.c_fc.* (weight transposed)
  decoder.layers.i.mlp.proj.*            transformer.h.i.mlp.c_proj.* (weight transposed)
  decoder.norm.*                         transformer.ln_f.{weight,bias}
  output.weight (untied only)            lm_head.weight
Both fuse q, k and v in that order along the output dimension, and both
give head h the columns [h*D, (h+1)*D) of each, so qkv maps unchanged.
analysis/import_hf.py reads the mapping (name_map) the other way.

Runs on h5py and numpy alone; the safetensors file is written by hand.
"""

import json
import os
import shutil
import struct
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mpiformer_metrics import (CHECKPOINT_FORMAT, RunError, file_format, group_of,  # noqa: E402
                               h5_file, int_attr, numbers, read_config, report_fault)
import sentencepiece_model  # noqa: E402

CHECKPOINT_VERSION = 2  # kCheckpointVersion, src/io/checkpoint.h
# The integer root attributes an export reads.
INT_ATTRS = ("step", "vocab_size", "pad_id", "bos_id", "eos_id", "mask_id", "sep_id")
LN_EPSILON = 1e-5  # ModelConfig::ln_eps (no flag sets it)
ACTIVATIONS = {"gelu": "gelu_new", "relu": "relu"}  # ours (tanh GELU) -> transformers' name
USAGE = "usage: export_hf.py CHECKPOINT OUTDIR [--overwrite]"


class ExportError(Exception):
    """A checkpoint that cannot be exported: one line, exit 2."""


class WriteError(Exception):
    """OUTDIR could not be written (a full disk): one line, exit 1."""


def text(value):
    return value.decode(errors="backslashreplace") if isinstance(value, bytes) else str(value)


def read_checkpoint(path):
    """(attrs, config, params, tokenizer bytes or None) of a checkpoint.
    A file that cannot be read raises RunError (h5_file), one that is no
    exportable checkpoint ExportError."""
    with h5_file(path, "checkpoint") as f:
        format_ = file_format(f)
        if format_ != CHECKPOINT_FORMAT:
            raise ExportError("not an mpiformer checkpoint (its 'format' attribute is "
                              + (f"'{format_}'" if format_ else "missing") + ")")
        version = int_attr(f, "version") if "version" in f.attrs else -1
        if version != CHECKPOINT_VERSION:
            raise ExportError(f"checkpoint version {version}; this exporter reads version "
                              f"{CHECKPOINT_VERSION}")
        if "params" not in f or "config" not in f.attrs:
            raise ExportError("no /params group or no config attribute")
        attrs = {key: int_attr(f, key) for key in INT_ATTRS}
        config = read_config(text(f.attrs["config"]))
        # Reading verifies each chunk's Fletcher32 checksum.
        stored = group_of(f, "params")
        params = {name: numbers(stored[name], (1, 2)).astype(np.float32) for name in stored}
        tokenizer = bytes(numbers(f["tokenizer"]).astype(np.uint8)) if "tokenizer" in f \
            else None
    return attrs, config, params, tokenizer


def refusals(cfg, params):
    """What keeps the checkpoint from being a GPT-2 model, each naming the
    flag that fixes it; the tensors decide where they tell."""
    why = []
    kind = cfg.get("model", "?")
    if kind != "lm":
        # Nothing else is worth saying about an encoder.
        return [f"a model of kind {kind} (--model {kind}); GPT-2 is a decoder-only language "
                "model: export a checkpoint trained with --model lm"]
    if "output.bias" in params:
        why.append("an output bias (output.bias, --output-bias true), which GPT-2's lm_head "
                   "does not have: train with --output-bias false")
    # A config without the key (none is written so) leaves it to the tensors:
    # post-LN stacks have no final norm, sinusoidal positions no table.
    if cfg.get("norm", "pre" if "decoder.norm.gamma" in params else "post") != "pre":
        why.append("post-LN blocks (--norm post); GPT-2 normalises each sublayer's input: "
                   "train with --norm pre")
    if cfg.get("positions", "learned" if "embed.positions" in params else "sinusoidal") \
            != "learned":
        why.append("sinusoidal positions (--positions sinusoidal); GPT-2 learns its "
                   "positions: train with --positions learned")
    if cfg.get("attention-scale", "standard") != "standard":
        why.append(f"log-length attention scaling (--attention-scale {cfg['attention-scale']}); "
                   "GPT-2 scales by 1/sqrt(d_head): train with --attention-scale standard")
    activation = cfg.get("activation", "gelu")
    if activation not in ACTIVATIONS:
        why.append(f"activation {activation}, which GPT-2 has no name for: train with "
                   "--activation gelu or relu")
    return why


def expect(params, name, shape):
    """Takes tensor `name` of `shape` out of params."""
    if name not in params:
        raise ExportError(f"has no tensor {name} of shape {shape}, which its config implies")
    t = params.pop(name)
    if t.shape != tuple(shape):
        raise ExportError(f"tensor {name} has shape {t.shape}, expected {tuple(shape)}")
    if not np.isfinite(t).all():
        raise ExportError(f"tensor {name} holds non-finite values: the run had diverged; "
                          "export an earlier checkpoint")
    return t


def name_map(layers, C, F, L, vocab, tied):
    """(our tensor, GPT-2's, our shape, whether GPT-2's is our transpose)
    for every tensor of an lm of these dimensions: the mapping of the
    docstring, which analysis/import_hf.py reads the other way."""
    yield "embed.tokens", "transformer.wte.weight", (vocab, C), False
    yield "embed.positions", "transformer.wpe.weight", (L, C), False
    for i in range(layers):
        ours, theirs = f"decoder.layers.{i}", f"transformer.h.{i}"
        # (module, ours, theirs, input width, output width); None: a layer norm
        for sub, name, hf, n_in, n_out in (
                ("self_attn", "norm", "ln_1", None, C),
                ("self_attn", "qkv", "attn.c_attn", C, 3 * C),
                ("self_attn", "out", "attn.c_proj", C, C),
                ("mlp", "norm", "ln_2", None, C),
                ("mlp", "fc", "mlp.c_fc", C, F),
                ("mlp", "proj", "mlp.c_proj", F, C)):
            prefix = f"{ours}.{sub}.{name}"
            if n_in is None:
                yield prefix + ".gamma", f"{theirs}.{hf}.weight", (C,), False
                yield prefix + ".beta", f"{theirs}.{hf}.bias", (C,), False
            else:
                # ours y = x W^T + b with W (out, in); Conv1D y = x W + b with W (in, out)
                yield prefix + ".weight", f"{theirs}.{hf}.weight", (n_out, n_in), True
                yield prefix + ".bias", f"{theirs}.{hf}.bias", (n_out,), False
    yield "decoder.norm.gamma", "transformer.ln_f.weight", (C,), False
    yield "decoder.norm.beta", "transformer.ln_f.bias", (C,), False
    if not tied:
        yield "output.weight", "lm_head.weight", (vocab, C), False


def gpt2_tensors(cfg, params, vocab):
    """Our params as GPT2LMHeadModel's state dict, and its dimensions."""
    params = dict(params)
    if "embed.tokens" not in params or "embed.positions" not in params:
        raise ExportError("has no embed.tokens or embed.positions")
    C = params["embed.tokens"].shape[-1]
    L = params["embed.positions"].shape[0]
    try:
        layers, heads = int(cfg["layers"]), int(cfg["heads"])
    except (KeyError, ValueError):
        raise ExportError("its config attribute has no valid 'layers' or 'heads'") from None
    if heads < 1 or C % heads:
        raise ExportError(f"{heads} heads do not divide d-model {C}")
    F = params.get("decoder.layers.0.mlp.fc.weight", np.zeros((0, C))).shape[0]
    tied = "output.weight" not in params
    if tied != (cfg.get("tied-embeddings", "true") == "true"):
        raise ExportError("its config and its tensors disagree on tied embeddings")

    out = {}
    for ours, theirs, shape, transposed in name_map(layers, C, F, L, vocab, tied):
        t = expect(params, ours, shape)
        out[theirs] = t.T if transposed else t
    if params:
        raise ExportError(f"holds tensor {sorted(params)[0]}, which GPT-2 has no place for "
                          f"(--layers {layers} in its config)")
    dims = {"n_embd": C, "n_layer": layers, "n_head": heads, "n_inner": F, "n_positions": L,
            "tied": tied}
    return out, dims


def hf_config(cfg, attrs, dims, vocab):
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": vocab,
        "n_positions": dims["n_positions"],
        "n_embd": dims["n_embd"],
        "n_layer": dims["n_layer"],
        "n_head": dims["n_head"],
        "n_inner": dims["n_inner"],
        "activation_function": ACTIVATIONS[cfg.get("activation", "gelu")],
        "layer_norm_epsilon": LN_EPSILON,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "summary_first_dropout": 0.0,
        "initializer_range": 0.02,
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "tie_word_embeddings": dims["tied"],
        "bos_token_id": int(attrs["bos_id"]),
        "eos_token_id": int(attrs["eos_id"]),
        "pad_token_id": int(attrs["pad_id"]),
        "use_cache": True,
        "torch_dtype": "float32",
    }


def generation_config(attrs, dims):
    """generate()'s defaults as mpiformer generate decodes: greedy, BOS,
    prompt and new tokens within the positions table, stopping at EOS,
    never choosing pad, BOS, [MASK] or [SEP] (decoding.cpp's emittable)."""
    never = sorted({int(attrs[k]) for k in ("pad_id", "bos_id", "mask_id", "sep_id")})
    return {"bos_token_id": int(attrs["bos_id"]), "eos_token_id": int(attrs["eos_id"]),
            "pad_token_id": int(attrs["pad_id"]), "do_sample": False, "num_beams": 1,
            "max_length": dims["n_positions"], "suppress_tokens": never}


def tokenizer_files(model_bytes, attrs, dims, vocab):
    """tokenizer.model (the bytes as they are) and the transformers
    tokenizer converted from them, {name: bytes}; ExportError for a
    tokenizer that does not convert exactly or does not fit the checkpoint."""
    try:
        model = sentencepiece_model.read_model(model_bytes)
    except sentencepiece_model.ModelError as e:
        raise ExportError(f"its /tokenizer is no SentencePiece model ({e})") from None
    why = sentencepiece_model.convertible(model)
    if len(model.pieces) != vocab:
        why.append(f"{len(model.pieces)} pieces for a vocabulary of {vocab}")
    special = {name: int(attrs[f"{name}_id"]) for name in ("bos", "eos", "pad")}
    control = set(model.ids_of(sentencepiece_model.CONTROL))
    for name, i in special.items():
        if i not in control:
            why.append(f"its {name} id {i} is no control piece")
    if why:
        raise ExportError("its SentencePiece tokenizer does not convert exactly into a "
                          "Hugging Face tokenizer: " + "; ".join(why))
    document = sentencepiece_model.tokenizer_json(model, special["bos"])
    names = {f"{name}_token": model.pieces[i][0] for name, i in special.items()}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        # The same added tokens as tokenizer.json's, so loading adds none.
        "added_tokens_decoder": {str(t["id"]): {k: v for k, v in t.items() if k != "id"}
                                 for t in document["added_tokens"]},
        **names,
        # Decoding is SentencePiece's: no clean-up of spaces before punctuation.
        "clean_up_tokenization_spaces": False,
        "model_max_length": dims["n_positions"],
        "padding_side": "left",
        # GPT-2 adds the embedding of a token_type_id to its input: none.
        "model_input_names": ["input_ids", "attention_mask"],
    }
    return {"tokenizer.model": model_bytes,
            "tokenizer.json": json_bytes(document),
            "tokenizer_config.json": json_bytes(config),
            "special_tokens_map.json": json_bytes(names)}


def json_bytes(document):
    return (json.dumps(document, indent=2, ensure_ascii=False) + "\n").encode()


def safetensors_bytes(tensors):
    """The safetensors encoding of `tensors` (name -> float32 array): an
    8-byte little-endian header length, the JSON header (dtype, shape and
    [begin, end) byte offsets into the data, padded with spaces to a
    multiple of 8), then every tensor's bytes, row-major, little-endian."""
    header = {"__metadata__": {"format": "pt"}}  # transformers requires the format
    offset = 0
    names = sorted(tensors)
    for name in names:
        n = tensors[name].size * 4
        header[name] = {"dtype": "F32", "shape": list(tensors[name].shape),
                        "data_offsets": [offset, offset + n]}
        offset += n
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    parts = [struct.pack("<Q", len(head)), head]
    parts += [np.ascontiguousarray(tensors[name], dtype="<f4").tobytes() for name in names]
    return b"".join(parts)


def check_outdir(outdir, overwrite):
    """Refuses an OUTDIR that is not a directory, or one holding files
    without --overwrite (RunError "OUTDIR: ...")."""
    if os.path.lexists(outdir) and not os.path.isdir(outdir):
        raise RunError(f"{outdir}: exists and is not a directory")
    if os.path.isdir(outdir) and os.listdir(outdir) and not overwrite:
        raise RunError(f"{outdir}: is not empty (an earlier export?); pass --overwrite to "
                       "replace it")


def write_outdir(outdir, files):
    """Writes files {name: bytes} into a temporary directory beside OUTDIR
    and renames it into place, replacing what OUTDIR held (check_outdir has
    allowed that). Faults name OUTDIR and leave nothing half-written:
    RunError where it cannot be made, WriteError where writing failed."""
    parent = os.path.dirname(os.path.abspath(outdir))
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as e:
        raise RunError(f"{outdir}: cannot create its directory {parent} "
                       f"({e.strerror or e})") from None
    try:
        tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(os.path.abspath(outdir))}.",
                               suffix=".tmp", dir=parent)
    except OSError as e:
        raise RunError(f"{outdir}: cannot create a directory in {parent} "
                       f"({e.strerror or e})") from None
    old = None
    try:
        os.chmod(tmp, 0o755)  # mkdtemp's 0700 is for secrets, an export is not one
        for name, data in files.items():
            with open(os.path.join(tmp, name), "wb") as f:
                f.write(data)
        if os.path.isdir(outdir):
            # Out of the way first: a directory renames only onto an empty one.
            old = tmp[: -len(".tmp")] + ".old"
            os.rename(outdir, old)
        os.rename(tmp, outdir)
    except OSError as e:
        if old is not None and not os.path.exists(outdir):
            os.rename(old, outdir)
            old = None
        shutil.rmtree(tmp, ignore_errors=True)
        raise WriteError(f"{outdir}: cannot write the export ({e.strerror or e})") from None
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def export(checkpoint, outdir, overwrite=False):
    check_outdir(outdir, overwrite)
    attrs, cfg, params, tokenizer = read_checkpoint(checkpoint)
    why = refusals(cfg, params)
    if why:
        raise ExportError("cannot be a GPT-2 model: " + "; ".join(why))
    vocab = attrs["vocab_size"]
    tensors, dims = gpt2_tensors(cfg, params, vocab)
    config = hf_config(cfg, attrs, dims, vocab)
    files = {"config.json": json_bytes(config),
             "generation_config.json": json_bytes(generation_config(attrs, dims))}
    if tokenizer:
        files.update(tokenizer_files(tokenizer, attrs, dims, vocab))
    files["model.safetensors"] = safetensors_bytes(tensors)
    write_outdir(outdir, files)
    count = sum(t.size for t in tensors.values())
    print(f"wrote {outdir}: GPT-2 of {dims['n_layer']} layers, n_embd {dims['n_embd']}, "
          f"{dims['n_head']} heads, n_inner {dims['n_inner']}, vocab {vocab}, "
          f"n_positions {dims['n_positions']}, {config['activation_function']}, "
          f"{'tied' if dims['tied'] else 'untied'} embeddings ({count} parameters, step "
          f"{attrs['step']}); "
          + ("its SentencePiece tokenizer as tokenizer.model and tokenizer.json" if tokenizer
             else "no tokenizer (a synthetic task)"))


def main(argv):
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        return 0
    overwrite = "--overwrite" in argv
    args = [a for a in argv if a != "--overwrite"]
    if len(args) != 2 or any(a.startswith("-") for a in args):
        print(USAGE, file=sys.stderr)
        return 2
    checkpoint, outdir = args
    try:
        export(checkpoint, outdir, overwrite)
    except ExportError as e:
        return report_fault("export_hf.py", f"{checkpoint}: {e}")
    except RunError as e:  # a checkpoint that cannot be read, an OUTDIR refused
        return report_fault("export_hf.py", e)
    except WriteError as e:
        return report_fault("export_hf.py", e, 1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
