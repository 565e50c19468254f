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

For a classifier (--model classify) the same usage gives the figures of
`mpiformer eval` over DIR's split: every example of the classify shards
(text: BOS as the CLS token with --pool cls) or image shards (--patch P:
a row per P x P patch, pixels in [-1, 1] and a one-hot of the row's
position, after an empty CLS row with --pool cls) through the encoder
stack (pre- or post-LN, learned or sinusoidal positions), pooled (the
first row, or the mean of the rows), scored by the classifier head, under
the run's loss: label-smoothed softmax cross entropy over the K labels, or
ZLPR with soft targets. Printed as "loss L nll N acc A examples E" (acc in
percent), and for zlpr also "micro_p P micro_r R micro_f1 F macro_p P
macro_r R macro_f1 F" (a label is predicted when its score is > 0 and true
when its target is >= 0.5; macro averages over the labels that occur in
the truth or the predictions).
"""

import argparse
import glob
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mpiformer_metrics import RunError, h5_file, read_config, report_fault  # noqa: E402


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


def relu(x):
    return torch.clamp(x, min=0)


def stack(x, p, prefix, layers, heads, causal, memory=None, pre_norm=True, act=gelu_tanh):
    """Residual blocks: self-attention, cross-attention (with memory), MLP.
    Pre-LN: x + f(LN(x)) and a final LN; post-LN: LN(x + f(x)), no final LN."""
    C = x.shape[-1]

    def residual(x, name, f):
        if pre_norm:
            return x + f(layer_norm(x, p, name + ".norm"))
        return layer_norm(x + f(x), p, name + ".norm")

    def self_attn(u, a):
        qkv = u @ p[a + ".qkv.weight"].T + p[a + ".qkv.bias"]
        att = attention(qkv[:, :C], qkv[:, C:2 * C], qkv[:, 2 * C:], heads, causal)
        return att @ p[a + ".out.weight"].T + p[a + ".out.bias"]

    def cross_attn(u, c):
        q = u @ p[c + ".q.weight"].T + p[c + ".q.bias"]
        kv = memory @ p[c + ".kv.weight"].T + p[c + ".kv.bias"]
        att = attention(q, kv[:, :C], kv[:, C:], heads, False)
        return att @ p[c + ".out.weight"].T + p[c + ".out.bias"]

    def mlp(u, m):
        h = act(u @ p[m + ".fc.weight"].T + p[m + ".fc.bias"])
        return h @ p[m + ".proj.weight"].T + p[m + ".proj.bias"]

    for i in range(layers):
        a = f"{prefix}.layers.{i}.self_attn"
        x = residual(x, a, lambda u: self_attn(u, a))
        if memory is not None:
            c = f"{prefix}.layers.{i}.cross_attn"
            x = residual(x, c, lambda u: cross_attn(u, c))
        m = f"{prefix}.layers.{i}.mlp"
        x = residual(x, m, lambda u: mlp(u, m))
    return layer_norm(x, p, prefix + ".norm") if pre_norm else x


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
            with h5_file(path, "shard file") as f:
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


def sinusoid_table(L, C, device):
    """The fixed positions: sin(pos w_i) at 2i, cos(pos w_i) at 2i + 1,
    w_i = 10000^(-2i/C); 0 in the last column when C is odd."""
    table = torch.zeros(L, C, dtype=torch.float64, device=device)
    pos = torch.arange(L, dtype=torch.float64, device=device)[:, None]
    freq = 10000.0 ** (-2.0 * torch.arange(C // 2, dtype=torch.float64, device=device) / C)
    table[:, 0:2 * (C // 2):2] = torch.sin(pos * freq)
    table[:, 1:2 * (C // 2):2] = torch.cos(pos * freq)
    return table


def patch_rows(image, P, L, cls):
    """The rows of one image: [an empty CLS row,] then its patches in raster
    order, each its P x P x channels pixels mapped to [-1, 1] (dy, dx,
    channel), then a one-hot of the row's position over L columns.
    image: (H, W, channels) uint8; returns (rows, P P channels + L) float64"""
    H, W, Ch = image.shape
    pixels = image.astype(np.float64) / 127.5 - 1.0
    patches = (pixels.reshape(H // P, P, W // P, P, Ch).transpose(0, 2, 1, 3, 4)
               .reshape((H // P) * (W // P), P * P * Ch))
    if cls:
        patches = np.concatenate([np.zeros((1, P * P * Ch)), patches])
    rows = len(patches)
    return np.concatenate([patches, np.eye(L)[:rows]], axis=1)


def classify_split(cfg, data_dir, split):
    """The examples of a classify or image shard split, as the trainer reads
    them: a list of (inputs, labels), inputs the token ids of a text example
    (with BOS first as the CLS token under --pool cls; longer than max-len:
    truncated or skipped per --too-long; empty under --pool mean: skipped)
    or an image's feature rows (patch_rows), labels a list of (id, weight).
    Returns the examples and the label count K of the shards."""
    files = sorted(glob.glob(os.path.join(data_dir, f"{split}-*.h5")))
    if not files:
        raise SystemExit(f"torch_reference.py: no {split}-*.h5 shards in {data_dir}")
    L, P = int(cfg["max-len"]), int(cfg.get("patch", "0"))
    cls = cfg["pool"] == "cls"
    skip_long = cfg.get("too-long", "auto") == "skip"  # auto truncates: not seq2seq
    examples, K = [], None
    for path in files:
        with h5_file(path, "shard file") as f:
            kind = f.attrs["kind"]
            kind = kind.decode() if isinstance(kind, bytes) else str(kind)
            if kind != ("image" if P > 0 else "classify"):
                raise RunError(f"{path} is a {kind} shard; the checkpoint needs "
                               f"{'image' if P > 0 else 'classify'} shards")
            K = int(f.attrs["num_labels"])
            label_ids = np.asarray(f["labels/ids"], dtype=np.int64)
            label_weights = np.asarray(f["labels/weights"], dtype=np.float64)
            label_offsets = np.asarray(f["labels/offsets"], dtype=np.int64)
            if P > 0:
                shape = tuple(int(f.attrs[k]) for k in
                              ("image_height", "image_width", "image_channels"))
                images = np.asarray(f["images"], dtype=np.uint8).reshape((-1,) + shape)
                count = len(images)
            else:
                bos = int(f.attrs["bos_id"])
                ids = np.asarray(f["tokens"], dtype=np.int64)
                offsets = np.asarray(f["offsets"], dtype=np.int64)
                count = len(offsets) - 1
        if len(label_offsets) != count + 1:
            raise SystemExit(f"torch_reference.py: {path}: {len(label_offsets) - 1} label rows "
                             f"for {count} examples")
        for i in range(count):
            r = slice(label_offsets[i], label_offsets[i + 1])
            labels = list(zip(label_ids[r].tolist(), label_weights[r].tolist()))
            if P > 0:
                H, W, _ = shape
                if H % P or W % P or (H // P) * (W // P) + cls > L:
                    raise SystemExit(f"torch_reference.py: {H} x {W} images do not make "
                                     f"{P} x {P} patches within max-len {L}")
                examples.append((patch_rows(images[i], P, L, cls), labels))
                continue
            seq = ids[offsets[i]:offsets[i + 1]]
            if not cls and len(seq) == 0:
                continue  # a mean of no rows
            if len(seq) + cls > L:
                if skip_long:
                    continue
                seq = seq[:L - cls]
            examples.append((np.concatenate([[bos], seq]) if cls else seq, labels))
    if not examples:
        raise SystemExit(f"torch_reference.py: no {split} example of {data_dir} fits max-len {L}")
    return examples, K


def classify_scores(p, cfg, inputs, device):
    """The K scores of one example: the encoder stack over its rows, pooled,
    then the classifier head. inputs: token ids (n) or feature rows (n, F)."""
    C, H = int(cfg["d-model"]), int(cfg["heads"])
    if int(cfg.get("patch", "0")) > 0:
        f = torch.tensor(inputs, dtype=torch.float64, device=device)
        x = f @ p["patch_embed.weight"].T + p["patch_embed.bias"]
    else:
        ids = torch.tensor(inputs, dtype=torch.long, device=device)
        positions = torch.arange(len(ids), device=device)
        if cfg["positions"] == "learned":
            x = p["embed.tokens"][ids] + p["embed.positions"][positions]
        else:  # unit-amplitude sinusoids: the embeddings are scaled by sqrt(C) to match
            table = sinusoid_table(int(cfg["max-len"]), C, device)
            x = p["embed.tokens"][ids] * math.sqrt(C) + table[positions]
    act = relu if cfg["activation"] == "relu" else gelu_tanh
    h = stack(x, p, "encoder", int(cfg["layers"]), H, False, pre_norm=cfg["norm"] == "pre",
              act=act)
    pooled = h[0] if cfg["pool"] == "cls" else h.mean(dim=0)
    return pooled @ p["classifier.weight"].T + p["classifier.bias"]


def classify_figures(params, cfg, data_dir, split, device):
    """The eval figures of a classifier checkpoint on a split: a dict of
    loss, nll, acc (percent), examples and, for zlpr, the label figures."""
    examples, K = classify_split(cfg, data_dir, split)
    if K != params["classifier.bias"].shape[0]:
        raise SystemExit(f"torch_reference.py: the shards have {K} labels; the checkpoint "
                         f"scores {params['classifier.bias'].shape[0]}")
    loss_kind = cfg["loss"]
    e = float(cfg["label-smoothing"])
    total, total_nll, correct = 0.0, 0.0, 0
    tp, fp, fn = np.zeros(K, np.int64), np.zeros(K, np.int64), np.zeros(K, np.int64)
    with torch.no_grad():
        for n, (inputs, labels) in enumerate(examples):
            s = classify_scores(params, cfg, inputs, device)
            if loss_kind == "softmax":
                if len(labels) != 1 or labels[0][1] != 1.0:
                    raise SystemExit(f"torch_reference.py: example {n} has labels {labels}; "
                                     "--loss softmax needs one hard label")
                y = labels[0][0]
                log_p = torch.log_softmax(s, dim=-1)
                # 1-e on the label, e/(K-1) elsewhere, minus a perfect prediction's loss.
                q = torch.full_like(log_p, e / (K - 1))
                q[y] = 1 - e
                constant = (-((1 - e) * math.log(1 - e) if e < 1 else 0)
                            - (e * math.log(e / (K - 1)) if e > 0 else 0))
                total += float(-(q * log_p).sum()) - constant
                total_nll += float(-log_p[y])
                correct += int(int(s.argmax()) == y)
            elif loss_kind == "zlpr":
                t = torch.zeros(K, dtype=torch.float64, device=device)
                for label, weight in labels:
                    t[label] = weight
                zero = torch.zeros(1, dtype=torch.float64, device=device)
                # log(1 + sum (1-t) e^s) + log(1 + sum t e^-s); log 0 = -inf drops a term.
                loss = (torch.logsumexp(torch.cat([zero, s + torch.log(1 - t)]), dim=0)
                        + torch.logsumexp(torch.cat([zero, -s + torch.log(t)]), dim=0))
                total += float(loss)
                total_nll += float(loss)
                predicted, truth = (s > 0).cpu().numpy(), (t >= 0.5).cpu().numpy()
                correct += int((predicted == truth).all())
                tp += predicted & truth
                fp += predicted & ~truth
                fn += ~predicted & truth
            else:
                raise SystemExit(f"torch_reference.py: unknown loss {loss_kind}")
    count = len(examples)
    figures = {"loss": total / count, "nll": total_nll / count, "acc": 100.0 * correct / count,
               "examples": count}
    if loss_kind == "zlpr":
        ratio = lambda a, b: a / b if b > 0 else 0.0  # noqa: E731
        occurring = (tp + fp + fn) > 0
        T, F, N = int(tp.sum()), int(fp.sum()), int(fn.sum())
        figures.update({
            "micro_p": ratio(T, T + F), "micro_r": ratio(T, T + N),
            "micro_f1": ratio(2 * T, 2 * T + F + N),
            "macro_p": np.mean([ratio(a, a + b) for a, b in zip(tp[occurring], fp[occurring])]),
            "macro_r": np.mean([ratio(a, a + b) for a, b in zip(tp[occurring], fn[occurring])]),
            "macro_f1": np.mean([ratio(2 * a, 2 * a + b + c) for a, b, c in
                                 zip(tp[occurring], fp[occurring], fn[occurring])]),
        })
    return figures


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint")
    parser.add_argument("dump", nargs="?")
    parser.add_argument("--data", help="an lm or classify shard set: print the checkpoint's "
                        "eval figures on a split")
    parser.add_argument("--split", default="valid")
    parser.add_argument("--tolerance", type=float, default=1e-4)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    if (args.dump is None) == (args.data is None):
        parser.error("give a DUMP or --data DIR")

    with h5_file(args.checkpoint, "checkpoint") as f:
        config = f.attrs["config"]
        cfg = read_config(config)
        params = {name: torch.tensor(np.asarray(f["params"][name]), dtype=torch.float64,
                                     device=args.device, requires_grad=True)
                  for name in f["params"]}
    if cfg.get("model") == "classify":
        if args.data is None:
            print("torch_reference.py: a classifier is checked on --data DIR (dump_step covers "
                  "lm and seq2seq)", file=sys.stderr)
            return 2
        # Evaluation runs without dropout; these are what the reference writes out.
        covered = {"norm": ("pre", "post"), "positions": ("learned", "sinusoidal"),
                   "activation": ("gelu", "relu"), "attention-scale": ("standard",),
                   "pool": ("cls", "mean"), "loss": ("softmax", "zlpr")}
        for key, values in covered.items():
            if cfg.get(key) not in values:
                return report_fault("torch_reference.py", f"covers {key} = "
                                    f"{' or '.join(values)}; the checkpoint has {cfg.get(key)}")
        figures = classify_figures(params, cfg, args.data, args.split, args.device)
        print(" ".join(f"{k} {v}" if isinstance(v, int) else f"{k} {v:.10f}"
                       for k, v in figures.items()))
        return 0
    if cfg.get("model") not in ("lm", "seq2seq"):
        return report_fault("torch_reference.py", "covers lm, seq2seq and classify; the "
                            f"checkpoint has {cfg.get('model')}")
    covered = {"norm": "pre", "positions": "learned", "tied-embeddings": "true",
               "activation": "gelu", "attention-scale": "standard", "dropout": "0"}
    for key, value in covered.items():
        if cfg.get(key) != value:
            return report_fault("torch_reference.py", f"covers {key} = {value}; the checkpoint "
                                f"has {cfg.get(key)}")

    if args.data is not None:
        if cfg["model"] != "lm":
            print("torch_reference.py: --data covers lm and classify checkpoints",
                  file=sys.stderr)
            return 2
        total, tokens = split_nll(params, cfg, args.data, args.split, args.device)
        nll = total / tokens
        print(f"nll {nll:.10f} ppl {math.exp(nll):.10f} bits {nll / math.log(2):.10f} "
              f"tokens {tokens}")
        return 0

    with h5_file(args.dump, "dump") as f:
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
    loss_rel = abs(float(total.detach()) - ours_loss) / max(abs(float(total.detach())), 1e-30)
    print(f"loss: torch {float(total.detach()) / tokens:.9f}, mpiformer {ours_loss / ours_tokens:.9f} "
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
    try:
        sys.exit(main(sys.argv[1:]))
    except RunError as e:  # a checkpoint, dump or shard that cannot be read
        sys.exit(report_fault("torch_reference.py", e))
