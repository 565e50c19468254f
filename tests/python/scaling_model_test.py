"""analysis/scaling_model.py --measured: the prediction of one bench step's
exchange over a TCP link of known rate (analysis/SCALING.md, last section),
worked here by hand from the bytes, the buckets and the rate; tc's rate
syntax; the bench lines it refuses."""

import json
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
SCRIPT = os.path.join(ROOT, "analysis", "scaling_model.py")
sys.path.insert(0, os.path.join(ROOT, "analysis"))
import scaling_model  # noqa: E402

# The fields --measured reads, as `mpiformer bench` prints them on 2 ranks.
BENCH = {"model": "lm", "device": "cpu", "ranks": 2, "allreduce_bytes": 8_000_000, "buckets": 4,
         "step_ms": 200.0, "comm_wait_ms": 50.0, "comm_in_flight_ms": 120.0,
         "hidden_share": 0.4, "transport": "mpi"}


def args(*argv):
    return scaling_model.parse_args(list(argv))


def tcp_bytes_per_s(bits_per_s, mtu=1500):
    # TCP with timestamps: MTU - 52 bytes of payload in MTU + 14 bytes on the wire.
    return bits_per_s * (mtu - 52) / (mtu + 14) / 8


class Rates(unittest.TestCase):
    def test_tc_rate_syntax(self):
        self.assertEqual(scaling_model.parse_rate("1gbit"), 1e9)
        self.assertEqual(scaling_model.parse_rate("100mbit"), 1e8)
        self.assertEqual(scaling_model.parse_rate("2.5Gbit"), 2.5e9)
        self.assertEqual(scaling_model.parse_rate("64kbit"), 64e3)
        self.assertEqual(scaling_model.parse_rate("1e9"), 1e9)
        with self.assertRaises(ValueError):
            scaling_model.parse_rate("fast")


class Prediction(unittest.TestCase):
    def test_binomial_on_two_ranks_sends_each_bucket_there_and_back(self):
        m = scaling_model.link_prediction(args("--link-rate", "1gbit"), BENCH)
        bucket = 8_000_000 / 4
        per_bucket = 2 * (60e-6 + bucket / tcp_bytes_per_s(1e9))
        self.assertAlmostEqual(m["in_flight_ms"], 4 * per_bucket * 1e3, places=9)
        self.assertAlmostEqual(m["payload_gbps"], 1448 / 1514, places=12)

    def test_more_ranks_add_rounds_to_the_tree_and_steps_to_the_ring(self):
        for ranks, rounds in ((3, 4), (4, 4), (5, 6), (8, 6)):
            bench = dict(BENCH, ranks=ranks)
            tree = scaling_model.link_prediction(args("--link-alpha-us", "0"), bench)
            ring = scaling_model.link_prediction(
                args("--link-alpha-us", "0", "--link-algorithm", "ring"), bench)
            wire = 8_000_000 / tcp_bytes_per_s(1e9) * 1e3
            self.assertAlmostEqual(tree["in_flight_ms"], rounds * wire, places=6)
            self.assertAlmostEqual(ring["in_flight_ms"], 2 * (ranks - 1) / ranks * wire, places=6)

    def test_delay_adds_to_every_round(self):
        plain = scaling_model.link_prediction(args(), BENCH)
        delayed = scaling_model.link_prediction(args("--link-delay-us", "500"), BENCH)
        # 4 buckets x 2 rounds x 500 us.
        self.assertAlmostEqual(delayed["in_flight_ms"] - plain["in_flight_ms"], 4.0, places=9)

    def test_a_slow_link_hides_little_a_fast_one_hides_most(self):
        window_ms = 2 / 3 * (BENCH["step_ms"] - BENCH["comm_wait_ms"])  # backward: 100 ms
        slow = scaling_model.link_prediction(args("--link-rate", "10mbit"), BENCH)
        fast = scaling_model.link_prediction(args("--link-rate", "100gbit"), BENCH)
        # Slow: the buckets queue behind one another; all but the first
        # bucket's wait inside backward is exposed.
        per_bucket = slow["in_flight_ms"] / 4
        self.assertAlmostEqual(slow["exposed_ms"], window_ms / 4 + 4 * per_bucket - window_ms,
                               places=6)
        self.assertLess(slow["hidden_share"], 0.1)
        # Fast: only the last bucket, sent when backward ends, is exposed.
        self.assertAlmostEqual(fast["exposed_ms"], fast["in_flight_ms"] / 4, places=9)
        self.assertAlmostEqual(fast["hidden_share"], 0.75, places=9)


class CommandLine(unittest.TestCase):
    def run_with(self, bench, *argv):
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            f.write(json.dumps(bench) + "\n")
        try:
            return subprocess.run([sys.executable, SCRIPT, "--measured", f.name, *argv],
                                  capture_output=True, text=True)
        finally:
            os.unlink(f.name)

    def test_the_measured_line_beside_the_prediction(self):
        out = self.run_with(BENCH, "--link-rate", "1gbit", "--markdown")
        self.assertEqual(out.returncode, 0, out.stderr)
        rows = [line for line in out.stdout.splitlines() if line.startswith("| 1gbit")]
        self.assertEqual(len(rows), 1, out.stdout)
        cells = [c.strip() for c in rows[0].strip("|").split("|")]
        predicted = scaling_model.link_prediction(args("--link-rate", "1gbit"), BENCH)
        self.assertEqual(cells[5], "120.0")  # measured exchange
        self.assertEqual(cells[6], "%.1f" % predicted["in_flight_ms"])
        self.assertEqual(cells[7], "%.2f" % (120.0 / predicted["in_flight_ms"]))
        self.assertEqual(cells[10], "40%")

    def test_refuses_a_single_rank_and_a_line_without_the_fields(self):
        one = self.run_with(dict(BENCH, ranks=1))
        self.assertNotEqual(one.returncode, 0)
        self.assertIn("a bench of 1 rank", one.stderr)
        partial = {k: v for k, v in BENCH.items() if k != "comm_in_flight_ms"}
        old = self.run_with(partial)
        self.assertNotEqual(old.returncode, 0)
        self.assertIn("has no comm_in_flight_ms", old.stderr)


if __name__ == "__main__":
    unittest.main()
