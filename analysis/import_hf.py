#!/usr/bin/env python3
"""Turns a Hugging Face GPT-2 directory into an mpiformer lm checkpoint:
the inverse of analysis/export_hf.py.

usage: analysis/import_hf.py HF_DIR OUT.h5 [--overwrite]

HF_DIR holds
  config.json        model_type gpt2 (GPT2LMHeadModel's save_pretrained)
  model.safetensors  float32 tensors, read by hand (no safetensors package)
  tokenizer.model    the SentencePiece model of mpiformer shards, which
                     becomes the checkpoint's /tokenizer byte for byte: an
                     export_hf.py export carries it; beside a model made
                     for a shard set's vocabulary, copy the set's
                     tokenizer.model. Its ids 0-5 must be mpiformer's
                     reserved ones (pad, <s>, </s>, <unk>, [MASK], [SEP]).
A GPT-2 with its own byte-level BPE (vocab.json, merges.txt) is refused:
mpiformer reads text through SentencePiece alone, and such a model's ids
0-5 are ordinary tokens, which mpiformer's decoder would never emit or
would stop at.

OUT.h5 is a checkpoint of format version 2 (data/CHECKPOINT.md) at step
0: the weights, AdamW moments of zero and no update taken (what a new
run starts from), data cursor 0, seed 1, world size 1, no run id; the
config attribute holds the model's flags. So
  mpiformer eval --checkpoint OUT.h5 --data SHARDS
  mpiformer generate --checkpoint OUT.h5 --prompt TEXT
read it as they read a trained one, and
  mpiformer train --resume OUT.h5 --out NEW_RUN --data SHARDS <the model's flags>
fine-tunes it from step 1 (learning-rate warm-up included) as a run that
started from these weights; the flags are printed. OUT.h5 is written
beside itself under a temporary name and renamed once complete; an
existing file is replaced only with --overwrite.

Refused, one line naming the reason, exit 2, nothing written: another
model_type, an activation other than gelu_new (or gelu_pytorch_tanh, the
same tanh GELU) and relu, unscaled attention or scale_attn_by_inverse_
layer_idx, cross-attention, a layer-norm epsilon other than 1e-5,
tensors that disagree with config.json (n_inner, vocab_size, ...) or
missing, extra, non-float32 or non-finite ones, a sharded or
pickle-only checkpoint, and a tokenizer that is not mpiformer's.
reorder_and_upcast_attn is taken: it reorders the same arithmetic.

Mapping: export_hf.py's, read backwards (GPT-2's Conv1D weights are ours
transposed). Runs on h5py and numpy alone.
"""

import json
import os
import struct
import sys
import tempfile

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from export_hf import CHECKPOINT_VERSION, LN_EPSILON, name_map  # noqa: E402
from mpiformer_checksum import crc32c  # noqa: E402
from mpiformer_metrics import CHECKPOINT_FORMAT, RunError, report_fault  # noqa: E402
import sentencepiece_model as spm  # noqa: E402

USAGE = "usage: import_hf.py HF_DIR OUT.h5 [--overwrite]"
# transformers' name -> ours
ACTIVATIONS = {"gelu_new": "gelu", "gelu_pytorch_tanh": "gelu", "relu": "relu"}
# mpiformer's reserved ids (SpecialTokens, src/core/config.h): name, piece type
RESERVED = (("pad", spm.CONTROL), ("bos", spm.CONTROL), ("eos", spm.CONTROL),
            ("unk", spm.UNKNOWN), ("mask", spm.USER_DEFINED), ("sep", spm.USER_DEFINED))
USER_DEFINED = {4: "[MASK]", 5: "[SEP]"}
CHUNK_ELEMENTS = 1 << 20  # kChunkElements, src/io/checkpoint.cpp
BYTES_CHUNK = 65536  # /tokenizer's chunks, as the shards'


class ImportRefused(Exception):
    """HF_DIR holds nothing mpiformer can take: one line, exit 2."""


class WriteError(Exception):
    """OUT.h5 could not be written (a full disk): one line, exit 1."""


def read_config(hf_dir):
    path = os.path.join(hf_dir, "config.json")
    if not os.path.isfile(path):
        raise ImportRefused("no config.json: not a Hugging Face model directory")
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ImportRefused(f"config.json cannot be read ({e})") from None
    if not isinstance(config, dict):
        raise ImportRefused("config.json is not a JSON object")
    return config


def refusals(config):
    """What keeps config.json's model from being an mpiformer lm."""
    kind = config.get("model_type")
    if kind != "gpt2":
        return [f"a model of type {kind!r}; only GPT-2 (model_type gpt2) has mpiformer's "
                "lm arithmetic"]
    why = []
    activation = config.get("activation_function", "gelu_new")
    if activation not in ACTIVATIONS:
        why.append(f"activation {activation!r}; mpiformer has the tanh GELU (gelu_new) and "
                   "relu")
    if not config.get("scale_attn_weights", True):
        why.append("unscaled attention (scale_attn_weights false); mpiformer scales by "
                   "1/sqrt(d_head)")
    if config.get("scale_attn_by_inverse_layer_idx", False):
        why.append("attention scaled by the inverse layer index "
                   "(scale_attn_by_inverse_layer_idx)")
    if config.get("add_cross_attention", False):
        why.append("cross-attention (add_cross_attention); an lm has none")
    epsilon = config.get("layer_norm_epsilon", 1e-5)
    if epsilon != LN_EPSILON:
        why.append(f"layer_norm_epsilon {epsilon}; mpiformer's layer norms use {LN_EPSILON}")
    return why


def dimensions(config):
    """(layers, heads, C, F, L, V, tied) from config.json."""
    try:
        layers, heads, C = (int(config[k]) for k in ("n_layer", "n_head", "n_embd"))
        L, V = int(config["n_positions"]), int(config["vocab_size"])
        F = int(config["n_inner"]) if config.get("n_inner") is not None else 4 * C
    except (KeyError, TypeError, ValueError) as e:
        raise ImportRefused(f"config.json has no valid {e}") from None
    if min(layers, heads, C, F, L, V) < 1 or C % heads:
        raise ImportRefused(f"config.json's dimensions do not make a model: n_layer {layers}, "
                            f"n_head {heads}, n_embd {C}, n_inner {F}, n_positions {L}, "
                            f"vocab_size {V}")
    return layers, heads, C, F, L, V, bool(config.get("tie_word_embeddings", True))


def read_safetensors(hf_dir):
    """{name: float32 array} of model.safetensors: an 8-byte little-endian
    header length, a JSON header (dtype, shape, [begin, end) byte offsets
    into the data after it), the data."""
    path = os.path.join(hf_dir, "model.safetensors")
    if not os.path.isfile(path):
        if os.path.exists(os.path.join(hf_dir, "model.safetensors.index.json")):
            raise ImportRefused("a checkpoint sharded over several files "
                                "(model.safetensors.index.json); save it as one file")
        raise ImportRefused("no model.safetensors (save_pretrained(..., "
                            "safe_serialization=True) writes one)")
    try:
        data = np.memmap(path, dtype=np.uint8, mode="r")
    except (OSError, ValueError) as e:
        raise ImportRefused(f"model.safetensors cannot be read ({e})") from None
    if data.size < 8:
        raise ImportRefused("model.safetensors is truncated")
    n = struct.unpack("<Q", data[:8].tobytes())[0]
    try:
        if 8 + n > data.size:
            raise ValueError("header runs past the end of the file")
        header = json.loads(data[8:8 + n].tobytes())
    except (ValueError, UnicodeDecodeError) as e:
        raise ImportRefused(f"model.safetensors has no valid header ({e})") from None
    body = data[8 + n:]
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape = entry["dtype"], [int(d) for d in entry["shape"]]
            begin, end = (int(x) for x in entry["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise ImportRefused(f"model.safetensors: tensor {name} has no valid entry") from None
        if dtype != "F32":
            raise ImportRefused(f"tensor {name} is {dtype}; save the model in float32 "
                                "(model.float().save_pretrained(...))")
        count = int(np.prod(shape))
        if not 0 <= begin <= end <= body.size or end - begin != 4 * count:
            raise ImportRefused(f"model.safetensors: tensor {name} lies outside the file or "
                                "does not fit its shape")
        tensors[name] = np.frombuffer(body[begin:end], dtype="<f4").reshape(shape)
    return tensors


def our_tensors(tensors, config):
    """GPT-2's tensors under our names and shapes, and (layers, heads, C, F,
    L, V, tied)."""
    layers, heads, C, F, L, V, tied = dims = dimensions(config)
    theirs, named = {}, {}  # GPT2LMHeadModel's names, and the file's
    for name, t in tensors.items():
        # GPT2Model's own files have no "transformer." prefix
        key = name if name.startswith("lm_head.") or name.startswith("transformer.") \
            else "transformer." + name
        # older files keep attention's causal mask buffers: not weights
        parts = key.split(".")
        if len(parts) == 5 and parts[1] == "h" and parts[3] == "attn" \
                and parts[4] in ("bias", "masked_bias"):
            continue
        theirs[key], named[key] = t, name
    if tied and "lm_head.weight" in theirs:
        # some files store the tied head too; it must be the embedding table
        head = theirs.pop("lm_head.weight")
        if "transformer.wte.weight" in theirs and not np.array_equal(
                head, theirs["transformer.wte.weight"]):
            raise ImportRefused("lm_head.weight differs from transformer.wte.weight, but "
                                "config.json ties them (tie_word_embeddings)")
    params = {}
    for ours, hf, shape, transposed in name_map(layers, C, F, L, V, tied):
        if hf not in theirs:
            raise ImportRefused(f"model.safetensors has no tensor {hf}, which config.json "
                                "implies")
        t = theirs.pop(hf)
        want = shape[::-1] if transposed else shape
        if t.shape != tuple(want):
            raise ImportRefused(f"tensor {hf} has shape {t.shape}; config.json implies "
                                f"{tuple(want)} (n_embd {C}, n_inner {F}, n_positions {L}, "
                                f"vocab_size {V})")
        if not np.isfinite(t).all():
            raise ImportRefused(f"tensor {hf} holds non-finite values")
        params[ours] = np.ascontiguousarray(t.T if transposed else t, dtype=np.float32)
    if theirs:
        raise ImportRefused(f"model.safetensors holds tensor {named[sorted(theirs)[0]]}, which "
                            f"GPT2LMHeadModel of config.json has no place for")
    return params, dims


def read_tokenizer(hf_dir, vocab, config):
    """The bytes of HF_DIR/tokenizer.model after checking they are an
    mpiformer vocabulary of `vocab` pieces whose special ids config.json
    agrees with."""
    path = os.path.join(hf_dir, "tokenizer.model")
    if not os.path.isfile(path):
        present = [n for n in ("tokenizer.json", "vocab.json", "merges.txt")
                   if os.path.exists(os.path.join(hf_dir, n))]
        if "vocab.json" in present or "merges.txt" in present:
            what = ("a byte-level BPE tokenizer (vocab.json, merges.txt), which mpiformer "
                    "cannot read")
        elif present:
            what = "tokenizer.json but no tokenizer.model, the SentencePiece model it needs"
        else:
            what = "no tokenizer.model"
        raise ImportRefused(what + "; mpiformer reads text through a SentencePiece model with "
                            "its reserved ids 0-5: copy the shards' tokenizer.model into "
                            f"{hf_dir}")
    with open(path, "rb") as f:
        data = f.read()
    try:
        model = spm.read_model(data)
    except spm.ModelError as e:
        raise ImportRefused(f"tokenizer.model is no SentencePiece model ({e})") from None
    why = []
    if len(model.pieces) != vocab:
        why.append(f"it has {len(model.pieces)} pieces, the model a vocabulary of {vocab}")
    for i, (name, kind) in enumerate(RESERVED):
        if i >= len(model.pieces) or model.pieces[i][2] != kind \
                or (name in model.ids and model.ids[name] != i) \
                or (i in USER_DEFINED and model.pieces[i][0] != USER_DEFINED[i]):
            why.append(f"id {i} is not its {name}" + (f" {USER_DEFINED[i]}" if i in USER_DEFINED
                                                     else ""))
    if why:
        raise ImportRefused("tokenizer.model is not an mpiformer vocabulary: " + "; ".join(why))
    for i, (name, _) in enumerate(RESERVED[:3]):
        given = config.get(f"{name}_token_id")
        if given is not None and given != i:
            raise ImportRefused(f"config.json's {name}_token_id {given} is not the tokenizer's "
                                f"{name} id {i}")
    return data


def model_flags(dims, activation):
    layers, heads, C, F, L, V, tied = dims
    return {"model": "lm", "layers": layers, "d-model": C, "heads": heads, "d-ff": F,
            "max-len": L, "vocab": V, "norm": "pre", "positions": "learned",
            "tied-embeddings": "true" if tied else "false", "output-bias": "false",
            "activation": activation, "attention-scale": "standard"}


def config_ini(flags):
    """The config attribute: the model's flags as train writes them (every
    other flag reads as its default)."""
    lines = ["# mpiformer train configuration; re-use with --config FILE",
             "# (the model of a Hugging Face GPT-2 directory, from analysis/import_hf.py)",
             "", "# Model"]
    lines += [f"{k} = {v}" for k, v in flags.items()]
    return "\n".join(lines) + "\n"


def chunk_dims(shape):
    """src/io/checkpoint.cpp's checkpoint_chunk_dims: at most 2^20 elements,
    whole rows, the outermost dimension cut first."""
    chunk = list(shape)
    for i in range(len(chunk)):
        rest = int(np.prod([chunk[j] for j in range(len(chunk)) if j != i]))
        chunk[i] = min(max(CHUNK_ELEMENTS // max(rest, 1), 1), chunk[i])
    return tuple(chunk)


def write_checkpoint(path, params, tokenizer, flags):
    """The checkpoint at step 0 (data/CHECKPOINT.md), into a temporary
    file beside PATH renamed into place."""
    directory = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp",
                                   dir=directory)
        os.close(fd)
    except OSError as e:
        raise RunError(f"{path}: cannot create a file in {directory} ({e.strerror or e})") \
            from None
    try:
        with h5py.File(tmp, "w", libver=("v108", "latest")) as f:
            string = lambda s: np.bytes_(s.encode())  # noqa: E731 fixed-length, as C++ writes
            f.attrs["format"] = string(CHECKPOINT_FORMAT)
            f.attrs["version"] = np.int32(CHECKPOINT_VERSION)
            f.attrs["checksum"] = string("crc32c")  # on every dataset, as below
            f.attrs["step"] = np.int64(0)
            f.attrs["world_size"] = np.int32(1)
            f.attrs["config"] = string(config_ini(flags))
            for name in ("optimizer_steps", "loss_scale_good_steps"):
                f.attrs[name] = np.int64(0)
            f.attrs["data_batches_per_step"] = np.int64(1)
            for name, value in (("data_next_batch", 0), ("data_epoch", 0), ("rng_seed", 1)):
                f.attrs[name] = np.uint64(value)
            f.attrs["data_sharding"] = string("data")
            f.attrs["rng_streams"] = string("counter-based streams keyed by rng_seed")
            f.attrs["loss_scale"] = np.float64(1.0)
            f.attrs["vocab_size"] = np.int32(flags["vocab"])
            for i, (name, _) in enumerate(RESERVED):
                f.attrs[f"{name}_id"] = np.int32(i)
            data = np.frombuffer(tokenizer, dtype=np.uint8)
            d = f.create_dataset("tokenizer", data=data, chunks=(min(data.size, BYTES_CHUNK),),
                                 fletcher32=True)
            d.attrs["crc32c"] = np.uint32(crc32c(data))
            for group in ("params", "optimizer/m", "optimizer/v"):
                g = f.create_group(group)
                for name in sorted(params):
                    t = params[name] if group == "params" else np.zeros_like(params[name])
                    t = np.asarray(t, dtype="<f4")
                    d = g.create_dataset(name, data=t, chunks=chunk_dims(t.shape), fletcher32=True)
                    d.attrs["crc32c"] = np.uint32(crc32c(t))
        os.replace(tmp, path)
    except OSError as e:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise WriteError(f"{path}: cannot write the checkpoint ({e.strerror or e})") from None


def import_hf(hf_dir, out, overwrite=False):
    if not os.path.isdir(hf_dir):
        raise RunError(f"{hf_dir}: " + ("is not a directory" if os.path.exists(hf_dir)
                                        else "no such directory"))
    if os.path.isdir(out):
        raise RunError(f"{out}: is a directory")
    if os.path.lexists(out) and not overwrite:
        raise RunError(f"{out}: exists; pass --overwrite to replace it")
    config = read_config(hf_dir)
    why = refusals(config)
    if why:
        raise ImportRefused("cannot be an mpiformer lm: " + "; ".join(why))
    params, dims = our_tensors(read_safetensors(hf_dir), config)
    tokenizer = read_tokenizer(hf_dir, dims[5], config)
    flags = model_flags(dims, ACTIVATIONS[config.get("activation_function", "gelu_new")])
    write_checkpoint(out, params, tokenizer, flags)
    count = sum(t.size for t in params.values())
    print(f"wrote {out}: an lm of {dims[0]} layers, d-model {dims[2]}, {dims[1]} heads, d-ff "
          f"{dims[3]}, max-len {dims[4]}, vocab {dims[5]}, {flags['activation']}, "
          f"{'tied' if dims[6] else 'untied'} embeddings ({count} parameters), step 0 with "
          "AdamW moments of zero; fine-tune it with: mpiformer train --resume "
          f"{out} --data SHARDS --out RUNDIR "
          + " ".join(f"--{k} {v}" for k, v in flags.items() if k != "vocab"))


def main(argv):
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        return 0
    overwrite = "--overwrite" in argv
    args = [a for a in argv if a != "--overwrite"]
    if len(args) != 2 or any(a.startswith("-") for a in args):
        print(USAGE, file=sys.stderr)
        return 2
    hf_dir, out = args
    try:
        import_hf(hf_dir, out, overwrite)
    except ImportRefused as e:  # its words may quote config.json: report_fault escapes them
        return report_fault("import_hf.py", f"{hf_dir}: {e}")
    except RunError as e:
        return report_fault("import_hf.py", e)
    except WriteError as e:
        return report_fault("import_hf.py", e, 1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
