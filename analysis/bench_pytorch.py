#!/usr/bin/env python3
"""The reference side of `scripts/bench-cpu` and `scripts/gpu-check`: the
same model shapes as `mpiformer bench`, trained with PyTorch (AdamW, label
smoothing, padding masks), timed after warm-up steps. Prints one JSON line in
the same fields.

    bench_pytorch.py --model lm --layers 4 --d-model 256 --heads 4 --d-ff 1024 \
        --vocab 8192 --batch 8 --seq 256 --threads 2
    bench_pytorch.py ... --device cuda --precision bf16 --compile   # a GPU, autocast, inductor
    bench_pytorch.py --model lm ... --sdpa   # GPT-2-style blocks on scaled_dot_product_attention

--sdpa (lm only, equal lengths: it takes no padding mask) writes the blocks
out with F.scaled_dot_product_attention(is_causal=True), so PyTorch may pick
its flash kernels; without it attention runs nn.TransformerEncoderLayer's
with a causal and a padding mask. The JSON line says which ("attention").
"""
import argparse
import json
import resource
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class LmModel(nn.Module):
    """GPT-style decoder: learned positions, pre-LN blocks, tied output."""

    def __init__(self, a):
        super().__init__()
        self.tokens = nn.Embedding(a.vocab, a.d_model)
        self.positions = nn.Embedding(max(a.seq, a.max_len), a.d_model)
        layer = nn.TransformerEncoderLayer(a.d_model, a.heads, a.d_ff, dropout=0.0,
                                           activation="gelu", batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, a.layers)
        self.norm = nn.LayerNorm(a.d_model)
        self.bias = output_bias(a)

    def forward(self, ids, pad_mask):
        T = ids.shape[1]
        x = self.tokens(ids) + self.positions(torch.arange(T, device=ids.device))
        causal = torch.triu(torch.full((T, T), float("-inf"), device=ids.device), diagonal=1)
        x = self.norm(self.blocks(x, mask=causal, src_key_padding_mask=pad_mask))
        return F.linear(x, self.tokens.weight, self.bias)


class SdpaBlock(nn.Module):
    """A GPT-2 block: pre-LN, one qkv projection, causal SDPA, tanh GELU."""

    def __init__(self, d_model, heads, d_ff):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, d_ff), nn.GELU(approximate="tanh"),
                                 nn.Linear(d_ff, d_model))

    def forward(self, x):
        B, T, d = x.shape
        # (B, T, 3d) -> three of (B, H, T, D)
        q, k, v = self.qkv(self.norm1(x)).view(B, T, 3, self.heads, d // self.heads).permute(
            2, 0, 3, 1, 4).unbind(0)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, d))
        return x + self.mlp(self.norm2(x))


class SdpaLmModel(nn.Module):
    """LmModel's shape on SdpaBlock: no padding mask, so equal lengths only."""

    def __init__(self, a):
        super().__init__()
        self.tokens = nn.Embedding(a.vocab, a.d_model)
        self.positions = nn.Embedding(max(a.seq, a.max_len), a.d_model)
        self.blocks = nn.ModuleList(SdpaBlock(a.d_model, a.heads, a.d_ff) for _ in range(a.layers))
        self.norm = nn.LayerNorm(a.d_model)
        self.bias = output_bias(a)

    def forward(self, ids):
        x = self.tokens(ids) + self.positions(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = block(x)
        return F.linear(self.norm(x), self.tokens.weight, self.bias)


class Seq2seqModel(nn.Module):
    """Encoder-decoder with cross-attention, pre-LN, shared tied embeddings."""

    def __init__(self, a):
        super().__init__()
        self.tokens = nn.Embedding(a.vocab, a.d_model)
        self.positions = nn.Embedding(max(a.seq, a.src_seq, a.max_len), a.d_model)
        self.transformer = nn.Transformer(a.d_model, a.heads, a.enc_layers, a.dec_layers, a.d_ff,
                                          dropout=0.0, activation="gelu", batch_first=True,
                                          norm_first=True)
        self.bias = output_bias(a)

    def embed(self, ids):
        return self.tokens(ids) + self.positions(torch.arange(ids.shape[1], device=ids.device))

    def forward(self, src, src_pad, tgt, tgt_pad):
        T = tgt.shape[1]
        causal = self.transformer.generate_square_subsequent_mask(T).to(tgt.device)
        x = self.transformer(self.embed(src), self.embed(tgt), tgt_mask=causal,
                             src_key_padding_mask=src_pad, tgt_key_padding_mask=tgt_pad,
                             memory_key_padding_mask=src_pad)
        return F.linear(x, self.tokens.weight, self.bias)


def output_bias(a):
    """The vocabulary projection's bias, or None with --output-bias false
    (GPT-2 has none)."""
    return nn.Parameter(torch.zeros(a.vocab)) if a.output_bias == "true" else None


def padded_batch(lengths, vocab, generator):
    """Random symbols, right-padded with id 0; returns ids and the pad mask."""
    T = max(lengths)
    ids = torch.randint(6, vocab, (len(lengths), T), generator=generator)
    pad = torch.arange(T)[None, :] >= torch.tensor(lengths)[:, None]
    return ids.masked_fill(pad, 0), pad


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", choices=["lm", "seq2seq"], required=True)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--enc-layers", type=int, default=3)
    p.add_argument("--dec-layers", type=int, default=3)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--d-ff", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--min-seq", type=int, default=0)
    p.add_argument("--max-len", type=int, default=0,
                   help="rows of the position table (default: the longest sequence)")
    p.add_argument("--src-seq", type=int, default=0)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup-steps", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--label-smoothing", type=float, default=0.1)
    p.add_argument("--output-bias", choices=["true", "false"], default="true",
                   help="a bias on the vocabulary projection, as mpiformer's flag (false: GPT-2's)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                   help="bf16: autocast (fp32 master weights, as mpiformer)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--sdpa", action="store_true",
                   help="lm only, equal lengths: GPT-2 blocks on F.scaled_dot_product_attention")
    a = p.parse_args(argv)
    a.src_seq = a.src_seq or a.seq
    if a.sdpa and a.model != "lm":
        p.error(f"--sdpa is for --model lm only (got --model {a.model})")
    if a.sdpa and 0 < a.min_seq < a.seq:
        p.error(f"--sdpa takes no padding mask, so every sequence needs --seq's length: "
                f"--min-seq {a.min_seq} below --seq {a.seq} makes the lengths vary")
    if a.sdpa and not hasattr(F, "scaled_dot_product_attention"):
        p.error(f"--sdpa needs torch.nn.functional.scaled_dot_product_attention "
                f"(PyTorch 2.0 or later; this is {torch.__version__})")
    return a


def main():
    a = parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    g = torch.Generator().manual_seed(a.seed)

    def lengths(longest):
        if a.min_seq <= 0:
            return [longest] * a.batch
        return torch.randint(a.min_seq, longest + 1, (a.batch,), generator=g).tolist()

    if a.model == "lm":
        model = SdpaLmModel(a) if a.sdpa else LmModel(a)
        ids, pad = padded_batch(lengths(a.seq), a.vocab, g)
        targets = torch.randint(6, a.vocab, ids.shape, generator=g).masked_fill(pad, 0)
        inputs = (ids,) if a.sdpa else (ids, pad)  # --sdpa: no padding (parse_args)
        real_tokens = int((~pad).sum())
    else:
        model = Seq2seqModel(a)
        src, src_pad = padded_batch(lengths(a.src_seq), a.vocab, g)
        tgt, tgt_pad = padded_batch(lengths(a.seq), a.vocab, g)
        targets = torch.randint(6, a.vocab, tgt.shape, generator=g).masked_fill(tgt_pad, 0)
        inputs = (src, src_pad, tgt, tgt_pad)
        real_tokens = int((~src_pad).sum() + (~tgt_pad).sum())
    device = torch.device(a.device)
    model = model.to(device)
    inputs = tuple(t.to(device) for t in inputs)
    targets = targets.to(device)
    # The fused CUDA AdamW (one kernel per step, like mpiformer's) where it exists.
    fused = {"fused": True} if a.device == "cuda" else {}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0, **fused)
    forward = torch.compile(model) if a.compile else model

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(a.device, dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            logits = forward(*inputs)
            loss = F.cross_entropy(logits.reshape(-1, a.vocab).float(), targets.reshape(-1),
                                   ignore_index=0, label_smoothing=a.label_smoothing)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()

    def synchronize():
        if a.device == "cuda":
            torch.cuda.synchronize()

    for _ in range(a.warmup_steps):
        step()
    synchronize()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    synchronize()
    step_s = (time.perf_counter() - t0) / a.steps
    name = f"pytorch-{a.device} {torch.__version__} {a.precision}" + (" compiled" if a.compile else "")
    print(json.dumps({
        "model": a.model, "device": name, "threads": a.threads,
        "attention": "sdpa" if a.sdpa else "mask",
        "batch": a.batch, "seq": a.seq, "real_tokens": real_tokens * a.steps,  # the timed steps
        "tokens_per_s": round(real_tokens / step_s, 1), "step_ms": round(1000 * step_s, 2),
        "peak_mem_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "allocated_bytes": torch.cuda.max_memory_allocated() if a.device == "cuda" else 0,
    }))


if __name__ == "__main__":
    main()
