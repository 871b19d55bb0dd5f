#!/usr/bin/env python3
"""Tests of scripts/bench-figures (and the slug it shares with scripts/bench-table).

  python3 scripts/test_bench_figures.py      # a second or so; run by scripts/test-all
"""

import copy
import importlib.machinery
import importlib.util
import json
import re
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent


def load(name):
    loader = importlib.machinery.SourceFileLoader(name.replace("-", "_"), str(SCRIPTS / name))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


figures = load("bench-figures")
table = load("bench-table")


def row(group, function, threads, mcps, elements=None):
    elements = elements or threads
    ns = elements * 1e3 / mcps if mcps else 5.0
    return {
        "group": group, "function": function, "threads": threads,
        "elements_per_iteration": elements, "ns_per_iteration": ns,
        "ns_per_iteration_95": [ns * 0.95, ns * 1.05], "m_checks_per_s": mcps,
    }


def record(bench="limiters", results=None):
    if results is None:
        results = [
            row(f"{lim}/{w}/{t}t", f, t, base * t ** 0.5)
            for lim in ("token_bucket", "leased_token_bucket")
            for w in ("allow", "deny")
            for t in (1, 2, 4)
            for f, base in (("tollgate-atomic", 40.0), ("tollgate-twin", 30.0),
                            ("governor", 35.0), ("tollgate-atomic-cached", 300.0))
            if lim == "token_bucket" or f.startswith("tollgate-atomic")
        ] + [row("clock/now", "std-instant", None, None, 1)]
    return {
        "schema": "tollgate-bench-results/1", "bench": bench,
        "cpu": {"model": "Test(R) CPU Model 9 @ 3.00GHz", "logical_cpus": 2},
        "os": "Linux", "date": "2026-01-02T03:04:05Z", "commit": "0123456789abcdef",
        "dirty": False, "command": "scripts/bench-table --save",
        "wall_seconds": 1.0, "load_average_before": [1.5, 1.0, 0.5],
        "load_average_after": [2.0, 1.0, 0.5], "other_processes_cores": 0.3,
        "steal_cores": 0.0, "loaded": True, "loaded_because": ["test"], "results": results,
    }


class Figures(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.results = Path(self.tmp.name) / "results"
        self.out = Path(self.tmp.name) / "figures"
        self.results.mkdir()

    def tearDown(self):
        self.tmp.cleanup()

    def write(self, name, data):
        path = self.results / name
        path.write_text(data if isinstance(data, str) else json.dumps(data))
        return path

    def build(self):
        return figures.build(self.results, Path(self.tmp.name))

    def run_script(self, *args):
        return subprocess.run(
            [sys.executable, str(SCRIPTS / "bench-figures"), "--results", str(self.results),
             "--out", str(self.out), *args], capture_output=True, text=True)

    def test_direct_figure_names_cpu_run_and_contenders(self):
        self.write("a.json", record())
        out = self.build()
        self.assertEqual(list(out), ["test-model-9-2cpu-limiters.svg"])
        svg = out["test-model-9-2cpu-limiters.svg"]
        for text in ("Test(R) CPU Model 9 @ 3.00GHz, 2 logical CPUs", "2026-01-02",
                     "commit 0123456789", "LOADED machine", "tollgate atomic",
                     "tollgate leased", "tollgate twin (mutex)", "governor",
                     "token bucket — allow", "token bucket, cached clocks — deny",
                     "M checks/s (log)", "threads"):
            self.assertIn(text, svg)
        # 4 panels: (default, cached) x (allow, deny); the leased bucket is a line in
        # the token bucket's panels, not panels of its own; clock/now is not drawn.
        self.assertEqual(svg.count(">threads</text>"), 4)
        self.assertNotIn("leased token bucket", svg)
        self.assertNotIn("std-instant", svg)
        # default clock: atomic, leased, twin, governor; cached: atomic, leased.
        self.assertEqual(svg.count("<polyline"), 2 * 4 + 2 * 2)

    def test_deterministic_and_check(self):
        self.write("a.json", record())
        self.assertEqual(self.build(), self.build())
        first = self.run_script()
        self.assertEqual(first.returncode, 0, first.stderr)
        self.assertIn("written", first.stdout)
        again = self.run_script()
        self.assertIn("unchanged", again.stdout)
        self.assertEqual(self.run_script("--check").returncode, 0)
        changed = record()
        changed["results"][0]["m_checks_per_s"] *= 2
        self.write("a.json", changed)
        check = self.run_script("--check")
        self.assertNotEqual(check.returncode, 0)
        self.assertIn("out of date", check.stderr)

    def test_disturbed_points_are_hollow(self):
        rec = record()
        for r in rec["results"]:
            if r["threads"]:
                # 4 threads on 2 CPUs wait 50% by themselves; 1 and 2 should not wait.
                r["on_cpu"], r["waiting_percent"] = 0.9, (60.0 if r["threads"] == 1 else 40.0)
        self.write("a.json", rec)
        svg = self.build()["test-model-9-2cpu-limiters.svg"]
        ones = sum(1 for r in rec["results"] if r["threads"] == 1)
        twos = sum(1 for r in rec["results"] if r["threads"] == 2)
        self.assertIn(f"Hollow markers ({ones + twos} of {ones * 3}):", svg)
        rec["results"][0]["waiting_percent"] = 140
        self.assert_fails(rec, "not a percentage")

    def test_generic_groups(self):
        # Group names the generator has never seen: path parts become rows and columns.
        results = [row(f"mystery_hot/{w}/{t}t", f, t, m * t)
                   for w in ("allow", "deny") for t in (1, 2, 4)
                   for f, m in (("tollgate", 20.0), ("governor", 15.0), ("brand_new", 18.0))]
        self.write("k.json", record("keyed_kinds", results))
        svg = self.build()["test-model-9-2cpu-keyed_kinds.svg"]
        self.assertIn("mystery hot — allow", svg)
        self.assertIn("mystery hot — deny", svg)
        self.assertIn("brand_new", svg)
        self.assertIn("M checks/s<", svg)  # a narrow range: linear axis
        self.assertEqual(svg.count("<polyline"), 6)

    def assert_fails(self, data, message):
        path = self.write("bad.json", data)
        with self.assertRaises(figures.FigureError) as caught:
            self.build()
        self.assertIn(str(path), str(caught.exception))
        self.assertRegex(str(caught.exception), message)
        result = self.run_script()
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("bad.json", result.stderr)
        self.assertFalse(self.out.exists() and any(self.out.iterdir()), "wrote a figure")

    def test_malformed_input_fails_clearly(self):
        good = record()
        self.assert_fails("{not json", "not JSON")
        self.assert_fails("[]", "not a JSON object")
        self.assert_fails(dict(good, schema="other/1"), "schema")
        self.assert_fails(dict(good, results=[]), "empty")
        self.assert_fails(dict(good, results=[row("clock/now", "x", None, None, 1)]),
                          "nothing to draw")
        bad = copy.deepcopy(good)
        del bad["cpu"]["model"]
        self.assert_fails(bad, "no 'model'")
        bad = copy.deepcopy(good)
        bad["results"][0]["m_checks_per_s"] = -1
        self.assert_fails(bad, "not a positive number")
        bad = copy.deepcopy(good)
        bad["results"][0]["m_checks_per_s"] = "fast"
        self.assert_fails(bad, "m_checks_per_s")
        bad = copy.deepcopy(good)
        bad["results"][0]["threads"] = 3
        self.assert_fails(bad, "does not name its 3 threads")
        bad = copy.deepcopy(good)
        bad["results"].append(dict(bad["results"][0]))
        self.assert_fails(bad, "two results")
        self.assert_fails(dict(good, date="yesterday"), "ISO date")

    def test_no_result_files(self):
        with self.assertRaises(figures.FigureError):
            self.build()
        self.assertNotEqual(self.run_script().returncode, 0)

    def test_two_files_for_one_figure(self):
        self.write("a.json", record())
        self.write("b.json", record())
        with self.assertRaisesRegex(figures.FigureError, "keep one"):
            self.build()

    def test_stale_figure_is_removed(self):
        self.write("a.json", record())
        self.assertEqual(self.run_script().returncode, 0)
        self.write("a.json", dict(record(), cpu={"model": "Other", "logical_cpus": 4}))
        result = self.run_script()
        self.assertIn("removed", result.stdout)
        self.assertEqual(sorted(p.name for p in self.out.iterdir()), ["other-4cpu-limiters.svg"])

    def test_slug_matches_bench_table(self):
        for model in ("AMD EPYC", "Intel(R) Xeon(R) Processor",
                      "Intel(R) Xeon(R) CPU E5-2680 v4 @ 2.40GHz", "Apple M2 (TM)", "???"):
            self.assertEqual(figures.slug(model, 8), table.cpu_slug(model, 8))
        self.assertEqual(figures.slug("AMD EPYC", 2), "amd-epyc-2cpu")

    def test_committed_results_are_drawable(self):
        # Every result file in the repository draws, and its figure is up to date.
        root = SCRIPTS.parent
        if not list((root / "docs" / "bench-results").glob("*.json")):
            self.skipTest("no committed results")
        result = subprocess.run([sys.executable, str(SCRIPTS / "bench-figures"), "--check"],
                                capture_output=True, text=True)
        self.assertEqual(result.returncode, 0, result.stderr)


if __name__ == "__main__":
    unittest.main()
