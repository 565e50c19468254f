#!/usr/bin/env python3
"""Paper model of data-parallel step time: GPT-2-small shape, one GPU per rank,
gradients summed by bucketed ring all-reduces overlapped with backward.

    python3 analysis/scaling_model.py               # plain-text table, defaults
    python3 analysis/scaling_model.py --markdown    # the same table as Markdown
    python3 analysis/scaling_model.py --help        # every input and its default
    python3 analysis/scaling_model.py --measured bench.json --link-rate 1gbit
                                  # a bench line over a TCP link, beside the model

A model, not a measurement: compute runs at a fixed MFU, all-reduces follow
t = 2(p-1) alpha + 2(p-1)/p * S / busbw per bucket, and buckets are serialised
on one communication stream. See analysis/SCALING.md for the assumptions.
Standard library only.
"""
import argparse

MIB = 1024 * 1024

NETWORKS = ("nvlink", "ib", "hier")


def parse_args(argv=None):
    a = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    g = a.add_argument_group("model shape (default: GPT-2 small)")
    g.add_argument("--layers", type=int, default=12)
    g.add_argument("--d-model", type=int, default=768)
    g.add_argument("--heads", type=int, default=12, help="does not change counts or FLOPs")
    g.add_argument("--d-ff", type=int, default=3072)
    g.add_argument("--vocab", type=int, default=50257)
    g.add_argument("--context", type=int, default=1024,
                   help="sequence length T (learned positions, one row per position)")
    g.add_argument("--output-bias", action="store_true",
                   help="add an output bias of vocab size (mpiformer's lm has one; GPT-2 has not)")
    g = a.add_argument_group("compute")
    g.add_argument("--tokens-per-gpu", type=int, default=16 * 1024,
                   help="tokens per GPU per optimizer step (multiple of --context)")
    g.add_argument("--accum", type=int, default=1,
                   help="micro-batches per step; only the last one's backward overlaps the reduction")
    g.add_argument("--mfu", type=float, default=0.45)
    g.add_argument("--peak-tflops", type=float, default=989.0,
                   help="dense bf16 peak, H100 SXM")
    g.add_argument("--backward-share", type=float, default=2.0 / 3.0,
                   help="fraction of the step's FLOPs spent in backward")
    g.add_argument("--head-phase", choices=("flops", "none"), default="flops",
                   help="flops: backward first spends the output head's FLOP share before any "
                        "layer gradient is final; none: layer gradients spread over all of backward")
    g = a.add_argument_group("communication")
    g.add_argument("--ranks", default="8,64,512", help="comma-separated world sizes")
    g.add_argument("--networks", default="nvlink,ib,hier",
                   help="comma-separated subset of nvlink, ib, hier")
    g.add_argument("--grad-bytes", default="4,2",
                   help="comma-separated gradient element sizes (4 fp32, 2 bf16)")
    g.add_argument("--bucket-mib", type=float, default=25.0,
                   help="bucket cap in MiB (PyTorch DDP's bucket_cap_mb)")
    g.add_argument("--nvlink-busbw", type=float, default=370.0, help="GB/s, NCCL bus bandwidth")
    g.add_argument("--nvlink-alpha-us", type=float, default=3.0, help="per ring step")
    g.add_argument("--ib-busbw", type=float, default=48.0,
                   help="GB/s, NCCL bus bandwidth when every ring step crosses a 400 Gb/s NDR link")
    g.add_argument("--ib-alpha-us", type=float, default=6.0, help="per ring step")
    g.add_argument("--gpus-per-node", type=int, default=8,
                   help="hier: NVLink inside a node, IB between nodes (one NIC per GPU)")
    g = a.add_argument_group("a measured bench over one TCP link (analysis/SCALING.md)")
    g.add_argument("--measured", metavar="JSON", default="",
                   help="mpiformer bench's JSON line (ranks, allreduce_bytes, buckets, step_ms, "
                        "comm_wait_ms, comm_in_flight_ms, hidden_share): predict its exchange "
                        "from the link and print both")
    g.add_argument("--link-rate", default="1gbit",
                   help="the link's rate as tc writes it (1gbit, 500mbit): Ethernet frames")
    g.add_argument("--link-delay-us", type=float, default=0.0,
                   help="one-way delay added to the link (netem delay)")
    g.add_argument("--link-alpha-us", type=float, default=60.0,
                   help="per ring step besides the delay: TCP and MPI software on both ends")
    g.add_argument("--link-algorithm", choices=("binomial", "ring"), default="binomial",
                   help="binomial: reduce up a binomial tree, then broadcast down, each of the "
                        "whole bucket (Open MPI's libnbc MPI_Iallreduce for an in-place sum, as "
                        "mpiformer's mpi transport calls it); ring: 2(p-1)/p of it (NCCL)")
    g.add_argument("--mtu", type=int, default=1500,
                   help="the link's MTU: TCP carries MTU - 52 bytes in MTU + 14 on the wire")
    g = a.add_argument_group("output")
    g.add_argument("--target-efficiency", type=float, default=0.9,
                   help="last column: tokens per GPU needed to reach it (accum 1)")
    g.add_argument("--bucket-sweep", default="",
                   help="comma-separated bucket caps in MiB: also print the exposed ms at each")
    g.add_argument("--markdown", action="store_true", help="print the tables as Markdown")
    g.add_argument("--plot", metavar="PNG", default="",
                   help="also draw modelled efficiency against ranks (2 to 1024) for every "
                        "network and gradient width into PNG (1200x450)")
    args = a.parse_args(argv)
    args.ranks = [int(x) for x in args.ranks.split(",")]
    args.networks = [x.strip() for x in args.networks.split(",")]
    args.grad_bytes = [int(x) for x in args.grad_bytes.split(",")]
    args.bucket_sweep = [float(x) for x in args.bucket_sweep.split(",") if x.strip()]
    if any(x <= 0 for x in args.bucket_sweep):
        a.error("--bucket-sweep: caps must be positive")
    for n in args.networks:
        if n not in NETWORKS:
            a.error("--networks: %r is not one of %s" % (n, ", ".join(NETWORKS)))
    if any(p < 1 for p in args.ranks):
        a.error("--ranks: every world size must be >= 1")
    if any(b not in (1, 2, 4, 8) for b in args.grad_bytes):
        a.error("--grad-bytes: element sizes are 1, 2, 4 or 8")
    if args.tokens_per_gpu < 1 or args.accum < 1 or args.tokens_per_gpu % args.accum:
        a.error("--tokens-per-gpu must be a positive multiple of --accum")
    if not 0 < args.mfu <= 1 or not 0 < args.backward_share < 1:
        a.error("--mfu must be in (0, 1] and --backward-share in (0, 1)")
    if args.bucket_mib <= 0 or args.gpus_per_node < 1:
        a.error("--bucket-mib and --gpus-per-node must be positive")
    return args


# ---------------------------------------------------------------- parameters

def parameters(args):
    """(name, count) in registration order: embeddings, blocks, final norm, head."""
    C, F, V, T = args.d_model, args.d_ff, args.vocab, args.context
    out = [("embed.tokens", V * C), ("embed.positions", T * C)]
    for i in range(args.layers):
        p = "layer%d." % i
        out += [(p + "ln1.gamma", C), (p + "ln1.beta", C),
                (p + "attn.qkv.weight", 3 * C * C), (p + "attn.qkv.bias", 3 * C),
                (p + "attn.out.weight", C * C), (p + "attn.out.bias", C),
                (p + "ln2.gamma", C), (p + "ln2.beta", C),
                (p + "mlp.fc.weight", F * C), (p + "mlp.fc.bias", F),
                (p + "mlp.proj.weight", C * F), (p + "mlp.proj.bias", C)]
    out += [("norm.gamma", C), ("norm.beta", C)]
    if args.output_bias:
        out.append(("output.bias", V))
    return out


def is_embedding(name):
    return name.startswith("embed.")


def flops_per_token(args, params):
    """docs/DESIGN.md section 10: 6N + 12 L d T, N = non-embedding params + output projection."""
    n = sum(c for name, c in params if not is_embedding(name)) + args.vocab * args.d_model
    return n, 6.0 * n + 12.0 * args.layers * args.d_model * args.context


# ---------------------------------------------------------------- buckets

def buckets(args, params, elem_bytes):
    """Buckets in reverse registration order (the order backward finishes them),
    filled DDP-style: append a parameter, close the bucket once it reaches the cap.
    The tied token table's gradient is final only when backward ends, so it and
    the positions go last. Returns [(bytes, ready_fraction)], ready_fraction in
    [0, 1] of the overlap window measured from its start."""
    cap = args.bucket_mib * MIB
    order = [p for p in reversed(params) if not is_embedding(p[0])]
    order += [p for p in reversed(params) if is_embedding(p[0])]  # positions, then tokens
    layer_bytes = sum(c for name, c in params if not is_embedding(name)) * elem_bytes
    head = head_fraction(args) if args.head_phase == "flops" else 0.0
    out, size, ready, done = [], 0, 0.0, 0
    for name, count in order:
        size += count * elem_bytes
        if is_embedding(name):
            ready = 1.0
        else:
            done += count * elem_bytes
            ready = head + (1.0 - head) * done / layer_bytes
        if size >= cap:
            out.append((size, ready))
            size = 0
    if size:
        out.append((size, ready))
    return out


def head_fraction(args):
    """Share of backward spent on the output projection before any layer gradient
    is final: its 6 V d of the per-token 6N + 12 L d T (same share in backward)."""
    params = parameters(args)
    _, f = flops_per_token(args, params)
    return 6.0 * args.vocab * args.d_model / f


# ---------------------------------------------------------------- all-reduce

def ring(nbytes, p, busbw_gbs, alpha_us):
    """NCCL ring all-reduce: 2(p-1) steps of latency alpha, 2(p-1)/p * S at busbw."""
    if p <= 1:
        return 0.0
    return 2 * (p - 1) * alpha_us * 1e-6 + 2.0 * (p - 1) / p * nbytes / (busbw_gbs * 1e9)


def allreduce_time(args, network, nbytes, p):
    if network == "nvlink":
        return ring(nbytes, p, args.nvlink_busbw, args.nvlink_alpha_us)
    if network == "ib":
        return ring(nbytes, p, args.ib_busbw, args.ib_alpha_us)
    # hier: reduce-scatter inside the node, all-reduce of the 1/g shard between
    # nodes (each GPU on its own NIC), all-gather inside the node; stages serial.
    g = min(args.gpus_per_node, p)
    nodes = p // g
    # reduce-scatter + all-gather inside the node cost one intra-node ring all-reduce
    intra = ring(nbytes, g, args.nvlink_busbw, args.nvlink_alpha_us)
    inter = ring(nbytes / g, nodes, args.ib_busbw, args.ib_alpha_us)
    return intra + inter


# ---------------------------------------------------------------- step

def step(args, network, p, elem_bytes, tokens_per_gpu):
    params = parameters(args)
    _, fpt = flops_per_token(args, params)
    compute = fpt * tokens_per_gpu / (args.mfu * args.peak_tflops * 1e12)
    window = args.backward_share * compute / args.accum  # last micro-batch's backward
    free, total = 0.0, 0.0  # comm stream free at; sum of all-reduce times
    bl = buckets(args, params, elem_bytes)
    for nbytes, ready in bl:
        t = allreduce_time(args, network, nbytes, p)
        free = max(free, ready * window) + t
        total += t
    exposed = max(0.0, free - window)
    emb = allreduce_time(args, network, bl[-1][0], p)
    s = compute + exposed
    return {"compute": compute, "allreduce": total, "exposed": exposed, "emb": emb,
            "step": s, "eff": compute / s, "job_tps": p * tokens_per_gpu / s,
            "buckets": len(bl), "window": window}


def tokens_for(args, network, p, elem_bytes, target):
    """Smallest tokens per GPU (whole sequences, accum 1) reaching `target` efficiency."""
    saved, args.accum = args.accum, 1
    try:
        def eff(seqs):
            return step(args, network, p, elem_bytes, seqs * args.context)["eff"]
        hi = 1
        while eff(hi) < target:
            hi *= 2
            if hi > 1 << 24:
                return None
        lo = hi // 2
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if eff(mid) >= target:
                hi = mid
            else:
                lo = mid
        return hi * args.context
    finally:
        args.accum = saved


# ---------------------------------------------------------------- output

def fmt_int(n):
    return "{:,}".format(n)


def fmt_tokens(n):
    if n is None:
        return "-"
    if n >= 1 << 20:
        return "%.1fM" % (n / float(1 << 20))
    return "%dk" % (n // 1024)


def fmt_rate(x):
    return "%.2fM" % (x / 1e6) if x < 1e9 else "%.2fG" % (x / 1e9)


def network_label(args, network, p):
    if network == "nvlink":
        return "NVLink%s" % ("" if p <= args.gpus_per_node else "*")
    if network == "ib":
        return "IB"
    return "NVL+IB"


def cases(args):
    for p in args.ranks:
        for network in args.networks:
            if network == "hier" and p <= args.gpus_per_node:
                continue  # one node: the same as nvlink
            if network == "hier" and p % args.gpus_per_node:
                continue
            for b in args.grad_bytes:
                yield p, network, b


def grad_label(b):
    return {4: "fp32", 2: "bf16", 8: "int64"}.get(b, "%dB" % b)


def rows(args):
    out = []
    for p, network, b in cases(args):
        r = step(args, network, p, b, args.tokens_per_gpu)
        need = tokens_for(args, network, p, b, args.target_efficiency)
        out.append([str(p), network_label(args, network, p), grad_label(b), str(r["buckets"]),
                    "%.2f" % (r["compute"] * 1e3), "%.2f" % (r["allreduce"] * 1e3),
                    "%.2f" % (r["emb"] * 1e3), "%.2f" % (r["exposed"] * 1e3),
                    "%.2f" % (r["step"] * 1e3), "%.1f%%" % (100 * r["eff"]),
                    fmt_rate(r["job_tps"]), fmt_tokens(need)])
    return out


def sweep(args):
    """Exposed ms for each bucket cap of --bucket-sweep, and the best cap."""
    head = ["p", "network", "grad"] + ["%g MiB" % c for c in args.bucket_sweep] + ["best"]
    body, saved = [], args.bucket_mib
    try:
        for p, network, b in cases(args):
            exposed = []
            for cap in args.bucket_sweep:
                args.bucket_mib = cap
                exposed.append(step(args, network, p, b, args.tokens_per_gpu)["exposed"] * 1e3)
            best = min(range(len(exposed)), key=lambda i: exposed[i])
            body.append([str(p), network_label(args, network, p), grad_label(b)]
                        + ["%.2f" % e for e in exposed] + ["%g MiB" % args.bucket_sweep[best]])
    finally:
        args.bucket_mib = saved
    return head, body


def header(args):
    return ["p", "network", "grad", "bkts", "compute ms", "all-reduce ms", "emb-bkt ms",
            "exposed ms", "step ms", "eff", "job tok/s",
            "tok/GPU@%d%%" % round(100 * args.target_efficiency)]


def table_text(head, body):
    w = [max(len(r[i]) for r in [head] + body) for i in range(len(head))]
    line = lambda r: "  ".join(c.ljust(w[i]) if i < 3 else c.rjust(w[i]) for i, c in enumerate(r))
    return "\n".join([line(head), "  ".join("-" * x for x in w)] + [line(r) for r in body])


def table_markdown(head, body):
    align = ["---" if i < 3 else "---:" for i in range(len(head))]
    return "\n".join("| " + " | ".join(r) + " |" for r in [head, align] + body)


def summary(args):
    params = parameters(args)
    total = sum(c for _, c in params)
    table = dict(params)["embed.tokens"]
    n, fpt = flops_per_token(args, params)
    nonemb = sum(c for name, c in params if not is_embedding(name))
    compute = fpt * args.tokens_per_gpu / (args.mfu * args.peak_tflops * 1e12)
    lines = [
        "shape: L %d, d %d, heads %d, d_ff %d, V %d, T %d; tied embeddings, learned positions%s"
        % (args.layers, args.d_model, args.heads, args.d_ff, args.vocab, args.context,
           ", output bias" if args.output_bias else ""),
        "parameters: %s = token table %s (%.1f%%) + positions %s + non-embedding %s"
        % (fmt_int(total), fmt_int(table), 100.0 * table / total,
           fmt_int(dict(params)["embed.positions"]), fmt_int(nonemb)),
        "FLOPs/token: 6N + 12LdT = 6 x %s + %s = %s (N: non-embedding + output proj.)"
        % (fmt_int(n), fmt_int(12 * args.layers * args.d_model * args.context), fmt_int(int(fpt))),
        "compute: %s tokens/GPU/step in %d micro-batch%s, %.0f%% of %.0f TFLOP/s: %.2f ms"
        % (fmt_int(args.tokens_per_gpu), args.accum, "es" if args.accum > 1 else "",
           100 * args.mfu, args.peak_tflops, compute * 1e3),
        "backward: %.2f ms (%.3f of compute); output head first: %.1f%% of it (--head-phase %s)"
        % (args.backward_share * compute * 1e3, args.backward_share, 100 * head_fraction(args),
           args.head_phase),
    ]
    for b in args.grad_bytes:
        bl = buckets(args, params, b)
        lines.append("%s gradients: %.1f MB in %d buckets (cap %g MiB); last one %.1f MB"
                     " (token table, positions)" % (grad_label(b), total * b / 1e6, len(bl),
                                                    args.bucket_mib, bl[-1][0] / 1e6))
    lines += [
        "NVLink: ring, busbw %g GB/s, alpha %g us; IB: ring, busbw %g GB/s, alpha %g us"
        % (args.nvlink_busbw, args.nvlink_alpha_us, args.ib_busbw, args.ib_alpha_us),
        "NVL+IB: %d GPUs/node on NVLink; reduce-scatter in node, IB ring of the 1/%d shard"
        " across nodes (a NIC per GPU), all-gather in node" % (args.gpus_per_node, args.gpus_per_node),
        "NVLink*: all ranks in one NVLink domain, hypothetical beyond %d GPUs" % args.gpus_per_node,
        "exposed = last bucket done - backward done; step = compute + exposed; eff = compute/step",
    ]
    return lines


def plot(args, path):
    """Efficiency against ranks, one panel per network, a line per gradient width."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ranks = [2 ** k for k in range(1, 11)]
    fig, axes = plt.subplots(1, len(args.networks), figsize=(12, 4.5), dpi=100, sharey=True,
                             squeeze=False)
    for ax, network in zip(axes[0], args.networks):
        for b in args.grad_bytes:
            eff = [100 * step(args, network, p, b, args.tokens_per_gpu)["eff"] for p in ranks]
            ax.plot(ranks, eff, marker="o", label="%s gradients" % grad_label(b))
        ax.set_xscale("log", base=2)
        ax.set_xlabel("ranks (GPUs)")
        ax.set_title(network_label(args, network, max(ranks)).rstrip("*") + " (modelled)")
        ax.axhline(100 * args.target_efficiency, color="grey", linewidth=0.8, linestyle="--")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("efficiency: compute / step (%)")
    fig.suptitle("%s tokens per GPU per step, bucket cap %g MiB"
                 % (fmt_int(args.tokens_per_gpu), args.bucket_mib))
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return len(ranks) * len(args.networks) * len(args.grad_bytes)


# ---------------------------------------------------------------- one TCP link

def parse_rate(text):
    """tc's rate syntax (bit/s): 1gbit, 500mbit, 100kbit, 1e9."""
    units = {"gbit": 1e9, "mbit": 1e6, "kbit": 1e3, "bit": 1.0}
    t = text.strip().lower()
    for unit, scale in units.items():
        if t.endswith(unit):
            return float(t[:-len(unit)]) * scale
    return float(t)


def link_prediction(args, bench):
    """The exchange of one bench step over the link: equal buckets, each an
    all-reduce (--link-algorithm) at the link's TCP payload rate; backward (a
    share of the step less its exposed wait) finishes them at a uniform rate;
    one stream that progresses in the background."""
    p, nbytes, n = bench["ranks"], bench["allreduce_bytes"], max(1, bench["buckets"])
    # TCP with timestamps carries MTU - 52 bytes in a frame of MTU + 14 (tbf counts the header).
    payload_bps = parse_rate(args.link_rate) * (args.mtu - 52) / (args.mtu + 14) / 8.0
    alpha = (args.link_delay_us + args.link_alpha_us) * 1e-6
    if args.link_algorithm == "binomial":
        rounds = 2 * max(1, (p - 1).bit_length())  # ceil(log2 p) up, as many down
        per_bucket = rounds * (alpha + (nbytes / n) / payload_bps)
    else:
        per_bucket = 2 * (p - 1) * alpha + 2.0 * (p - 1) / p * (nbytes / n) / payload_bps
    compute = (bench["step_ms"] - bench["comm_wait_ms"]) * 1e-3
    window = args.backward_share * compute
    free = 0.0
    for k in range(1, n + 1):
        free = max(free, window * k / n) + per_bucket
    total = n * per_bucket
    exposed = max(0.0, free - window)
    return {"in_flight_ms": total * 1e3, "exposed_ms": exposed * 1e3,
            "hidden_share": (total - exposed) / total if total > 0 else 0.0,
            "payload_gbps": payload_bps * 8 / 1e9}


def measured_line(args):
    import json
    with open(args.measured) as f:
        bench = json.loads(f.readline())
    for key in ("ranks", "allreduce_bytes", "buckets", "step_ms", "comm_wait_ms",
                "comm_in_flight_ms", "hidden_share"):
        if key not in bench:
            raise SystemExit("scaling_model.py: --measured: %s has no %s: not a bench line of "
                             "mpirun -np 2 or more" % (args.measured, key))
    if bench["ranks"] < 2:
        raise SystemExit("scaling_model.py: --measured: %s is a bench of 1 rank: nothing is "
                         "exchanged" % args.measured)
    m = link_prediction(args, bench)
    head = ["link", "ranks", "MB/step", "bkts", "step ms", "exchange ms meas.", "pred.",
            "meas./pred.", "exposed ms meas.", "pred.", "hidden meas.", "pred."]
    row = ["%s (+%g us), %s" % (args.link_rate, args.link_delay_us, args.link_algorithm),
           str(bench["ranks"]),
           "%.2f" % (bench["allreduce_bytes"] / 1e6), str(bench["buckets"]),
           "%.1f" % bench["step_ms"], "%.1f" % bench["comm_in_flight_ms"],
           "%.1f" % m["in_flight_ms"], "%.2f" % (bench["comm_in_flight_ms"] / m["in_flight_ms"]),
           "%.1f" % bench["comm_wait_ms"], "%.1f" % m["exposed_ms"],
           "%.0f%%" % (100 * bench["hidden_share"]), "%.0f%%" % (100 * m["hidden_share"])]
    return head, [row]


def main():
    args = parse_args()
    if args.measured:
        head, body = measured_line(args)
        print(table_markdown(head, body) if args.markdown else table_text(head, body))
        return
    body = rows(args)
    if args.markdown:
        print("\n".join("- " + s for s in summary(args)))
        print()
        print(table_markdown(header(args), body))
    else:
        print("\n".join(summary(args)))
        print()
        print(table_text(header(args), body))
    if args.bucket_sweep:
        head, sbody = sweep(args)
        print()
        print("exposed ms by bucket cap:")
        print(table_markdown(head, sbody) if args.markdown else table_text(head, sbody))
    if args.plot:
        points = plot(args, args.plot)
        print()
        print("wrote %s (%d modelled points)" % (args.plot, points))


if __name__ == "__main__":
    main()
