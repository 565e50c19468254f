#!/usr/bin/env python3
"""An independent reference for mpiformer's numerics: the same lm (decoder-
only) or seq2seq model (encoder-decoder with cross-attention) written in
PyTorch from the textbook definitions (pre-LN blocks, learned positions
shared by both sides, tied embeddings, tanh GELU, scaled dot-product
attention, label-smoothed cross entropy over non-pad targets), its weights
read from an mpiformer checkpoint, run on the batch that `dump_step` used,
in float64. Compares the mean loss and every parameter gradient with those
`dump_step` computed on the CPU or CUDA backend.

usage: torch_reference.py CHECKPOINT DUMP [--tolerance T] [--device cpu|cuda]
Exit 0 when every tensor's max relative difference (max |a-b| / max |b|)
and the loss's relative difference are within the tolerance (default 1e-4),
1 otherwise, 2 for a checkpoint this reference does not cover.

usage: torch_reference.py CHECKPOINT --data DIR [--split valid|test]
The true negative log-likelihood of an lm checkpoint on every sequence of
DIR's split, read from the shards as data/FORMAT.md lays them out (BOS and
the tokens predict the tokens and EOS), printed as "nll N ppl P bits B
tokens T": what `mpiformer eval` must print.
"""

import argparse
import glob
import math
import os
import sys

import h5py
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mpiformer_metrics import read_config  # noqa: E402


def layer_norm(x, p, name):
    return torch.nn.functional.layer_norm(x, x.shape[-1:], p[name + ".gamma"], p[name + ".beta"],
                                          eps=1e-5)


def gelu_tanh(x):
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def attention(q, k, v, heads, causal):
    """Multi-head scaled dot-product attention.  q: (Tq, C), k, v: (Tk, C)"""
    (Tq, C), Tk = q.shape, k.shape[0]
    D = C // heads
    q, k, v = (t.reshape(-1, heads, D).transpose(0, 1) for t in (q, k, v))
    scores = (q @ k.transpose(1, 2)) / math.sqrt(D)
    if causal:
        scores = scores.masked_fill(~torch.ones(Tq, Tk, dtype=torch.bool).tril(), float("-inf"))
    return (torch.softmax(scores, dim=-1) @ v).transpose(0, 1).reshape(Tq, C)


def stack(x, p, prefix, layers, heads, causal, memory=None):
    """Pre-LN blocks: self-attention, cross-attention (with memory), MLP."""
    C = x.shape[-1]
    for i in range(layers):
        a = f"{prefix}.layers.{i}.self_attn"
        u = layer_norm(x, p, a + ".norm")
        qkv = u @ p[a + ".qkv.weight"].T + p[a + ".qkv.bias"]
        att = attention(qkv[:, :C], qkv[:, C:2 * C], qkv[:, 2 * C:], heads, causal)
        x = x + att @ p[a + ".out.weight"].T + p[a + ".out.bias"]
        if memory is not None:
            c = f"{prefix}.layers.{i}.cross_attn"
            u = layer_norm(x, p, c + ".norm")
            q = u @ p[c + ".q.weight"].T + p[c + ".q.bias"]
            kv = memory @ p[c + ".kv.weight"].T + p[c + ".kv.bias"]
            att = attention(q, kv[:, :C], kv[:, C:], heads, False)
            x = x + att @ p[c + ".out.weight"].T + p[c + ".out.bias"]
        m = f"{prefix}.layers.{i}.mlp"
        u = layer_norm(x, p, m + ".norm")
        h = gelu_tanh(u @ p[m + ".fc.weight"].T + p[m + ".fc.bias"])
        x = x + h @ p[m + ".proj.weight"].T + p[m + ".proj.bias"]
    return layer_norm(x, p, prefix + ".norm")


def sequence_loss(p, cfg, tokens, positions, targets, smoothing, source=None):
    """Sum of the label-smoothed losses of one sequence's non-pad targets,
    the count of those targets, and of the correct ones. source: the
    encoder's (tokens, positions) for seq2seq."""
    H = int(cfg["heads"])
    embed = lambda ids, pos: p["embed.tokens"][ids] + p["embed.positions"][pos]  # noqa: E731
    memory = None
    if source is not None:
        memory = stack(embed(*source), p, "encoder", int(cfg["enc-layers"]), H, False)
        layers = int(cfg["dec-layers"])
    else:
        layers = int(cfg["layers"])
    x = stack(embed(tokens, positions), p, "decoder", layers, H, True, memory)
    logits = x @ p["embed.tokens"].T
    if "output.bias" in p:  # --output-bias false has none
        logits = logits + p["output.bias"]
    V = logits.shape[-1]
    keep = targets != 0  # pad id 0
    log_probs = torch.log_softmax(logits[keep], dim=-1)
    t = targets[keep]
    e = smoothing
    # 1-e on the label, e/(V-1) elsewhere, minus the loss of a perfect prediction.
    q = torch.full_like(log_probs, e / (V - 1))
    q[torch.arange(len(t)), t] = 1 - e
    constant = -((1 - e) * math.log(1 - e) if e < 1 else 0) - (e * math.log(e / (V - 1)) if e > 0 else 0)
    loss = -(q * log_probs).sum() - constant * len(t)
    correct = int((logits[keep].argmax(dim=-1) == t).sum())
    return loss, len(t), correct


def split_nll(params, cfg, data_dir, split, device):
    """Sum of -log p(target) over every sequence of an lm shard split, and the
    count of targets. Sequences longer than max-len would be truncated by the
    trainer; this reference refuses them instead."""
    files = sorted(glob.glob(os.path.join(data_dir, f"{split}-*.h5")))
    if not files:
        raise SystemExit(f"torch_reference.py: no {split}-*.h5 shards in {data_dir}")
    L = int(cfg["max-len"])
    total, tokens = 0.0, 0
    with torch.no_grad():
        for path in files:
            with h5py.File(path, "r") as f:
                bos, eos = int(f.attrs["bos_id"]), int(f.attrs["eos_id"])
                ids = np.asarray(f["tokens"], dtype=np.int64)
                offsets = np.asarray(f["offsets"], dtype=np.int64)
            for i in range(len(offsets) - 1):
                seq = ids[offsets[i]:offsets[i + 1]]
                if len(seq) + 1 > L:
                    raise SystemExit(f"torch_reference.py: {path} sequence {i} is longer than "
                                     f"max-len {L}; choose a larger --max-len")
                inputs = torch.tensor(np.concatenate([[bos], seq]), device=device)
                targets = torch.tensor(np.concatenate([seq, [eos]]), device=device)
                positions = torch.arange(len(inputs), device=device)
                loss, n, _ = sequence_loss(params, cfg, inputs, positions, targets, 0.0)
                total, tokens = total + float(loss), tokens + n
    return total, tokens


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint")
    parser.add_argument("dump", nargs="?")
    parser.add_argument("--data", help="an lm shard set: print the checkpoint's nll on a split")
    parser.add_argument("--split", default="valid")
    parser.add_argument("--tolerance", type=float, default=1e-4)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    if (args.dump is None) == (args.data is None):
        parser.error("give a DUMP or --data DIR")

    with h5py.File(args.checkpoint, "r") as f:
        config = f.attrs["config"]
        cfg = read_config(config)
        params = {name: torch.tensor(np.asarray(f["params"][name]), dtype=torch.float64,
                                     device=args.device, requires_grad=True)
                  for name in f["params"]}
    if cfg.get("model") not in ("lm", "seq2seq"):
        print(f"torch_reference.py: covers lm and seq2seq; the checkpoint has {cfg.get('model')}",
              file=sys.stderr)
        return 2
    covered = {"norm": "pre", "positions": "learned", "tied-embeddings": "true",
               "activation": "gelu", "attention-scale": "standard", "dropout": "0"}
    for key, value in covered.items():
        if cfg.get(key) != value:
            print(f"torch_reference.py: covers {key} = {value}; the checkpoint has "
                  f"{cfg.get(key)}", file=sys.stderr)
            return 2

    if args.data is not None:
        if cfg["model"] != "lm":
            print("torch_reference.py: --data covers lm checkpoints", file=sys.stderr)
            return 2
        total, tokens = split_nll(params, cfg, args.data, args.split, args.device)
        nll = total / tokens
        print(f"nll {nll:.10f} ppl {math.exp(nll):.10f} bits {nll / math.log(2):.10f} "
              f"tokens {tokens}")
        return 0

    with h5py.File(args.dump, "r") as f:
        batch = {k: torch.tensor(np.asarray(f["batch"][k]), dtype=torch.long, device=args.device)
                 for k in f["batch"]}
        ours_grads = {name: np.asarray(f["grads"][name]) for name in f["grads"]}
        ours_loss = float(f.attrs["loss_sum"])
        ours_tokens = int(f.attrs["tokens"])

    smoothing = float(cfg["label-smoothing"])
    total, tokens, correct = 0.0, 0, 0
    offsets = batch["offsets"].tolist()
    src_offsets = batch["src_offsets"].tolist() if "src_offsets" in batch else None
    for b in range(len(offsets) - 1):
        s = slice(offsets[b], offsets[b + 1])
        source = None
        if src_offsets is not None:
            r = slice(src_offsets[b], src_offsets[b + 1])
            source = (batch["src_tokens"][r], batch["src_positions"][r])
        loss, n, c = sequence_loss(params, cfg, batch["tokens"][s], batch["positions"][s],
                                   batch["targets"][s], smoothing, source)
        total, tokens, correct = total + loss, tokens + n, correct + c
    (total / tokens).backward()

    failures = 0
    loss_rel = abs(float(total) - ours_loss) / max(abs(float(total)), 1e-30)
    print(f"loss: torch {float(total) / tokens:.9f}, mpiformer {ours_loss / ours_tokens:.9f} "
          f"({tokens} tokens, relative difference {loss_rel:.2e})")
    failures += loss_rel > args.tolerance or tokens != ours_tokens
    worst = (0.0, "")
    for name, p in params.items():
        ref = p.grad.detach().cpu().numpy().ravel()
        ours = ours_grads[name].astype(np.float64)
        scale = max(np.abs(ref).max(), 1e-30)
        rel = float(np.abs(ours - ref).max() / scale)
        worst = max(worst, (rel, name))
        if rel > args.tolerance:
            print(f"  {name}: max relative difference {rel:.2e}", file=sys.stderr)
            failures += 1
    print(f"gradients: {len(params)} tensors, worst {worst[1]} at {worst[0]:.2e} "
          f"(tolerance {args.tolerance:g})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
