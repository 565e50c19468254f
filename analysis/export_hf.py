#!/usr/bin/env python3
"""Writes an mpiformer lm checkpoint as a Hugging Face GPT-2 model directory.

usage: analysis/export_hf.py CHECKPOINT OUTDIR

OUTDIR (created if needed) receives:
  config.json        GPT2LMHeadModel's configuration (model_type gpt2)
  model.safetensors  the weights in float32, mapped exactly (below)
  tokenizer.model    the SentencePiece model the run was trained with (the
                     checkpoint's /tokenizer bytes; absent for a synthetic
                     task). transformers' GPT-2 tokenizer does not read it:
                     encode with the sentencepiece package and put bos_id
                     first, as training does.

`GPT2LMHeadModel.from_pretrained(OUTDIR)` then gives the logits mpiformer
gives (tests/e2e/export_hf.sh checks it). GPT-2 is a pre-LN decoder with
learned positions, 1/sqrt(d_head) attention, tanh GELU (gelu_new) or ReLU,
and no bias on its output projection; a checkpoint that differs is refused
with one line naming the train flag that makes it fit, exit 2:
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

Runs on h5py and numpy alone; the safetensors file is written by hand.
"""

import json
import os
import struct
import sys

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mpiformer_metrics import read_config  # noqa: E402

CHECKPOINT_FORMAT = "mpiformer-checkpoint"
CHECKPOINT_VERSION = 2  # kCheckpointVersion, src/io/checkpoint.h
LN_EPSILON = 1e-5  # ModelConfig::ln_eps (no flag sets it)
ACTIVATIONS = {"gelu": "gelu_new", "relu": "relu"}  # ours (tanh GELU) -> transformers' name


class ExportError(Exception):
    """A checkpoint that cannot be exported: one line, exit 2."""


def text(value):
    return value.decode() if isinstance(value, bytes) else str(value)


def read_checkpoint(path):
    """(attrs, config, params, tokenizer bytes or None) of a checkpoint."""
    if not os.path.exists(path):
        raise ExportError("no such file")
    if not os.path.isfile(path):
        raise ExportError("not a regular file")
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        raise ExportError(f"not a readable HDF5 file ({e})") from None
    with f:
        attrs = {key: f.attrs[key] for key in f.attrs}
        if text(attrs.get("format", "")) != CHECKPOINT_FORMAT:
            raise ExportError("not an mpiformer checkpoint (its 'format' attribute is not "
                              f"'{CHECKPOINT_FORMAT}')")
        version = int(attrs.get("version", -1))
        if version != CHECKPOINT_VERSION:
            raise ExportError(f"checkpoint version {version}; this exporter reads version "
                              f"{CHECKPOINT_VERSION}")
        if "params" not in f or "config" not in attrs:
            raise ExportError("no /params group or no config attribute")
        try:
            # Reading verifies each chunk's Fletcher32 checksum.
            params = {name: np.asarray(f["params"][name], dtype=np.float32)
                      for name in f["params"]}
            tokenizer = bytes(np.asarray(f["tokenizer"], dtype=np.uint8)) \
                if "tokenizer" in f else None
        except OSError as e:
            raise ExportError(f"truncated or corrupt ({e})") from None
    return attrs, read_config(text(attrs["config"])), params, tokenizer


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

    out = {"transformer.wte.weight": expect(params, "embed.tokens", (vocab, C)),
           "transformer.wpe.weight": expect(params, "embed.positions", (L, C))}
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
                out[f"{theirs}.{hf}.weight"] = expect(params, prefix + ".gamma", (C,))
                out[f"{theirs}.{hf}.bias"] = expect(params, prefix + ".beta", (C,))
            else:
                # ours y = x W^T + b with W (out, in); Conv1D y = x W + b with W (in, out)
                out[f"{theirs}.{hf}.weight"] = expect(params, prefix + ".weight", (n_out, n_in)).T
                out[f"{theirs}.{hf}.bias"] = expect(params, prefix + ".bias", (n_out,))
    out["transformer.ln_f.weight"] = expect(params, "decoder.norm.gamma", (C,))
    out["transformer.ln_f.bias"] = expect(params, "decoder.norm.beta", (C,))
    if not tied:
        out["lm_head.weight"] = expect(params, "output.weight", (vocab, C))
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


def write_file(path, data):
    """Writes `data` to PATH.tmp and renames it: no half-written file."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def export(checkpoint, outdir):
    attrs, cfg, params, tokenizer = read_checkpoint(checkpoint)
    why = refusals(cfg, params)
    if why:
        raise ExportError("cannot be a GPT-2 model: " + "; ".join(why))
    vocab = int(attrs["vocab_size"])
    tensors, dims = gpt2_tensors(cfg, params, vocab)
    os.makedirs(outdir, exist_ok=True)
    config = hf_config(cfg, attrs, dims, vocab)
    write_file(os.path.join(outdir, "config.json"),
               (json.dumps(config, indent=2) + "\n").encode())
    write_file(os.path.join(outdir, "model.safetensors"), safetensors_bytes(tensors))
    tokenizer_path = os.path.join(outdir, "tokenizer.model")
    if tokenizer:
        write_file(tokenizer_path, tokenizer)
    elif os.path.exists(tokenizer_path):
        os.remove(tokenizer_path)  # an earlier export's: not this model's
    count = sum(t.size for t in tensors.values())
    print(f"wrote {outdir}: GPT-2 of {dims['n_layer']} layers, n_embd {dims['n_embd']}, "
          f"{dims['n_head']} heads, n_inner {dims['n_inner']}, vocab {vocab}, "
          f"n_positions {dims['n_positions']}, {config['activation_function']}, "
          f"{'tied' if dims['tied'] else 'untied'} embeddings ({count} parameters, step "
          f"{int(attrs['step'])}); "
          + ("tokenizer.model (SentencePiece)" if tokenizer else
             "no tokenizer (a synthetic task)"))


def main(argv):
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    if len(argv) != 2 or argv[0].startswith("-"):
        print("usage: export_hf.py CHECKPOINT OUTDIR", file=sys.stderr)
        return 2
    checkpoint, outdir = argv
    try:
        export(checkpoint, outdir)
    except ExportError as e:
        print(f"export_hf.py: {checkpoint}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
