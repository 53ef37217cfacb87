"""benchmarks/serving.py in its quickest mode, without peers: every in-tree server answers and gets figures
that make sense (positive, p99 >= p50). No timing thresholds: the speed targets are the benchmark's to report."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.rounds import parse_json_tail

pytest.importorskip("onnxruntime", reason="the serving extra (onnxruntime) is not installed")
pytest.importorskip("tritonclient.http", reason="tritonclient[http] (the test extra) is not installed")

ROOT = Path(__file__).resolve().parents[3]

IN_TREE = {
    "null": {"binary", "json", "tritonclient"},
    "fastapi": {"json"},
    "gpuyard": {"binary", "json", "tritonclient"},
    "gpuyard_batched": {"binary", "json", "tritonclient"},
}


def check_latencies(figures: dict, where: str) -> None:
    assert figures["requests"] > 0, where
    assert 0 < figures["p50_ms"] <= figures["p99_ms"], where


@pytest.fixture(scope="module")
def result() -> dict:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "serving.py"), "--models", "mlp", "--requests", "150"]
        + ["--seconds", "1", "--warmup", "20", "--start-timeout", "60", "--markdown"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| gpuyard | json |" in done.stdout  # the --markdown table, before the JSON
    return parse_json_tail(done.stdout)


def test_every_in_tree_server_has_figures(result):
    model = result["models"]["mlp"]
    check_latencies(model["session_run"]["c1"], "session.run")
    assert set(model["servers"]) == set(IN_TREE)  # no peer given: none measured
    for server, paths in IN_TREE.items():
        assert set(model["servers"][server]) == paths, server
        for path, figures in model["servers"][server].items():
            check_latencies(figures["c1"], f"{server} {path} c1")
            if path != "tritonclient":  # tritonclient measures concurrency 1 only
                check_latencies(figures["c16"], f"{server} {path} c16")
                assert figures["c16"]["throughput_per_s"] > 0


def test_platform_time_is_measured_inside_gpuyard(result):
    for server in ("gpuyard", "gpuyard_batched"):
        for path in IN_TREE[server]:
            platform = result["models"]["mlp"]["servers"][server][path]["platform_beyond_run"]
            assert platform["requests"] == sum(platform["histogram_us"].values()) > 0
            assert 0 < platform["p50_ms"] <= platform["p99_ms"]


def test_targets_and_skipped_peers_are_reported(result):
    assert all(verdict.startswith("skipped") for verdict in result["peers"].values())
    targets = result["targets"]["mlp"]
    for name in (
        "binary_tritonclient_p50_within_0_3ms_of_null",
        "json_p50_within_10pct_of_fastapi",
        "platform_beyond_run_p50_le_0_3ms",
        "dynamic_batching_3x_throughput_lower_p95_at_c16",
    ):
        assert targets[name]["holds"] in (True, False), name
    assert targets["lower_than_every_peer"]["holds"] is None  # no peer measured
