"""analysis/plot_scaling.py on `mpiformer bench` lines written by hand in
the bench's own format (the field names are checked against
src/app/bench.cpp): series, medians of repeated runs, weak-scaling
efficiency, the lines it passes over or refuses, and the command line."""

import math
import os
import re
import struct
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
ANALYSIS = os.path.join(ROOT, "analysis")
sys.path.insert(0, ANALYSIS)
import plot_scaling  # noqa: E402

# As `mpiformer bench` prints them (one per run), figures made up.
LINE = ('{{"model": "{model}", "device": "cpu", "ranks": {ranks}, "threads": 1, '
        '"batches": "synthetic", "batch": 4, "seq": 16, "real_tokens": {real}, '
        '"padded_tokens": {real}, "target_tokens": {real}, "batch_shapes": 1, '
        '"startup_seconds": 0.012, "precision": "fp32", '
        '"recompute": "none", "parameters": {params}, "tokens_per_s": {speed}, "step_ms": {step_ms}, "mfu": 0.1330, '
        '"peak_flops": 7.825e+10, "peak_mem_bytes": 27201536, "allocated_bytes": 388708, '
        '"allreduce_bytes": {bytes}, "buckets": {buckets}, "comm_wait_ms": {wait}, '
        '"comm_in_flight_ms": {wait}, '
        '"hidden_share": {hidden}, "transport": "{transport}", "blas": "OpenBLAS 0.3.21", '
        '"blas_core": "Haswell"}}')
# What only a GPU's line has (a CPU's line has the BLAS fields instead).
GPU_ONLY = {"attention", "attention_calls_cudnn", "attention_calls_plain", "attention_fallbacks",
            "attention_graphs", "kernel_switches", "gemm_search", "attention_search", "gemm_unfused",
            "candidate_calls"}
# Inside "profile_ms", with --profile.
PROFILE_ONLY = {"profile_ms", "other"}


def bench_line(model="lm", ranks=1, speed=1000.0, wait=0.0, hidden=0.0, params=10176):
    return LINE.format(model=model, ranks=ranks, real=64 * ranks, params=params, speed=speed,
                       step_ms=64 * ranks / speed * 1000, bytes=0 if ranks == 1 else 40704,
                       buckets=0 if ranks == 1 else 1, wait=wait, hidden=hidden,
                       transport="none" if ranks == 1 else "mpi")


class BenchFields(unittest.TestCase):
    def test_the_fields_read_are_the_bench_json_fields(self):
        with open(os.path.join(ROOT, "src", "app", "bench.cpp"), encoding="utf-8") as f:
            source = f.read()
        # Written out, or through bench.cpp's text_field (a field left out when empty).
        printed = set(re.findall(r'\\"([a-z_]+)\\": ', source)) | set(
            re.findall(r'text_field\("([a-z_]+)"', source))
        used = set(plot_scaling.REQUIRED) | set(plot_scaling.SERIES_FIELDS) | {
            "step_ms", "comm_wait_ms", "hidden_share"}
        self.assertTrue(used <= printed, f"not printed by bench: {sorted(used - printed)}")
        # The hand-made lines here hold every field bench prints on a CPU.
        self.assertTrue(GPU_ONLY <= printed, f"not printed by bench: {sorted(GPU_ONLY - printed)}")
        self.assertEqual(set(re.findall(r'"([a-z_]+)": ', bench_line())),
                         printed - PROFILE_ONLY - GPU_ONLY)


class Summaries(unittest.TestCase):
    def test_series_medians_and_efficiency(self):
        lines = [
            bench_line(ranks=1, speed=1000.0),
            bench_line(ranks=2, speed=1500.0, wait=0.5, hidden=0.2),
            bench_line(ranks=2, speed=1700.0, wait=0.3, hidden=0.4),
            bench_line(ranks=2, speed=1900.0, wait=0.4, hidden=0.6),
            bench_line(ranks=4, speed=3000.0, wait=1.0, hidden=0.5),
            bench_line(model="seq2seq", params=23072, ranks=2, speed=800.0, wait=2.0, hidden=0.1),
            bench_line(model="seq2seq", params=23072, ranks=4, speed=1200.0, wait=3.0, hidden=0.3),
        ]
        records = plot_scaling.parse_lines(["mpirun noise", ""] + lines, "test")
        self.assertEqual(len(records), 7)
        series = plot_scaling.summarize(records)
        self.assertEqual(list(series), ["lm cpu fp32 10,176 params batch 4 seq 16",
                                        "seq2seq cpu fp32 23,072 params batch 4 seq 16"])
        lm, s2s = series.values()
        self.assertEqual([r["ranks"] for r in lm], [1, 2, 4])
        self.assertEqual([r["runs"] for r in lm], [1, 3, 1])
        self.assertEqual(lm[1]["tokens_per_s"], 1700.0)  # the median of three runs
        self.assertAlmostEqual(lm[1]["comm_wait_ms"], 0.4)
        self.assertAlmostEqual(lm[1]["hidden_share"], 0.4)
        self.assertEqual([round(r["efficiency"], 12) for r in lm], [1.0, 0.85, 0.75])
        # A series starting at 2 ranks is measured against its own per-rank speed.
        self.assertEqual([round(r["efficiency"], 12) for r in s2s], [1.0, 0.75])
        text = plot_scaling.table(series)
        self.assertIn("      2    3       1700.0        850.0      85.0%", text)
        self.assertIn("      1    1       1000.0       1000.0     100.0%", text)

    def test_by_splits_or_merges_series(self):
        records = plot_scaling.parse_lines(
            [bench_line(ranks=1), bench_line(model="mlm", ranks=2, speed=1800.0)], "test")
        self.assertEqual(len(plot_scaling.summarize(records)), 2)
        merged = plot_scaling.summarize(records, ("device",))
        self.assertEqual(list(merged), ["cpu"])
        self.assertEqual([round(r["efficiency"], 12) for r in merged["cpu"]], [1.0, 0.9])

    def test_a_line_without_comm_wait_still_plots_speed(self):
        line = bench_line(ranks=2).replace(', "comm_wait_ms": 0.0', "")
        rows = plot_scaling.summarize(plot_scaling.parse_lines([line], "old"))
        row = next(iter(rows.values()))[0]
        self.assertTrue(math.isnan(row["comm_wait_ms"]))
        self.assertEqual(row["tokens_per_s"], 1000.0)


class Refusals(unittest.TestCase):
    def refused(self, lines, needle):
        with self.assertRaises(plot_scaling.InputError) as caught:
            plot_scaling.parse_lines(lines, "bench.jsonl")
        self.assertIn(needle, str(caught.exception))

    def test_bad_lines(self):
        self.refused(["", '{"ranks": 1, '], "bench.jsonl:2: not a JSON line")
        self.refused(['{"model": "lm", "tokens_per_s": 5}'],
                     "bench.jsonl:1: not an `mpiformer bench` line (no ranks)")
        self.refused(['{"ranks": "two", "tokens_per_s": 5}'], "must be numbers")
        self.refused(['{"ranks": 0, "tokens_per_s": 5}'], "ranks 0 (must be >= 1)")


class CommandLine(unittest.TestCase):
    def run_script(self, *args, stdin=""):
        return subprocess.run([sys.executable, os.path.join(ANALYSIS, "plot_scaling.py"), *args],
                              input=stdin, capture_output=True, text=True)

    def test_files_and_stdin(self):
        with tempfile.TemporaryDirectory() as d:
            lines = "\n".join([bench_line(ranks=1), bench_line(ranks=2, speed=1800.0, wait=0.2,
                                                                hidden=0.5)]) + "\n"
            path, png = os.path.join(d, "bench.jsonl"), os.path.join(d, "scaling.png")
            with open(path, "w") as f:
                f.write(lines)
            done = self.run_script(path, "-o", png)
            self.assertEqual(done.returncode, 0, done.stderr)
            self.assertIn("wrote " + png + " (2 bench line(s), 1 series)", done.stdout)
            with open(png, "rb") as f:
                head = f.read(24)
            self.assertEqual(head[:8], b"\x89PNG\r\n\x1a\n")
            self.assertEqual(struct.unpack(">II", head[16:24]), (1500, 450))
            os.remove(png)
            done = self.run_script("-o", png, stdin=lines)
            self.assertEqual(done.returncode, 0, done.stderr)
            self.assertIn("     90.0%", done.stdout)
            self.assertTrue(os.path.isfile(png))

    def test_refusals_are_one_line_with_exit_code_2(self):
        with tempfile.TemporaryDirectory() as d:
            png = os.path.join(d, "x.png")
            for args, stdin, needle in (
                    ([os.path.join(d, "missing.jsonl")], "", "missing.jsonl: cannot read"),
                    ([], "no json here\n", "no `mpiformer bench` line in <stdin>"),
                    (["-"], '{"ranks": 2}\n', "<stdin>:1: not an `mpiformer bench` line")):
                done = self.run_script(*args, "-o", png, stdin=stdin)
                self.assertEqual(done.returncode, 2, done.stderr)
                self.assertEqual(done.stderr.count("\n"), 1, done.stderr)
                self.assertIn(needle, done.stderr)
                self.assertFalse(os.path.exists(png))


if __name__ == "__main__":
    unittest.main()
