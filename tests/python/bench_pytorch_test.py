"""analysis/bench_pytorch.py --sdpa: the GPT-2 blocks on
scaled_dot_product_attention compute causal attention as written out by
hand (float64), hold as many parameters as the masked lm, and a tiny CPU run
prints its JSON line with "attention": "sdpa" ("mask" without the flag);
--sdpa is refused in one line for seq2seq, for lengths that vary and on a
PyTorch without SDPA; --output-bias false drops the vocabulary's bias alone.

Runs on the Python with torch: this one, else MPIFORMER_TORCH_PYTHON, else
.deps/torch-venv (scripts/setup --tests); everything is skipped without one.
What needs SDPA (PyTorch 2.0 or later) is skipped on an older one."""

import json
import os
import subprocess
import sys
import unittest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
SCRIPT = os.path.join(ROOT, "analysis", "bench_pytorch.py")
sys.path.insert(0, os.path.join(ROOT, "analysis"))

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    torch = None
    python = os.environ.get("MPIFORMER_TORCH_PYTHON",
                            os.path.join(ROOT, ".deps", "torch-venv", "bin", "python"))
    if os.path.exists(python) and "MPIFORMER_TORCH_PYTHON_TRIED" not in os.environ:
        os.environ["MPIFORMER_TORCH_PYTHON_TRIED"] = python  # once, not in a loop
        os.execv(python, [python] + sys.argv)

HAS_SDPA = torch is not None and hasattr(F, "scaled_dot_product_attention")
if torch is not None:
    import bench_pytorch  # noqa: E402

TINY = ["--model", "lm", "--layers", "2", "--d-model", "64", "--heads", "4", "--d-ff", "128",
        "--vocab", "100", "--max-len", "32", "--seq", "32", "--batch", "2", "--steps", "2",
        "--warmup-steps", "1", "--threads", "1", "--device", "cpu", "--precision", "fp32"]


def bench(*argv):
    return subprocess.run([sys.executable, SCRIPT, *argv], capture_output=True, text=True,
                          timeout=300)


@unittest.skipIf(torch is None, "no Python with torch")
class Refusals(unittest.TestCase):
    def refused(self, run, words):
        self.assertEqual(run.returncode, 2, run.stderr)
        self.assertEqual(run.stdout, "")
        last = run.stderr.strip().splitlines()[-1]
        self.assertTrue(last.startswith("bench_pytorch.py: error: --sdpa "), last)
        self.assertIn(words, last)

    def test_seq2seq(self):
        self.refused(bench("--model", "seq2seq", "--sdpa"), "--model lm only (got --model seq2seq)")

    def test_lengths_that_vary(self):
        self.refused(bench(*TINY, "--min-seq", "8", "--sdpa"),
                     "--min-seq 8 below --seq 32 makes the lengths vary")

    @unittest.skipIf(HAS_SDPA, "this PyTorch has scaled_dot_product_attention")
    def test_pytorch_without_sdpa(self):
        self.refused(bench(*TINY, "--sdpa"), f"PyTorch 2.0 or later; this is {torch.__version__}")


@unittest.skipUnless(HAS_SDPA, "needs PyTorch 2.0 or later (scaled_dot_product_attention)")
class Sdpa(unittest.TestCase):
    def model(self):
        torch.manual_seed(3)
        a = bench_pytorch.parse_args(TINY + ["--sdpa"])
        return a, bench_pytorch.SdpaLmModel(a).double()

    def test_blocks_match_attention_written_out(self):
        a, model = self.model()
        ids = torch.randint(6, a.vocab, (2, 11))
        B, T, d, H = 2, 11, a.d_model, a.heads
        x = model.tokens(ids) + model.positions(torch.arange(T))
        causal = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
        for block in model.blocks:
            h = F.layer_norm(x, (d,), block.norm1.weight, block.norm1.bias)
            qkv = h @ block.qkv.weight.T + block.qkv.bias
            q, k, v = (qkv[..., i * d:(i + 1) * d].reshape(B, T, H, d // H).transpose(1, 2)
                       for i in range(3))
            scores = (q @ k.transpose(-1, -2) / (d // H) ** 0.5).masked_fill(causal, float("-inf"))
            y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, d)
            x = x + y @ block.proj.weight.T + block.proj.bias
            h = F.layer_norm(x, (d,), block.norm2.weight, block.norm2.bias)
            fc, out = block.mlp[0], block.mlp[2]
            u = h @ fc.weight.T + fc.bias
            u = 0.5 * u * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (u + 0.044715 * u ** 3)))
            x = x + u @ out.weight.T + out.bias
        x = F.layer_norm(x, (d,), model.norm.weight, model.norm.bias)
        want = x @ model.tokens.weight.T + model.bias
        with torch.no_grad():
            got = model(ids)
            self.assertLess((got - want).abs().max().item(), 1e-10)
            # Causal: a later token changes no earlier position's logits.
            changed = ids.clone()
            changed[:, 7] = 5
            again = model(changed)
            self.assertTrue(torch.equal(again[:, :7], got[:, :7]))
            self.assertFalse(torch.equal(again[:, 7:], got[:, 7:]))

    def test_as_many_parameters_as_the_masked_lm(self):
        a, model = self.model()
        masked = bench_pytorch.LmModel(a)
        self.assertEqual(sum(p.numel() for p in model.parameters()),
                         sum(p.numel() for p in masked.parameters()))

    def test_equal_lengths_from_min_seq(self):
        a = bench_pytorch.parse_args(TINY + ["--min-seq", "32", "--sdpa"])
        self.assertTrue(a.sdpa)

    def test_cpu_runs_print_the_attention(self):
        lines = {}
        for attention, flags in (("sdpa", ["--sdpa"]), ("mask", [])):
            run = bench(*TINY, *flags)
            self.assertEqual(run.returncode, 0, run.stderr)
            line = json.loads(run.stdout.strip().splitlines()[-1])
            self.assertEqual(line["attention"], attention)
            self.assertEqual(line["real_tokens"], 2 * 32 * 2)
            self.assertGreater(line["tokens_per_s"], 0)
            lines[attention] = line
        self.assertEqual(lines["sdpa"].keys(), lines["mask"].keys())


@unittest.skipIf(torch is None, "no Python with torch")
class OutputBias(unittest.TestCase):
    """--output-bias false (GPT-2's head, as mpiformer's flag): the models
    lose the vocabulary's bias and nothing else, and a run still steps."""

    def test_false_drops_the_vocabulary_bias_alone(self):
        models = [(bench_pytorch.LmModel, []), (bench_pytorch.Seq2seqModel, ["--model", "seq2seq"])]
        if HAS_SDPA:
            models.append((bench_pytorch.SdpaLmModel, ["--sdpa"]))
        for model, flags in models:
            counts = {}
            for bias in ("true", "false"):
                built = model(bench_pytorch.parse_args(TINY + flags + ["--output-bias", bias]))
                counts[bias] = sum(p.numel() for p in built.parameters())
                self.assertEqual(built.bias is None, bias == "false", model.__name__)
            self.assertEqual(counts["true"] - counts["false"], 100, model.__name__)

    def test_a_run_without_it_prints_its_line(self):
        run = bench(*TINY, "--output-bias", "false")
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertGreater(json.loads(run.stdout.strip().splitlines()[-1])["tokens_per_s"], 0)


if __name__ == "__main__":
    unittest.main()
