#!/usr/bin/env python3
"""An independent reference for mpiformer's numerics: the same decoder-only
lm written in PyTorch from the textbook definitions (pre-LN GPT-2 blocks,
learned positions, tied embeddings, tanh GELU, causal scaled dot-product
attention, label-smoothed cross entropy over non-pad targets), its weights
read from an mpiformer checkpoint, run on the batch that `dump_step` used,
in float64. Compares the mean loss and every parameter gradient with those
`dump_step` computed on the CPU or CUDA backend.

usage: torch_reference.py CHECKPOINT DUMP [--tolerance T] [--device cpu|cuda]
Exit 0 when every tensor's max relative difference (max |a-b| / max |b|)
and the loss's relative difference are within the tolerance (default 1e-4),
1 otherwise, 2 for a checkpoint this reference does not cover.
"""

import argparse
import math
import sys

import h5py
import numpy as np
import torch


def read_config(text):
    cfg = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = (part.strip() for part in line.split("=", 1))
            cfg[key] = value
    return cfg


def layer_norm(x, p, name):
    return torch.nn.functional.layer_norm(x, x.shape[-1:], p[name + ".gamma"], p[name + ".beta"],
                                          eps=1e-5)


def gelu_tanh(x):
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def sequence_loss(p, cfg, tokens, positions, targets, smoothing):
    """Sum of the label-smoothed losses of one sequence's non-pad targets,
    the count of those targets, and of the correct ones."""
    C, H = int(cfg["d-model"]), int(cfg["heads"])
    D, T = C // H, len(tokens)
    x = p["embed.tokens"][tokens] + p["embed.positions"][positions]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(int(cfg["layers"])):
        a = f"decoder.layers.{i}.self_attn"
        u = layer_norm(x, p, a + ".norm")
        qkv = u @ p[a + ".qkv.weight"].T + p[a + ".qkv.bias"]
        q, k, v = (qkv[:, j * C:(j + 1) * C].reshape(T, H, D).transpose(0, 1) for j in range(3))
        scores = (q @ k.transpose(1, 2)) / math.sqrt(D)
        probs = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
        attended = (probs @ v).transpose(0, 1).reshape(T, C)
        x = x + attended @ p[a + ".out.weight"].T + p[a + ".out.bias"]
        m = f"decoder.layers.{i}.mlp"
        u = layer_norm(x, p, m + ".norm")
        h = gelu_tanh(u @ p[m + ".fc.weight"].T + p[m + ".fc.bias"])
        x = x + h @ p[m + ".proj.weight"].T + p[m + ".proj.bias"]
    x = layer_norm(x, p, "decoder.norm")
    logits = x @ p["embed.tokens"].T + p["output.bias"]
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


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint")
    parser.add_argument("dump")
    parser.add_argument("--tolerance", type=float, default=1e-4)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)

    with h5py.File(args.checkpoint, "r") as f:
        config = f.attrs["config"]
        cfg = read_config(config.decode() if isinstance(config, bytes) else config)
        params = {name: torch.tensor(np.asarray(f["params"][name]), dtype=torch.float64,
                                     device=args.device, requires_grad=True)
                  for name in f["params"]}
    covered = {"model": "lm", "norm": "pre", "positions": "learned", "tied-embeddings": "true",
               "activation": "gelu", "attention-scale": "standard", "dropout": "0"}
    for key, value in covered.items():
        if cfg.get(key) != value:
            print(f"torch_reference.py: covers {key} = {value}; the checkpoint has "
                  f"{cfg.get(key)}", file=sys.stderr)
            return 2

    with h5py.File(args.dump, "r") as f:
        batch = {k: torch.tensor(np.asarray(f["batch"][k]), dtype=torch.long, device=args.device)
                 for k in ("tokens", "offsets", "positions", "targets")}
        ours_grads = {name: np.asarray(f["grads"][name]) for name in f["grads"]}
        ours_loss = float(f.attrs["loss_sum"])
        ours_tokens = int(f.attrs["tokens"])

    smoothing = float(cfg["label-smoothing"])
    total, tokens, correct = 0.0, 0, 0
    offsets = batch["offsets"].tolist()
    for b in range(len(offsets) - 1):
        s = slice(offsets[b], offsets[b + 1])
        loss, n, c = sequence_loss(params, cfg, batch["tokens"][s], batch["positions"][s],
                                   batch["targets"][s], smoothing)
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
